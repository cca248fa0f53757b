package jsonws

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// No Talkwire server is available to us: configs/talkwire.yaml is written
// from the published description of its load tool. This test holds it to
// that description: the frames its templates produce are the ones named
// there, and so is its token.
func TestTalkwireMappingMakesTheDescribedFrames(t *testing.T) {
	secret := []byte("a-talkwire-jwt-secret-of-32-chars!")
	d, err := New(loadSection(t, "../../configs/talkwire.yaml"), Options{URL: "ws://127.0.0.1:6062/ws/im", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.env("u1", 0)
	if err != nil {
		t.Fatal(err)
	}
	e.id, e.to, e.group, e.body, e.members = 7, "u2", "g1", []byte("imc1 x"), []string{"u1", "u2"}
	render := func(tm *template) map[string]any {
		t.Helper()
		b, err := tm.render(nil, e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s is not JSON: %v", b, err)
		}
		return m
	}
	for _, c := range []struct {
		name string
		tm   *template
		want map[string]any
	}{
		{"login", d.m.login[0].send, map[string]any{"type": "login", "id": "7"}},
		{"direct pub", d.m.sendDirect, map[string]any{"type": "pub", "to": "u2", "body": "imc1 x", "id": "7"}},
		{"group pub", d.m.sendGroup, map[string]any{"type": "pub", "group": "g1", "body": "imc1 x"}},
		{"create_grp", d.m.create.send, map[string]any{"type": "create_grp", "group": "g1"}},
	} {
		got := render(c.tm)
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s frame %v: %s = %v, want %v", c.name, got, k, got[k], v)
			}
		}
	}
	if d.m.create.reply.String() != "group={{.Group}} type=grp_sync" {
		t.Errorf("group creation waits for %s, want grp_sync of the group", d.m.create.reply)
	}

	// The token: HS256, signed with the target secret, the strict
	// profile's claims, two hours.
	login := render(d.m.login[0].send)
	tok, err := jwt.Parse(login["token"].(string), func(*jwt.Token) (any, error) { return secret, nil },
		jwt.WithValidMethods([]string{"HS256"}))
	if err != nil {
		t.Fatalf("login token: %v", err)
	}
	claims := tok.Claims.(jwt.MapClaims)
	for k, v := range map[string]any{"sub": "u1", "type": "access", "role": "app_user"} {
		if claims[k] != v {
			t.Errorf("claim %s = %v, want %v", k, claims[k], v)
		}
	}
	exp, _ := claims.GetExpirationTime()
	iat, _ := claims.GetIssuedAt()
	if exp == nil || iat == nil || exp.Sub(iat.Time) != 2*time.Hour {
		t.Errorf("token lifetime %v to %v, want 2h", iat, exp)
	}
}
