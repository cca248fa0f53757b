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

// holder is a Protocol that holds its connection's reading for hold at
// the first frame, and records when each frame came.
type holder struct {
	c      *Conn
	hold   time.Duration
	held   chan bool
	frames chan time.Time
}

func (h *holder) Frame(b []byte, _ int64) error {
	if string(b) == "first" {
		h.held <- h.c.Hold(h.hold)
	}
	h.frames <- time.Now()
	return nil
}

func (h *holder) Ended(err error) *probe.Disconnect { return Ended(err, nil) }

// sender starts a WebSocket server that writes each of frames as soon as
// a client connects, then reads until the client goes.
func sender(t *testing.T, frames ...string) string {
	return gatedSender(t, nil, frames...)
}

// gatedSender is sender, with frame i written only once gates[i], if
// there is one and it is not nil, is closed.
func gatedSender(t *testing.T, gates []chan struct{}, frames ...string) string {
	t.Helper()
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for i, f := range frames {
			if i < len(gates) && gates[i] != nil {
				<-gates[i]
			}
			if c.WriteMessage(websocket.TextMessage, []byte(f)) != nil {
				return
			}
		}
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// watchHeld dials url over a slow link with a poller (a slow reader's
// link is watched too), checks that Hold says false before the watch, and
// watches the connection with p.
func watchHeld(t *testing.T, url string, idle time.Duration, p *holder) (c *Conn, done chan error) {
	t.Helper()
	poller, err := netpoll.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { poller.Close() })
	s := NewSettings(Settings{URL: url, Heartbeat: time.Hour, CloseGrace: time.Minute})
	c, err = Dial(context.Background(), s, probe.Link{Poller: poller, Slow: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Abort() })
	c.SetIdle(idle)
	if c.Hold(time.Second) {
		t.Error("Hold said true for a connection nothing watches: its caller would not sleep")
	}
	p.c = c
	done = make(chan error, 1)
	if !c.Watch(p, func(err error) { done <- err }) {
		t.Fatal("Watch refused a slow link's plain loopback connection with a poller")
	}
	return c, done
}

// TestHold: a watched connection's handler stops its reading for a while
// without a goroutine asleep, as a slow reader's does. The frame behind
// waits for the hold, and the idle deadline, shorter than the hold,
// counts from the hold's end: the session is not taken for dead while it
// is the one not reading.
func TestHold(t *testing.T) {
	const hold, idle = 600 * time.Millisecond, 200 * time.Millisecond
	p := &holder{hold: hold, held: make(chan bool, 1), frames: make(chan time.Time, 2)}
	_, done := watchHeld(t, sender(t, "first", "second"), idle, p)
	if !<-p.held {
		t.Fatal("Hold said false on a watched connection's frame")
	}
	first := <-p.frames
	select {
	case second := <-p.frames:
		if gap := second.Sub(first); gap < hold {
			t.Errorf("second frame read %v after the first, within its %v hold", gap, hold)
		}
	case err := <-done:
		t.Fatalf("session ended during a %v hold with a %v idle deadline: %v", hold, idle, err)
	case <-time.After(time.Minute):
		t.Fatal("second frame not read a minute after a 600 ms hold")
	}
}

// TestHoldReadsWhatCameDuringIt: the frame behind the held one comes
// during the hold, after the first's read had emptied the socket; it is
// read when the hold ends. (It was not: the watch trusted that the socket
// was still empty, and the server, its window full, never sent more to
// wake it. A slow reader then stayed silent for good, and its loss was
// never counted.)
func TestHoldReadsWhatCameDuringIt(t *testing.T) {
	const hold = 300 * time.Millisecond
	// The first frame comes once the connection is watched, so that a
	// read of the watch's takes it and empties the socket; the second,
	// once the hold has begun.
	gates := []chan struct{}{make(chan struct{}), make(chan struct{})}
	p := &holder{hold: hold, held: make(chan bool, 1), frames: make(chan time.Time, 2)}
	_, done := watchHeld(t, gatedSender(t, gates, "first", "second"), time.Hour, p)
	close(gates[0])
	if !<-p.held {
		t.Fatal("Hold said false on a watched connection's frame")
	}
	first := <-p.frames
	close(gates[1])
	select {
	case second := <-p.frames:
		if gap := second.Sub(first); gap < hold {
			t.Errorf("second frame read %v after the first, within its %v hold", gap, hold)
		}
	case err := <-done:
		t.Fatalf("session ended during the hold: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("second frame, sent during a %v hold, not read 10 s later", hold)
	}
}

// TestCloseEndsHold: a session closing is not held back by its hold: the
// server's reply to the close is read at once.
func TestCloseEndsHold(t *testing.T) {
	p := &holder{hold: time.Hour, held: make(chan bool, 1), frames: make(chan time.Time, 2)}
	c, done := watchHeld(t, sender(t, "first", "second"), time.Hour, p)
	if !<-p.held {
		t.Fatal("Hold said false on a watched connection's frame")
	}
	<-p.frames
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if r := probe.ReasonOf(err); r != metrics.ReasonShutdown {
			t.Errorf("closed session ended with %v (reason %s), want shutdown", err, r)
		}
	case <-time.After(time.Minute):
		t.Fatal("closed session still watched a minute into an hour's hold")
	}
}
