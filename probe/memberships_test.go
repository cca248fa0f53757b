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
