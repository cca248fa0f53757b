package wsframe

import (
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The write side: a Conn's writes never wait for the network. A polled
// session writes from a poller's worker (an ack, a pong, a catch-up
// request made while handling a frame), and a write that waited for a
// server that has stopped reading would hold that worker, and every
// session behind it, for as long as the write deadline. So Write puts on
// the socket what it takes now and keeps the rest, in order, for a
// goroutine that exists only while something is kept (flush); an idle or
// merely busy connection has none.
//
// What is kept is bounded: past maxBacklog, Write waits for room, under
// the write deadline the flush is held to. A server that reads nothing
// for a write timeout fails the connection as a blocking write would
// have, from the flush: the error goes to what SetOnWriteError set, and
// every later Write returns it.

// maxBacklog is how much a Conn keeps beyond what the kernel's send buffer
// took before Write waits: tens of kilobytes of acks and requests, while
// a server that reads none of it is given its write timeout.
const maxBacklog = 64 << 10

// writer is the write side's state, under its own lock: gorilla's reader
// and writer run at once. What only a backlog needs is apart (kept), made
// when one begins and dropped when it is written: an idle connection pays
// for a lock, an error and a pointer.
type writer struct {
	mu   sync.Mutex
	err  error // a failed write's, for good
	kept *kept // nil while the socket takes every write whole
	// onError is told of an error the flush met (see SetOnWriteError).
	onError func(error)
}

// kept is a backlog and the flush goroutine that writes it.
type kept struct {
	room    sync.Cond // signalled as the flush takes bytes, and when it ends
	backlog []byte    // what the socket has not taken yet
}

// Write writes b without waiting for the socket, keeping what it will not
// take now (see writer). It waits only while more than maxBacklog is kept.
// Over TLS, b goes through the TLS connection, whose records come to the
// socket's Write.
func (c *Conn) Write(b []byte) (int, error) {
	if c.blocking {
		return c.Conn.Write(b)
	}
	if c.tls != nil {
		return c.tls.Write(b)
	}
	return c.sock.Write(b)
}

// Write is Conn's Write on the socket itself.
func (c *socket) Write(b []byte) (int, error) {
	w := &c.wr
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	n := 0
	if w.kept == nil {
		var err error
		if n, err = c.writeNow(b); err != nil {
			w.err = err
			return n, err
		}
		if n == len(b) {
			return n, nil
		}
		w.kept = &kept{room: sync.Cond{L: &w.mu}}
		go c.flush(w.kept)
	}
	k := w.kept
	for len(k.backlog)+len(b)-n > maxBacklog && len(k.backlog) > 0 && w.err == nil {
		k.room.Wait()
	}
	if w.err != nil {
		return n, w.err
	}
	if w.kept != k {
		// The flush emptied the backlog and ended meanwhile: a new one
		// begins.
		k = &kept{room: sync.Cond{L: &w.mu}}
		w.kept = k
		go c.flush(k)
	}
	k.backlog = append(k.backlog, b[n:]...)
	return len(b), nil
}

// Unwritten is how many bytes written are still kept, not yet on the
// socket (over TLS, bytes of its records).
func (c *Conn) Unwritten() int {
	w := &c.sock.wr
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kept == nil {
		return 0
	}
	return len(w.kept.backlog)
}

// writeNow writes what the socket takes of b without waiting. A deadline
// already passed or a closed socket fails it as a blocking write would.
func (c *socket) writeNow(b []byte) (int, error) {
	n := 0
	var werr error
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, err := unix.Write(int(fd), b[n:])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return true
			case err != nil:
				werr = os.NewSyscallError("write", err)
				return true
			}
			n += m
		}
		return true
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return n, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, nil
}

// flush writes k's backlog, blocking under the socket's write deadline,
// until it is empty or a write fails, and then ends.
func (c *socket) flush(k *kept) {
	w := &c.wr
	// The Write that started the flush holds the lock until it has
	// appended the first bytes.
	w.mu.Lock()
	for w.err == nil && len(k.backlog) > 0 {
		// Write only appends: the bytes at the front stay as they are
		// while the lock is let go.
		p := k.backlog
		w.mu.Unlock()
		n, err := c.Conn.Write(p)
		w.mu.Lock()
		k.backlog = k.backlog[n:]
		if err != nil {
			w.err = err
		}
		k.room.Broadcast()
	}
	// Emptied, the backlog goes: a connection that is quiet again holds
	// nothing for writes.
	w.kept = nil
	err, tell := w.err, w.onError
	k.room.Broadcast()
	w.mu.Unlock()
	if err != nil && tell != nil {
		tell(err)
	}
}

// SetOnWriteError sets what is told of an error the flush met, once, on
// the flush's goroutine: no Write may come to return it, and the socket is
// left open for the owner to close as it closes after any failed write.
func (c *Conn) SetOnWriteError(f func(error)) {
	w := &c.sock.wr
	w.mu.Lock()
	w.onError = f
	w.mu.Unlock()
}

// SetBlockingWrites makes Write wait for the socket, under its write
// deadline, as a net.Conn's does, for a writer that has a goroutine of its
// own: nothing is kept beyond what the kernel takes, so a peer that stops
// reading backs up into the writer's own bounded queue at once. Call it
// before the first Write meant to block.
func (c *Conn) SetBlockingWrites() { c.blocking = true }
