package wsconn

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestNewSettings: the zero fields take the defaults every adapter shares,
// the given ones stay, and the dialer follows them.
func TestNewSettings(t *testing.T) {
	d := NewSettings(Settings{URL: "ws://127.0.0.1:1/ws"})
	if d.DialTimeout != DefaultDialTimeout || d.WriteTimeout != DefaultWriteTimeout || d.Heartbeat != DefaultHeartbeat ||
		d.MaxFrame != DefaultMaxFrame || d.WriteBuffer != DefaultWriteBuffer {
		t.Errorf("defaults = %+v", d)
	}
	if d.dialer.HandshakeTimeout != DefaultDialTimeout || d.dialer.ReadBufferSize != 512 || d.dialer.WriteBufferSize != DefaultWriteBuffer || d.dialer.Subprotocols != nil {
		t.Errorf("default dialer = %+v", d.dialer)
	}
	s := NewSettings(Settings{
		URL: "ws://127.0.0.1:1/ws", Subprotocol: "xmpp", MaxFrame: 1 << 20, WriteBuffer: 8 << 10,
		DialTimeout: time.Second, WriteTimeout: 2 * time.Second, Heartbeat: 3 * time.Second,
	})
	if s.DialTimeout != time.Second || s.WriteTimeout != 2*time.Second || s.Heartbeat != 3*time.Second || s.MaxFrame != 1<<20 || s.WriteBuffer != 8<<10 {
		t.Errorf("given = %+v", s)
	}
	if s.dialer.HandshakeTimeout != time.Second || s.dialer.WriteBufferSize != 8<<10 || len(s.dialer.Subprotocols) != 1 || s.dialer.Subprotocols[0] != "xmpp" {
		t.Errorf("dialer = %+v", s.dialer)
	}
	// One pool per buffer size: gorilla hands a pooled buffer to a
	// connection of its own size only if the pools are kept apart.
	if d.dialer.WriteBufferPool == s.dialer.WriteBufferPool || d.dialer.WriteBufferPool != NewSettings(Settings{}).dialer.WriteBufferPool {
		t.Errorf("write pools: want one per size")
	}
	if got := IdleFor(30 * time.Second); got != 65*time.Second {
		t.Errorf("IdleFor(30s) = %v, want 65s: two missed heartbeats and 5s", got)
	}
}

// TestIsTimeout: a read past its deadline is a timeout though gorilla
// hides the net package's error, so that a login that waits out its
// deadline says "deadline exceeded" however the race with ctx went.
func TestIsTimeout(t *testing.T) {
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		<-hold
		c.Close()
	}))
	defer srv.Close()
	defer close(hold)
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, _, err = ws.ReadMessage()
	if err == nil || !isTimeout(err) {
		t.Errorf("read past its deadline: %v; isTimeout = false, want true", err)
	}
	if isTimeout(errors.New("read tcp: connection reset by peer")) {
		t.Error("isTimeout(a reset) = true")
	}
}
