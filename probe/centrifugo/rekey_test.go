package centrifugo

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
)

// TestRekeyedRefresh: a session logged in before Rekey signs its next
// token refresh with the new secret, which the old one no longer verifies.
func TestRekeyedRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		newSecret := []byte("centrifugo-rotated-secret")
		connected, refreshed := make(chan struct{}), make(chan string, 1)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(`{"client":"c1","expires":true,"ttl":1,"ping":25,"pong":true}`)
			fc.subscribes(2, positioned("EP", 0))
			close(connected)
			time.Sleep(600 * time.Millisecond)
			fc.send(`{}`)
			for range 2 {
				cmd, err := fc.read()
				if err != nil {
					t.Error(err)
					return
				}
				if cmd.Refresh != nil {
					refreshed <- cmd.Refresh.Token
					fc.send(fmt.Sprintf(`{"id":%d,"refresh":{"expires":true,"ttl":3600}}`, cmd.ID))
				}
			}
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		s, err := d.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		<-connected
		d.Rekey(newSecret)
		serve(t, s, &recorder{})
		select {
		case tok := <-refreshed:
			var claims jwt.RegisteredClaims
			if _, err := jwt.ParseWithClaims(tok, &claims, func(*jwt.Token) (any, error) { return newSecret, nil }); err != nil || claims.Subject != "u1" {
				t.Errorf("refresh token after Rekey: sub %q, %v; want a token for u1 signed with the new secret", claims.Subject, err)
			}
			if _, err := jwt.ParseWithClaims(tok, &jwt.RegisteredClaims{}, func(*jwt.Token) (any, error) { return testSecret, nil }); err == nil {
				t.Error("refresh token after Rekey verifies with the old secret, want only the new one")
			}
		default:
			t.Error("no refresh command before the token expired")
		}
	})
}
