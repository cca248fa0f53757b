package probe

import (
	"slices"
	"testing"
)

// TestMemberships: a plan replaces its own users' memberships, dropping
// those it no longer gives them, and leaves another population's alone.
func TestMemberships(t *testing.T) {
	var m Memberships[string]
	m.Replace([]string{"bg-u0", "bg-u1"}, map[string][]string{"bg-u0": {"g0"}, "bg-u1": {"g0", "g1"}})
	m.Replace([]string{"can-u0"}, map[string][]string{"can-u0": {"c0"}})
	m.Replace([]string{"bg-u0", "bg-u1"}, map[string][]string{"bg-u1": {"g2"}})
	for user, want := range map[string][]string{"bg-u0": nil, "bg-u1": {"g2"}, "can-u0": {"c0"}, "nobody": nil} {
		if got := m.Of(user); !slices.Equal(got, want) {
			t.Errorf("Of(%s) = %q, want %q", user, got, want)
		}
	}
}

// TestPack: every key gets room for its count, and appending up to it
// never touches another key's.
func TestPack(t *testing.T) {
	counts := map[string]int{"a": 2, "b": 1, "c": 3}
	p := Pack[int](counts)
	for k, n := range counts {
		if len(p[k]) != 0 || cap(p[k]) != n {
			t.Fatalf("%s: len %d cap %d, want 0 and %d", k, len(p[k]), cap(p[k]), n)
		}
	}
	for k, n := range counts {
		for i := range n {
			p[k] = append(p[k], int(k[0])*100+i)
		}
	}
	for k, n := range counts {
		for i := range n {
			if p[k][i] != int(k[0])*100+i {
				t.Errorf("%s[%d] = %d, overwritten", k, i, p[k][i])
			}
		}
	}
}
