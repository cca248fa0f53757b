// Package memnet is an in-memory network for tests: a Listener whose
// connections behave as loopback TCP sockets do where a protocol's code
// can tell (a bounded buffer each way, deadlines, EOF after the peer's
// close, a broken pipe when writing to a closed peer, after one write
// that the reset has not yet caught up with) and block only on
// channels and timers.
//
// That last property is why it exists. Under testing/synctest a goroutine
// blocked on a real socket is not durably blocked, so a bubble's clock
// cannot advance past it and a fake server's pacing has to run on the
// wall clock. A goroutine blocked here is durably blocked, so a client
// and a scripted fake server can run inside one bubble, where a ping
// interval or a retry backoff takes no wall time at all. net.Pipe blocks
// the same way but buffers nothing: every write waits for the peer's read,
// which deadlocks a client that writes while a server is writing to it,
// as any client that answers a ping from its read loop does.
package memnet

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// DefaultBuffer is what each direction of a connection holds when Listen
// is given no size: the order of a loopback socket's send and receive
// buffers together.
const DefaultBuffer = 256 << 10

// backlog is how many dialled connections wait for Accept before Dial
// blocks, as the kernel's listen backlog.
const backlog = 128

// Addr is the address of either end of a connection.
type Addr string

func (Addr) Network() string  { return "memnet" }
func (a Addr) String() string { return string(a) }

// Listener accepts the connections its Dial makes. Close ends the
// listener and every connection it made, at both ends, so that nothing a
// test started is left blocked on one.
type Listener struct {
	buffer int
	queue  chan *Conn
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	conns map[*Conn]struct{}
	n     int
}

// Listen returns a Listener whose connections buffer up to buffer bytes
// each way (DefaultBuffer if buffer ≤ 0).
func Listen(buffer int) *Listener {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Listener{
		buffer: buffer,
		queue:  make(chan *Conn, backlog),
		done:   make(chan struct{}),
		conns:  make(map[*Conn]struct{}),
	}
}

// Accept waits for the next connection dialled, or for Close
// (net.ErrClosed).
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "memnet", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

// Addr is the listener's address; Dial ignores the address it is given.
func (l *Listener) Addr() net.Addr { return Addr("memnet:listener") }

// Close stops Accept and Dial and closes every connection still open at
// both ends.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	l.mu.Lock()
	open := make([]*Conn, 0, len(l.conns))
	for c := range l.conns {
		open = append(open, c)
	}
	l.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
	return nil
}

// Dial connects to the listener, whatever network and address it is
// given: it has the signature of net.Dialer.DialContext so that a client
// can be pointed at it in place of its dialer.
func (l *Listener) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		return nil, &net.OpError{Op: "dial", Net: "memnet", Err: syscall.ECONNREFUSED}
	default:
	}
	l.n++
	client, server := l.pair(l.n)
	l.conns[client] = struct{}{}
	l.conns[server] = struct{}{}
	l.mu.Unlock()
	select {
	case l.queue <- server:
		return client, nil
	case <-l.done:
		err := &net.OpError{Op: "dial", Net: "memnet", Err: syscall.ECONNREFUSED}
		client.Close()
		server.Close()
		return nil, err
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "memnet", Err: ctx.Err()}
	}
}

// Conns is how many connections are open, counting each end: a test's
// check that a client closed what it dialled.
func (l *Listener) Conns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *Listener) pair(n int) (client, server *Conn) {
	up, down := newStream(l.buffer), newStream(l.buffer)
	ca := Addr("memnet:client-" + strconv.Itoa(n))
	sa := Addr("memnet:server")
	client = newConn(l, down, up, ca, sa)
	server = newConn(l, up, down, sa, ca)
	return client, server
}

func (l *Listener) forget(c *Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// stream is one direction of a connection: what the writer has written
// and the reader has not yet read.
type stream struct {
	limit int

	mu         sync.Mutex
	buf        []byte
	writerDone bool // the writing end closed: the reader sees EOF once drained
	readerDone bool // the reading end closed: writes are discarded, then fail
	reset      bool // a write was discarded: the next fails

	// readable and writable carry a wake-up each (capacity 1): a waiter
	// rechecks the state after one, so a stale wake-up costs a loop.
	readable chan struct{}
	writable chan struct{}
}

func newStream(limit int) *stream {
	return &stream{limit: limit, readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// read copies out what is buffered; eof is true when nothing is and the
// writer has closed.
func (s *stream) read(b []byte) (n int, eof bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) == 0 {
		return 0, s.writerDone
	}
	n = copy(b, s.buf)
	s.buf = s.buf[n:]
	if len(s.buf) == 0 {
		s.buf = nil // let a drained buffer go
	}
	wake(s.writable)
	return n, false
}

// write buffers what fits of b; broken is true when the reader has gone.
// The first write after the reader has gone succeeds and is discarded, as
// on a TCP socket, whose peer answers it with the reset that makes the
// next write fail: a client that writes as the server hangs up still reads
// what the server said last, rather than a broken pipe.
func (s *stream) write(b []byte) (n int, broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readerDone {
		if s.reset {
			return 0, true
		}
		s.reset = true
		return len(b), false
	}
	n = min(len(b), s.limit-len(s.buf))
	if n > 0 {
		s.buf = append(s.buf, b[:n]...)
		wake(s.readable)
	}
	return n, false
}

func (s *stream) closeWriter() {
	s.mu.Lock()
	s.writerDone = true
	s.mu.Unlock()
	wake(s.readable)
}

func (s *stream) closeReader() {
	s.mu.Lock()
	s.readerDone = true
	s.buf = nil
	s.mu.Unlock()
	wake(s.writable)
}

// deadline is one of a connection's deadlines; changed is closed (and
// replaced) when it is set, so that a goroutine blocked under the old one
// looks again, as SetReadDeadline in the past must wake a blocked Read.
type deadline struct {
	mu      sync.Mutex
	at      time.Time
	changed chan struct{}
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = t
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *deadline) get() (time.Time, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at, d.changed
}

// Conn is one end of a connection made by Listener.Dial.
type Conn struct {
	l             *Listener
	in, out       *stream
	local, remote Addr

	closed chan struct{}
	once   sync.Once

	rd, wd deadline
}

func newConn(l *Listener, in, out *stream, local, remote Addr) *Conn {
	return &Conn{
		l: l, in: in, out: out, local: local, remote: remote,
		closed: make(chan struct{}),
		rd:     deadline{changed: make(chan struct{})},
		wd:     deadline{changed: make(chan struct{})},
	}
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "memnet", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads what the peer wrote, waiting for it until the read deadline.
func (c *Conn) Read(b []byte) (int, error) {
	for {
		select {
		case <-c.closed:
			return 0, c.opError("read", net.ErrClosed)
		default:
		}
		at, changed := c.rd.get()
		n, eof := c.in.read(b)
		switch {
		case n > 0 || len(b) == 0:
			return n, nil
		case eof:
			return 0, io.EOF
		}
		if err := c.wait("read", c.in.readable, at, changed); err != nil {
			return 0, err
		}
	}
}

// Write buffers b for the peer, waiting for room until the write
// deadline; a peer that has closed makes it fail as a broken pipe.
func (c *Conn) Write(b []byte) (int, error) {
	written := 0
	for {
		select {
		case <-c.closed:
			return written, c.opError("write", net.ErrClosed)
		default:
		}
		at, changed := c.wd.get()
		n, broken := c.out.write(b[written:])
		written += n
		switch {
		case broken:
			return written, c.opError("write", syscall.EPIPE)
		case written == len(b):
			return written, nil
		}
		if err := c.wait("write", c.out.writable, at, changed); err != nil {
			return written, err
		}
	}
}

// wait blocks until ready has a wake-up, the connection closes, the
// deadline is changed, or it passes (os.ErrDeadlineExceeded).
func (c *Conn) wait(op string, ready <-chan struct{}, at time.Time, changed <-chan struct{}) error {
	var expired <-chan time.Time
	if !at.IsZero() {
		d := time.Until(at)
		if d <= 0 {
			return c.opError(op, os.ErrDeadlineExceeded)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ready:
	case <-c.closed:
	case <-changed:
	case <-expired:
		return c.opError(op, os.ErrDeadlineExceeded)
	}
	return nil
}

// Close closes this end: the peer reads EOF once it has read what was
// written, and its writes fail. Blocked calls on this end return
// net.ErrClosed.
func (c *Conn) Close() error {
	first := false
	c.once.Do(func() {
		first = true
		close(c.closed)
		c.out.closeWriter()
		c.in.closeReader()
		c.l.forget(c)
	})
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	return nil
}

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

func (c *Conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error  { c.rd.set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }
