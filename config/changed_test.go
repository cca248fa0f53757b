package config

import (
	"slices"
	"testing"
	"time"
)

// TestChanged: the keys a reload would change, named as a user writes
// them, a protocol's section and the lists included, and nothing for the
// fields the loader fills in itself.
func TestChanged(t *testing.T) {
	a := testLoader.Default()
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"same", func(*Config) {}, nil},
		{"users", func(c *Config) { c.Population.Users++ }, []string{"population.users"}},
		{"nested", func(c *Config) { c.Population.SlowReaders.Fraction = 0.1 }, []string{"population.slow_readers.fraction"}},
		{"profiles as a whole", func(c *Config) { c.Soak.Profiles = append(c.Soak.Profiles, Profile{Name: "x"}) }, []string{"soak.profiles"}},
		{"headers as a whole", func(c *Config) { c.Target.Headers = []Header{{Name: "X-A", Value: "b"}} }, []string{"target.headers"}},
		{"several", func(c *Config) { c.Target.URL = "ws://x"; c.Canary.Schedule = "@every 1m" }, []string{"target.url", "canary.schedule"}},
		{"a protocol's section", func(c *Config) { setChat(c, func(s *chatSection) { s.TokenTTL = time.Hour }) }, []string{"target.chat.token_ttl"}},
		{"a section left at its default", func(c *Config) { c.Target.Sections = nil }, nil},
		{"filled in by the loader", func(c *Config) { c.Deprecated = []string{"x"} }, nil},
	} {
		b := testLoader.Default()
		tc.edit(&b)
		got := testLoader.Changed(a, b)
		slices.Sort(got)
		slices.Sort(tc.want)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDeprecatedName: a protocol's old name loads as the protocol, and the
// configuration says so for the caller to log.
func TestDeprecatedName(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want []string
	}{
		{"IMCANARY_TARGET_PROTOCOL=embedded", []string{`target.protocol "embedded" is deprecated: it is now called "reference"`}},
		{"IMCANARY_TARGET_PROTOCOL=reference", nil},
	} {
		c, err := testLoader.Load("", []string{tc.env}, nil)
		if err != nil || c.Target.Protocol != "reference" || !slices.Equal(c.Deprecated, tc.want) {
			t.Errorf("Load(%s) = protocol %q, deprecated %q, %v; want reference, %q, nil", tc.env, c.Target.Protocol, c.Deprecated, err, tc.want)
		}
	}
}

// TestSectionNotMapping: a protocol's section given as a scalar names the
// section.
func TestSectionNotMapping(t *testing.T) {
	path := writeConfig(t, "target:\n  chat: 5\n")
	_, err := testLoader.Load(path, nil, nil)
	if want := path + `: target.chat: 5: must be a mapping of keys`; err == nil || err.Error() != want {
		t.Errorf("Load(target.chat: 5) = %v, want %s", err, want)
	}
}
