package openim

import (
	"strings"
	"testing"
	"time"
)

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		key  string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"api url not http", func(c *Config) { c.APIURL = "ws://127.0.0.1:10002" }, "api_url"},
		{"api url without host", func(c *Config) { c.APIURL = "http://" }, "api_url"},
		{"no admin", func(c *Config) { c.AdminUserID = "" }, "admin_user_id"},
		{"no platforms", func(c *Config) { c.Platforms = nil }, "platforms"},
		{"admin platform", func(c *Config) { c.Platforms = []int{5, 10} }, "platforms"},
		{"platform twice", func(c *Config) { c.Platforms = []int{5, 3, 5} }, "platforms"},
		{"no connections", func(c *Config) { c.MaxConnections = 0 }, "max_connections"},
		{"tiny frame", func(c *Config) { c.MaxFrame = 1024 }, "max_frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			errs := c.Validate()
			switch {
			case tc.key == "" && len(errs) > 0:
				t.Fatalf("check = %v, want none", errs)
			case tc.key != "" && (len(errs) == 0 || errs[0].Key != tc.key):
				t.Fatalf("check = %v, want an error on %s", errs, tc.key)
			}
		})
	}
}

// TestNewRefuses: what the driver cannot work with is refused at start, by
// an error that names it and never holds the secret.
func TestNewRefuses(t *testing.T) {
	ok := Options{URL: "ws://127.0.0.1:10001", Secret: []byte("topsecret")}
	okc := Config{APIURL: "http://127.0.0.1:10002"}
	for _, tc := range []struct {
		name string
		edit func(*Config, *Options)
		want string
	}{
		{"heartbeat past the read deadline", func(_ *Config, o *Options) { o.Heartbeat = 30 * time.Second }, "sends nothing for 30 s"},
		{"gateway over http", func(_ *Config, o *Options) { o.URL = "http://127.0.0.1:10001" }, "must be ws:// or wss://"},
		{"api over ws", func(c *Config, _ *Options) { c.APIURL = "ws://127.0.0.1:10002" }, "must be http:// or https://"},
		{"no secret", func(_ *Config, o *Options) { o.Secret = nil }, "no API secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, o := okc, ok
			tc.edit(&c, &o)
			_, err := New(c, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "topsecret") {
				t.Fatalf("error %q holds the secret", err)
			}
		})
	}
	if _, err := New(okc, ok); err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
}

func TestConversationID(t *testing.T) {
	if got := directConversation("bob", "alice"); got != "si_alice_bob" {
		t.Errorf("directConversation(bob, alice) = %q, want si_alice_bob", got)
	}
	if got := directConversation("alice", "bob"); got != "si_alice_bob" {
		t.Errorf("directConversation(alice, bob) = %q, want si_alice_bob", got)
	}
}

// TestPlatforms: device i is platform i of the list, and a device past the
// list is refused with the key to change.
func TestPlatforms(t *testing.T) {
	d, err := New(Config{APIURL: "http://127.0.0.1:1", Platforms: []int{5, 3}}, Options{URL: "ws://127.0.0.1:1", Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := d.Platform(1); p != 3 || err != nil {
		t.Errorf("Platform(1) = %d, %v; want 3", p, err)
	}
	if _, err := d.Platform(2); err == nil || !strings.Contains(err.Error(), "target.openim.platforms") {
		t.Errorf("Platform(2) = %v, want an error naming target.openim.platforms", err)
	}
}

// TestOpenIMID: imcanary's names become ids of OpenIM's alphabet (letters,
// digits, '_') and back, and two names never share an id.
func TestOpenIMID(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"alice", "oim123-u7", "a_b", "a-b", "a__b", "a_2db", "x.y", "ü", "_", "-", ""} {
		id := openimID(name)
		for i := 0; i < len(id); i++ {
			if !idByte(id[i]) {
				t.Errorf("openimID(%q) = %q: byte %q outside OpenIM's alphabet", name, id, id[i])
			}
		}
		if back := userName(id); back != name {
			t.Errorf("userName(openimID(%q)) = %q (id %q)", name, back, id)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%q and %q share the id %q", name, other, id)
		}
		seen[id] = name
	}
	if got := openimID("plain123"); got != "plain123" {
		t.Errorf("openimID(plain123) = %q, want it unchanged", got)
	}
}

// TestErrText: what is kept of an OpenIM error never holds the token it
// echoes, nor the server's stack.
func TestErrText(t *testing.T) {
	in := `Error: 1503 TokenMalformedError: jwt parse error, token=eyJhbGciOi.secret.part | -> tokenverify.GetClaimFromToken() jwt_token.go:57`
	got := errText(in)
	if strings.Contains(got, "eyJhbGciOi") || strings.Contains(got, "jwt_token.go") {
		t.Errorf("errText = %q: holds the token or the stack", got)
	}
	if !strings.Contains(got, "1503 TokenMalformedError") {
		t.Errorf("errText = %q: lost the error's name", got)
	}
}
