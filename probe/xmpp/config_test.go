package xmpp

import (
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
)

// TestPassword pins the password derivation: users registered by earlier
// versions (whose passwords were the reference server's login tokens)
// must still log in. The value is openssl's:
// echo -n imcanary-u0 | openssl dgst -sha256 -hmac s3cret
func TestPassword(t *testing.T) {
	const want = "64071f42325bcc1d5b35ced23720a403a28a48ab64dd90c400532afae8fafad5"
	if got := Password([]byte("s3cret"), "imcanary-u0"); got != want {
		t.Errorf("Password = %s, want %s", got, want)
	}
	if got := refserver.Token([]byte("s3cret"), "imcanary-u0"); got != want {
		t.Errorf("refserver.Token = %s, want %s: the two derivations must agree", got, want)
	}
}

func TestValidateSection(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"domain empty", func(c *Config) { c.Domain = "" }, `domain: "": must be a domain name`},
		{"domain with user", func(c *Config) { c.Domain = "a@b" }, `domain: "a@b": must be a domain name`},
		{"muc with user", func(c *Config) { c.MUCService = "a@b" }, `muc_service: "a@b": must be a domain name`},
		{"muc set", func(c *Config) { c.MUCService = "rooms.example" }, ""},
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

// TestNewNeedsSecret: without a secret there are no passwords to log in
// with, and the error says where the secret comes from.
func TestNewNeedsSecret(t *testing.T) {
	_, err := Adapter.New(probeTarget(nil))
	if err == nil || !strings.Contains(err.Error(), "target.secret_file") {
		t.Errorf("New without a secret = %v, want an error naming target.secret_file", err)
	}
	if _, err := Adapter.New(probeTarget([]byte("s"))); err != nil {
		t.Errorf("New with a secret = %v", err)
	}
}

func probeTarget(secret []byte) probe.Target {
	return probe.Target{URL: "ws://127.0.0.1:1/xmpp-websocket", Heartbeat: time.Second, Secret: secret, Section: DefaultConfig()}
}
