package memnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/memnet"
)

func dial(t *testing.T, l *memnet.Listener) (client, server net.Conn) {
	t.Helper()
	c, err := l.Dial(context.Background(), "tcp", "ignored:1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// A write that fits the buffer returns without a reader; one that does
// not waits for the reader, and fails at its deadline having written what
// fitted.
func TestWriteBuffersThenBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen(1000)
		defer l.Close()
		c, s := dial(t, l)
		if n, err := c.Write(make([]byte, 600)); n != 600 || err != nil {
			t.Fatalf("write within the buffer: %d, %v", n, err)
		}
		start := time.Now()
		c.SetWriteDeadline(start.Add(time.Second))
		n, err := c.Write(bytes.Repeat([]byte{7}, 600))
		if n != 400 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write past the buffer: %d, %v; want 400 and a deadline error", n, err)
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Errorf("%v is not a net.Error timeout", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("write waited %v, want its deadline, 1s", waited)
		}

		// A reader makes room: a blocked writer goes on.
		c.SetWriteDeadline(time.Time{})
		done := make(chan error)
		go func() {
			_, err := c.Write(make([]byte, 1500))
			done <- err
		}()
		got, err := io.ReadAll(io.LimitReader(s, 2500))
		if err != nil || len(got) != 2500 {
			t.Fatalf("read %d bytes, %v; want 2500", len(got), err)
		}
		if err := <-done; err != nil {
			t.Fatalf("blocked write after a read: %v", err)
		}
	})
}

// The peer's close is EOF once what it wrote is read; writing to it is a
// broken pipe from the second write; this end's calls after its own close are net.ErrClosed.
func TestCloseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen(0)
		defer l.Close()
		c, s := dial(t, l)
		c.Write([]byte("last words"))
		c.Close()
		got, err := io.ReadAll(s)
		if string(got) != "last words" || err != nil {
			t.Fatalf("read after the peer's close: %q, %v", got, err)
		}
		if n, err := s.Write([]byte("xy")); n != 2 || err != nil {
			t.Errorf("first write to a closed peer: %d, %v; want it taken, as TCP does before the reset", n, err)
		}
		if _, err := s.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("second write to a closed peer: %v, want EPIPE", err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("read after own close: %v, want net.ErrClosed", err)
		}
		if err := c.Close(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("second close: %v, want net.ErrClosed", err)
		}
	})
}

// Setting a deadline in the past wakes a blocked Read, as http.Server
// relies on to stop its background read when a handler hijacks.
func TestDeadlineWakesBlockedRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen(0)
		defer l.Close()
		c, _ := dial(t, l)
		done := make(chan error)
		go func() {
			_, err := c.Read(make([]byte, 1))
			done <- err
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("read returned with nothing to read: %v", err)
		default:
		}
		c.SetReadDeadline(time.Unix(1, 0))
		if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked read after a past deadline: %v", err)
		}
	})
}

// Closing the listener ends every connection it made, at both ends, and
// refuses new ones.
func TestListenerCloseEndsConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memnet.Listen(0)
		c, s := dial(t, l)
		if n := l.Conns(); n != 2 {
			t.Fatalf("Conns = %d with one connection open, want 2", n)
		}
		errs := make(chan error, 2)
		for _, conn := range []net.Conn{c, s} {
			go func() {
				_, err := conn.Read(make([]byte, 1))
				errs <- err
			}()
		}
		synctest.Wait()
		l.Close()
		for range 2 {
			if err := <-errs; !errors.Is(err, net.ErrClosed) && err != io.EOF {
				t.Errorf("blocked read when the listener closed: %v", err)
			}
		}
		if n := l.Conns(); n != 0 {
			t.Errorf("Conns = %d after Close, want 0", n)
		}
		if _, err := l.Dial(context.Background(), "tcp", "x:1"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial after Close: %v, want ECONNREFUSED", err)
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("accept after Close: %v, want net.ErrClosed", err)
		}
	})
}

// A WebSocket client and server talk through HTTPServer inside a bubble,
// where a minute's pause costs nothing, and Close ends the hijacked
// connection its handler holds.
func TestHTTPServerWebSocket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := websocket.Upgrader{}
		srv := memnet.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ws, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer ws.Close()
			for {
				typ, p, err := ws.ReadMessage()
				if err != nil {
					return
				}
				time.Sleep(time.Minute)
				if ws.WriteMessage(typ, p) != nil {
					return
				}
			}
		}))
		d := websocket.Dialer{NetDialContext: srv.Dial}
		ws, _, err := d.Dial("ws://fake/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ws.WriteMessage(websocket.TextMessage, []byte("ping"))
		_, p, err := ws.ReadMessage()
		if string(p) != "ping" || err != nil {
			t.Fatalf("echo: %q, %v", p, err)
		}
		if took := time.Since(start); took != time.Minute {
			t.Errorf("echo took %v of the bubble's clock, want the handler's minute", took)
		}
		srv.Close()
		if _, _, err := ws.ReadMessage(); err == nil {
			t.Error("read after the server closed: no error")
		}
		ws.Close()
	})
}
