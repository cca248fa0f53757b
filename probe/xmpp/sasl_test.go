package xmpp

import (
	"encoding/base64"
	"strings"
	"testing"
)

func b64(s string) []byte { return []byte(base64.StdEncoding.EncodeToString([]byte(s))) }

// TestSCRAMVector runs the exchange of RFC 5802 §5.
func TestSCRAMVector(t *testing.T) {
	c := &scramClient{cache: &saltCache{}, user: "user", password: "pencil", nonce: "fyko+d2lbbFgONRv9qkxdawL"}
	c.clientFirstBare = "n=user,r=" + c.nonce
	if got, want := string(c.first()), string(b64("n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL")); got != want {
		t.Errorf("first() = %s, want %s", got, want)
	}
	final, err := c.respond(b64("r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"))
	if err != nil {
		t.Fatal(err)
	}
	want := "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
	if got, _ := base64.StdEncoding.DecodeString(string(final)); string(got) != want {
		t.Errorf("respond() = %s, want %s", got, want)
	}
	if err := c.verify(b64("v=rmF9pqV8S7suAoZWja4dJRkFsKQ=")); err != nil {
		t.Errorf("verify(the RFC's server signature) = %v, want nil", err)
	}
	if err := c.verify(b64("v=AAAApqV8S7suAoZWja4dJRkFsKQ=")); err == nil {
		t.Error("verify(a wrong server signature) = nil, want an error")
	}
	// The salted password is cached for the same password, salt and count.
	if k := c.cache.m["user"]; k.iter != 4096 || len(k.key) != 20 {
		t.Errorf("cache = %+v, want the 4096-iteration key", k)
	}
}

func TestSCRAMRefusesBadServers(t *testing.T) {
	tests := []struct{ name, serverFirst, want string }{
		{"nonce not ours", "r=other,s=QSXCR+Q6sek8bf92,i=4096", "nonce"},
		{"nonce not extended", "r=abc,s=QSXCR+Q6sek8bf92,i=4096", "nonce"},
		{"too many iterations", "r=abcdef,s=QSXCR+Q6sek8bf92,i=100000000", "iteration"},
		{"zero iterations", "r=abcdef,s=QSXCR+Q6sek8bf92,i=0", "iteration"},
		{"no salt", "r=abcdef,i=4096", "salt"},
		{"extension", "m=x,r=abcdef,s=QSXCR+Q6sek8bf92,i=4096", "extension"},
		{"garbage", "hello", "malformed"},
	}
	for _, tt := range tests {
		c := &scramClient{cache: &saltCache{}, user: "u", password: "p", nonce: "abc", clientFirstBare: "n=u,r=abc"}
		if _, err := c.respond(b64(tt.serverFirst)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: respond(%q) = %v, want an error about %s", tt.name, tt.serverFirst, err, tt.want)
		}
	}
	c := &scramClient{cache: &saltCache{}}
	if err := c.verify(b64("v=x")); err == nil {
		t.Error("verify before respond = nil, want an error")
	}
}

func TestSASLName(t *testing.T) {
	if got := saslName("a=b,c"); got != "a=3Db=2Cc" {
		t.Errorf("saslName(%q) = %q, want %q", "a=b,c", got, "a=3Db=2Cc")
	}
	if got := string(plainAuth("u", "p")); got != base64.StdEncoding.EncodeToString([]byte("\x00u\x00p")) {
		t.Errorf("plainAuth = %s", got)
	}
}
