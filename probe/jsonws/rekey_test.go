package jsonws_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/refserver"
)

// login is a login frame a fake server read: who, with what token.
type login struct{ user, token string }

// loginServer serves the mapped reference protocol's login and acks on
// loopback, taking any token: it hands each login it reads to the
// returned channel, for the test to verify, and acks every send.
func loginServer(t *testing.T) (string, <-chan login) {
	t.Helper()
	logins := make(chan login, 8)
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		var f struct{ Type, ID, User, Token string }
		for {
			if err := c.ReadJSON(&f); err != nil {
				return
			}
			switch f.Type {
			case "login":
				logins <- login{f.User, f.Token}
				_ = c.WriteJSON(map[string]string{"type": "login_ok", "id": f.ID})
			case "send":
				_ = c.WriteJSON(map[string]string{"type": "ack", "id": f.ID})
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws", logins
}

// TestRekeyNewLogins rotates the secret of a driver that signs its tokens
// with it, for each way jsonws signs: the logins after Rekey carry a token
// only the new secret verifies, and a session logged in before it stays
// up, sending, until it reconnects, and then logs in with the new one.
func TestRekeyNewLogins(t *testing.T) {
	newSecret := []byte("jsonws-rotated-secret-of-32-chars")
	// verifies reports whether tok is user's token under key.
	hmacVerifies := func(tok, user string, key []byte) bool { return tok == refserver.Token(key, user) }
	jwtVerifies := func(tok, user string, key []byte) bool {
		var claims jwt.RegisteredClaims
		_, err := jwt.ParseWithClaims(tok, &claims, func(*jwt.Token) (any, error) { return key, nil })
		return err == nil && claims.Subject == user
	}
	for _, tt := range []struct {
		source   string
		claims   map[string]any
		verifies func(tok, user string, key []byte) bool
	}{
		{source: "hmac", verifies: hmacVerifies},
		{source: "jwt", claims: map[string]any{"sub": "{{.User}}"}, verifies: jwtVerifies},
	} {
		t.Run(tt.source, func(t *testing.T) {
			cfg := mappedReference(t)
			cfg.Token.Source, cfg.Token.Claims = tt.source, tt.claims
			url, logins := loginServer(t)
			drv, err := jsonws.New(cfg, jsonws.Options{URL: url, Secret: secret, Heartbeat: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if why := drv.RekeyRefusal(); why != "" {
				t.Fatalf("RekeyRefusal = %q for token.source %s without {{.Password}}, want none", why, tt.source)
			}
			connect := func(user string) (probe.Session, login) {
				t.Helper()
				s, err := drv.Connect(context.Background(), user, probe.Device{})
				if err != nil {
					t.Fatal(err)
				}
				return s, <-logins
			}
			ann, first := connect("ann")
			if !tt.verifies(first.token, "ann", secret) {
				t.Fatalf("ann's login before Rekey carries %q, want a token of the first secret", first.token)
			}
			r := &recorder{acks: make(chan uint64, 1)}
			served := make(chan error, 1)
			go func() { served <- ann.Serve(r) }()

			drv.Rekey(newSecret)
			bob, l := connect("bob")
			defer bob.Close()
			if !tt.verifies(l.token, "bob", newSecret) {
				t.Errorf("bob's login after Rekey carries a token the new secret does not verify")
			}
			if tt.verifies(l.token, "bob", secret) {
				t.Errorf("bob's login after Rekey carries a token the old secret verifies, want only the new one")
			}

			// ann's session, logged in with the old secret, is still
			// up: its send is acked on the same connection.
			if err := ann.Send(&probe.Message{Ref: 7, To: "bob", Body: []byte("imc1 x")}); err != nil {
				t.Fatalf("ann's send after Rekey: %v", err)
			}
			select {
			case ref := <-r.acks:
				if ref != 7 {
					t.Errorf("ack of ref %d, want 7", ref)
				}
			case err := <-served:
				t.Fatalf("ann's session ended after Rekey: %v", err)
			}
			ann.Close()
			if err := <-served; !errors.As(err, new(*probe.Disconnect)) {
				t.Errorf("ann's Serve = %v, want a Disconnect", err)
			}

			// Reconnected, ann takes the new secret.
			again, l := connect("ann")
			defer again.Close()
			if !tt.verifies(l.token, "ann", newSecret) || tt.verifies(l.token, "ann", secret) {
				t.Errorf("ann's login after reconnecting carries a token of the old secret, want the new one")
			}
		})
	}
}

// TestRekeyRefusedWithPassword: a mapping that uses {{.Password}} derives
// the users' passwords from the secret, so the driver refuses a new one,
// saying why, whatever signs its tokens.
func TestRekeyRefusedWithPassword(t *testing.T) {
	for _, source := range []string{"none", "hmac", "jwt"} {
		t.Run(source, func(t *testing.T) {
			cfg := mappedReference(t)
			cfg.Token.Source = source
			send := `{"type":"login","id":"{{.ID}}","user":{{.User}},"password":{{.Password}},"token":{{.Token}}}`
			if source == "none" {
				// {{.Token}} would be empty, which the mapping refuses.
				send = strings.Replace(send, `,"token":{{.Token}}`, "", 1)
			}
			cfg.Login = []any{map[string]any{
				"name":    "login",
				"send":    send,
				"reply":   map[string]any{"id": "{{.ID}}"},
				"success": map[string]any{"type": "login_ok"},
			}}
			drv, err := jsonws.New(cfg, jsonws.Options{URL: "ws://127.0.0.1:1/ws", Secret: secret})
			if err != nil {
				t.Fatal(err)
			}
			if why := drv.RekeyRefusal(); !strings.Contains(why, "{{.Password}}") || !strings.Contains(why, "no longer log in") {
				t.Errorf("RekeyRefusal = %q, want it to say {{.Password}} derives from the secret and the users could no longer log in", why)
			}
		})
	}
}
