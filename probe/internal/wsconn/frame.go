// Package wsconn is the connection layer every WebSocket protocol adapter
// shares (Conn): dialling (with a slow link's socket options or from a
// source address), the read loop, keepalive and idle deadlines, serialised
// writes, the close handshake and the classing of how a session ended.
// Whole messages are read into pooled buffers (a session holds a buffer
// only while it handles a frame, never while it waits for the next, so an
// idle session's memory is its small bufio reader), and the time each
// frame came off the socket is kept (StampConn).
package wsconn

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// keepMax is the largest buffer returned to the pool: one huge frame must
// not keep its buffer alive for every later small one.
const keepMax = 64 << 10

var pool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Read reads the next data message of c, whole, into a pooled buffer; the
// caller gives it back with Release once done with the bytes. The
// connection's read limit bounds the size.
func Read(c *websocket.Conn) (*[]byte, error) {
	bp, _, err := ReadType(c)
	return bp, err
}

// ReadType is Read that also returns the message's type (text or binary).
func ReadType(c *websocket.Conn) (*[]byte, int, error) {
	typ, r, err := c.NextReader()
	if err != nil {
		return nil, 0, err
	}
	bp := pool.Get().(*[]byte)
	b := (*bp)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*bp = b
			return bp, typ, nil
		}
		if err != nil {
			*bp = b
			Release(bp)
			return nil, 0, err
		}
	}
}

// Release returns a buffer from Read to the pool.
func Release(bp *[]byte) {
	if cap(*bp) <= keepMax {
		pool.Put(bp)
	}
}

// Closer orders a session's read-deadline changes against its closing: the
// read loop extends the deadline for every frame and must never undo the
// short one Close sets, or a server that never answers the close would
// hold Serve for a whole idle timeout.
type Closer struct {
	mu      sync.Mutex
	closing atomic.Bool
}

// Closing reports whether Begin has been called.
func (g *Closer) Closing() bool { return g.closing.Load() }

// Extend moves c's read deadline to d from now, unless the session is
// closing.
func (g *Closer) Extend(c *websocket.Conn, d time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing.Load() {
		return nil
	}
	return c.SetReadDeadline(time.Now().Add(d))
}

// Begin marks the session closing and leaves the peer grace to answer:
// Serve returns once the reply comes, or at that deadline if it never does.
// It reports false if the session was already closing.
func (g *Closer) Begin(c *websocket.Conn, grace time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing.Swap(true) {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(grace))
	return true
}

// CloseFrame writes a normal-closure frame, bounded by grace.
func CloseFrame(c *websocket.Conn, grace time.Duration) error {
	return c.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, "imcanary shutdown"),
		time.Now().Add(grace))
}

// Fail closes c under a failed write, so that Serve returns and the user
// reconnects: gorilla keeps a write error for good, and a session left
// open after one could read but never send again.
func Fail(c *websocket.Conn, err error) error {
	if err != nil {
		c.NetConn().Close()
	}
	return err
}
