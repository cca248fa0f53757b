package centrifugo

import (
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
)

func TestValidateSection(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"group namespace bad", func(c *Config) { c.GroupNamespace = "a:b" }, `group_namespace: "a:b": must match ^[a-zA-Z0-9_-]{1,64}$`},
		{"direct namespace empty", func(c *Config) { c.DirectNamespace = "" }, `direct_namespace: "": must match ^[a-zA-Z0-9_-]{1,64}$`},
		{"token ttl short", func(c *Config) { c.TokenTTL = time.Second }, `token_ttl: 1s: must be at least 1m`},
		{"token ttl 1m", func(c *Config) { c.TokenTTL = time.Minute }, ""},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.edit(&c)
		var got []string
		for _, e := range Adapter.Config.Validate(c) {
			got = append(got, e.Error())
		}
		if strings.Join(got, "\n") != tt.want {
			t.Errorf("%s: Validate = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestNewNeedsSecret: the secret signs the connection tokens. The adapter
// declares it required, which protocols.Open enforces with the words of
// SecretIs (TestOpenEnforcesSecret); a driver made without one anyway is
// refused.
func TestNewNeedsSecret(t *testing.T) {
	if Adapter.SecretNeed(DefaultConfig()) != probe.SecretRequired || !strings.Contains(Adapter.SecretIs, "signs") {
		t.Errorf("Adapter declares %v, %q; want the secret required, and what it signs", Adapter.SecretNeed(DefaultConfig()), Adapter.SecretIs)
	}
	target := probe.Target{URL: "ws://127.0.0.1:1/connection/websocket", Heartbeat: time.Second, Section: DefaultConfig()}
	if _, err := Adapter.New(target); err == nil {
		t.Error("New without a secret succeeded")
	}
	target.Secret = []byte("s")
	if _, err := Adapter.New(target); err != nil {
		t.Errorf("New with a secret = %v", err)
	}
}
