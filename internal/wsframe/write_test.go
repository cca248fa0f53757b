//go:build linux

package wsframe_test

import (
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/internal/wsframe"
)

// stalled returns a client Conn and its server's end over loopback, both
// with small socket buffers, so that a server that does not read fills
// them within a few tens of kilobytes.
func stalled(t *testing.T) (*wsframe.Conn, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			close(accepted)
			return
		}
		_ = c.SetReadBuffer(4 << 10)
		accepted <- c
	}()
	tc, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	_ = tc.SetWriteBuffer(4 << 10)
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	c, err := wsframe.New(tc, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c, srv
}

// pattern is byte i of the stream the tests write: any byte lost, doubled
// or out of order shows.
func pattern(i int) byte { return byte(i % 251) }

// A server that stops reading fills the socket; Write then keeps what it
// cannot put there and returns, up to maxBacklog, and waits beyond it. Once
// the server reads again, every byte arrives in order and the flush
// goroutine ends.
func TestWriteKeepsWhatTheSocketWillNotTake(t *testing.T) {
	c, srv := stalled(t)
	const chunk = 1 << 10
	// Enough to fill both sockets' buffers and the backlog twice over.
	// (Through buffers this small, loopback moves only tens of kilobytes
	// a second: more would be slow.)
	const total = 4 * wsframe.MaxBacklog
	var (
		mu        sync.Mutex
		written   int
		kept      int // the most Unwritten was after a Write
		firstKept = -1
	)
	wrote := make(chan error, 1)
	go func() {
		b := make([]byte, chunk)
		for off := 0; off < total; off += chunk {
			for i := range b {
				b[i] = pattern(off + i)
			}
			if _, err := c.Write(b); err != nil {
				wrote <- err
				return
			}
			u := c.Unwritten()
			mu.Lock()
			written = off + chunk
			kept = max(kept, u)
			if u > 0 && firstKept < 0 {
				firstKept = written
			}
			mu.Unlock()
		}
		wrote <- nil
	}()
	// The server reads nothing until Write has kept bytes: a Write that
	// waited for the socket never would, and this wait fails.
	testwait.For(t, time.Minute, "Write to keep bytes the socket would not take", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstKept >= 0
	})
	if !c.Flushing() {
		t.Error("bytes kept and no flush running")
	}
	// And keeps them up to the backlog's size, where it waits: one that
	// did not would keep on past it, which the check below sees.
	testwait.For(t, time.Minute, "the backlog to fill", func() bool { return c.Unwritten() >= wsframe.MaxBacklog-2*chunk })
	// Then it reads everything, checking each byte.
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 64<<10)
		for n := 0; n < total; {
			m, err := srv.Read(b)
			for i := range m {
				if b[i] != pattern(n+i) {
					got <- errors.New("byte out of place in what the server read")
					return
				}
			}
			n += m
			if err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	if err := <-wrote; err != nil {
		t.Fatalf("Write: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("server read: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("first byte kept after %d bytes written; at most %d kept", firstKept, kept)
	if kept > wsframe.MaxBacklog+chunk {
		t.Errorf("%d bytes kept at once, want at most the backlog's %d and a write's %d", kept, wsframe.MaxBacklog, chunk)
	}
	testwait.For(t, time.Minute, "the flush to end once all is written", func() bool { return !c.Flushing() })
	if n := c.Unwritten(); n != 0 {
		t.Errorf("Unwritten() = %d after the server read everything", n)
	}
}

// A kept write that the server never takes fails at the write deadline,
// after Write returned: the error goes to OnWriteError, once, and every
// later Write returns it.
func TestWriteFailsAfterReturning(t *testing.T) {
	c, _ := stalled(t)
	told := make(chan error, 2)
	c.SetOnWriteError(func(err error) { told <- err })
	_ = c.SetWriteDeadline(time.Now().Add(time.Hour))
	b := make([]byte, 1<<10)
	for i := 0; c.Unwritten() == 0; i++ {
		if i == 1<<14 {
			t.Fatal("16 MiB written to a server that reads nothing, and nothing kept")
		}
		if _, err := c.Write(b); err != nil {
			t.Fatalf("Write %d: %v", i, err)
		}
	}
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	var err error
	select {
	case err = <-told:
	case <-time.After(time.Minute):
		t.Fatal("no write error told a minute after the deadline")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("OnWriteError(%v), want the deadline's error", err)
	}
	if _, werr := c.Write(b); !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Errorf("Write after the flush failed = %v, want its error again", werr)
	}
	testwait.For(t, time.Minute, "the flush to end", func() bool { return !c.Flushing() })
	if n := c.Unwritten(); n != 0 {
		t.Errorf("Unwritten() = %d after the write failed: what can never go is kept", n)
	}
	select {
	case err := <-told:
		t.Errorf("OnWriteError called twice, the second time with %v", err)
	default:
	}
}

// A socket closed under a write fails it at once, nothing kept.
func TestWriteOnClosed(t *testing.T) {
	c, _ := stalled(t)
	c.Close()
	n, err := c.Write([]byte("x"))
	if n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write on a closed Conn = %d, %v; want 0, net.ErrClosed", n, err)
	}
	if c.Flushing() || c.Unwritten() != 0 {
		t.Error("a write to a closed socket was kept")
	}
}
