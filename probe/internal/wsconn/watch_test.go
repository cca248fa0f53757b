//go:build linux

package wsconn

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/internal/wsframe"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// quiet is a Protocol that ignores every frame.
type quiet struct{}

func (quiet) Frame([]byte, int64) error         { return nil }
func (quiet) Ended(err error) *probe.Disconnect { return Ended(err, nil) }

// TestWatchedWriteFailsAfterReturning: a watched session's writes never
// wait for the socket (wsframe keeps what it will not take), so a write
// that times out does so in the flush, after Write returned. With no
// later write to return the error and nothing to read, the session must
// still end, as an error, and not sit online until its idle deadline.
func TestWatchedWriteFailsAfterReturning(t *testing.T) {
	poller, err := netpoll.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { poller.Close() })
	release := make(chan struct{})
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		// A small window, and nothing read: the client's socket fills
		// within kilobytes.
		_ = c.NetConn().(*net.TCPConn).SetReadBuffer(4 << 10)
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	s := NewSettings(Settings{URL: "ws" + strings.TrimPrefix(srv.URL, "http"), Heartbeat: time.Hour, WriteTimeout: time.Hour})
	c, err := Dial(context.Background(), s, probe.Link{Poller: poller})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Abort() })
	fc, ok := c.ws.NetConn().(*wsframe.Conn)
	if !ok {
		t.Fatalf("a ws:// connection with a poller is a %T, want a *wsframe.Conn", c.ws.NetConn())
	}
	done := make(chan error, 1)
	if !c.Watch(quiet{}, func(err error) { done <- err }) {
		t.Fatal("Watch refused a plain loopback connection with a poller")
	}
	b := make([]byte, 1<<10)
	for i := 0; fc.Unwritten() == 0; i++ {
		if i == 1<<14 {
			t.Fatal("16 MiB written to a server that reads nothing, and nothing kept")
		}
		if err := c.Write(b); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	// The last write's deadline, brought near (gorilla sets the socket's
	// at each write): the flush meets it.
	_ = fc.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	select {
	case err := <-done:
		if r := probe.ReasonOf(err); r != metrics.ReasonError {
			t.Errorf("session ended with %v (reason %s), want reason error", err, r)
		}
	case <-time.After(time.Minute):
		t.Fatal("watched session still open a minute after its kept write failed")
	}
}
