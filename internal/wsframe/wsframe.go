// Package wsframe is the net.Conn that gorilla/websocket reads a polled
// connection through (Conn). It knows where each WebSocket frame ends, so
// that it can tell, without blocking and without a goroutine parked in a
// read, whether a whole message is waiting (Ready); gorilla then reads it
// without ever waiting for the network.
//
// gorilla reads through a bufio.Reader of its own, which may read ahead of
// the frame it parses. Conn never hands it bytes past the end of the
// current frame (nor, during the HTTP upgrade, past the end of the
// header), so once gorilla has read a message whole its reader is empty
// and every byte not yet read is in Conn's buffer, where Ready can see it.
// That buffer comes from a pool and goes back once it is empty: an idle
// connection holds none.
//
// Its writes never wait for the network: what the socket will not take
// at once is kept, bounded, and written by a goroutine that lives only
// while there is some (see Write), so that a poller's worker that writes
// while handling a frame is never held by a server that stopped reading.
//
// Over TLS (NewTLS), the frames are found in what the TLS connection
// decrypts, and the TLS connection reads a socket that, while Ready
// polls, answers "nothing yet" instead of waiting: crypto/tls keeps a
// partial record for the next read on such an error (a temporary one,
// as a passed deadline is). Its records are written through the same
// non-blocking write side.
//
// Control frames between messages (pings, pongs) are taken out here and
// handed to OnControl, because gorilla reads on past a control frame for
// the next data frame, which would block. A close frame, and control
// frames inside a fragmented message, still go to gorilla.
package wsframe

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Opcodes of the control frames OnControl is given.
const (
	OpClose = 8
	OpPing  = 9
	OpPong  = 10
)

// Conn wraps a TCP connection, or TLS over one. Reads must come from one
// goroutine at a time (gorilla's reader, and Ready between its reads).
// Writes never wait for the network (see Write); deadlines and Close pass
// through to the TCP connection (over TLS, through the TLS connection,
// whose Close sends its close_notify first).
type Conn struct {
	net.Conn
	// sock is a value, not a pointer: one allocation a connection.
	sock socket
	// tls is the TLS connection over sock, nil for plain TCP.
	tls *tls.Conn
	// limit bounds the payload Ready buffers for one message; a larger
	// one is left to gorilla, whose read limit refuses it.
	limit int64

	buf  *[]byte // pooled, nil when nothing is buffered
	r, w int     // buf[r:w] is read and not yet handed on
	// left is how much of the current frame gorilla has still to be
	// handed.
	left int64
	// err is a failed non-blocking read's error, returned once
	// everything buffered before it has been read.
	err error
	// last is when a read last brought data (Unix ns).
	last int64

	// The flags share a word (a Conn is held per idle connection).
	//
	// blocking says Write waits for the socket (SetBlockingWrites).
	blocking bool
	// head is true until the HTTP header has been handed on; crlf counts
	// the bytes of its "\r\n\r\n" end matched so far.
	head bool
	crlf uint8
	// stale says a non-blocking read found the deadline passed or the
	// socket closed: gorilla's next read, a blocking one, says which.
	stale bool
	// emptied says the last read of the socket left nothing in it (see
	// Ready).
	emptied bool

	// OnControl receives each ping and pong read between messages, its
	// payload unmasked and valid only during the call. Ready calls it.
	OnControl Controller
}

// Controller is given the control frames a Conn reads between messages
// (OnControl): the connection's owner. An interface, not a func, so that
// setting it allocates nothing per connection.
type Controller interface {
	Control(op int, payload []byte)
}

// ControlFunc is a func as a Controller.
type ControlFunc func(op int, payload []byte)

// Control calls f.
func (f ControlFunc) Control(op int, payload []byte) { f(op, payload) }

// socket is the TCP connection under a Conn: its reads, which poll makes
// without waiting, and its writes, which never wait (see writer).
type socket struct {
	net.Conn
	rc syscall.RawConn
	// nowait makes Read a read that does not wait, for the TLS records
	// poll reads: set and cleared around it by the one reader.
	nowait bool
	wr     writer
}

// errNothingYet is a socket's Read's error, while poll reads through
// TLS, when the socket has nothing: crypto/tls keeps what it has of a
// record for the next read after a temporary error.
var errNothingYet error = nothingYet{}

type nothingYet struct{}

func (nothingYet) Error() string   { return "wsframe: nothing to read yet" }
func (nothingYet) Timeout() bool   { return false }
func (nothingYet) Temporary() bool { return true }

// init makes s the socket of c.
func (s *socket) init(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errors.New("wsframe: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	s.Conn, s.rc = c, rc
	return nil
}

// Read reads the TCP connection, waiting under its deadline, or, with
// nowait, not: errNothingYet if it has nothing.
func (s *socket) Read(b []byte) (int, error) {
	if !s.nowait {
		return s.Conn.Read(b)
	}
	n, err := s.readNow(b)
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// readNow reads what the socket has without waiting: errNothingYet if it
// has nothing; (0, nil) at the end of the stream; a deadline already
// passed or a closed socket as the net package words them.
func (s *socket) readNow(b []byte) (int, error) {
	var n int
	var rerr error
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), b)
			if rerr != unix.EINTR {
				return true
			}
		}
	})
	switch {
	case err != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
	case rerr == unix.EAGAIN:
		return 0, errNothingYet
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	}
	return max(n, 0), nil
}

// New wraps c, a *net.TCPConn (or any syscall.Conn), client's or
// server's. limit is the largest message payload Ready waits for
// (gorilla's read limit); one larger is handed on to be refused.
func New(c net.Conn, limit int64) (*Conn, error) {
	fc := &Conn{Conn: c, limit: limit, head: true}
	if err := fc.sock.init(c); err != nil {
		return nil, err
	}
	return fc, nil
}

// NewUpgraded wraps c as New does, for a connection whose HTTP upgrade
// is already read: a server's, hijacked from net/http once the request
// was parsed (net/http's reader holds nothing more of a client that waits
// for the 101 before it sends a frame). Frames begin at its first byte.
func NewUpgraded(c net.Conn, limit int64) (*Conn, error) {
	fc, err := New(c, limit)
	if err != nil {
		return nil, err
	}
	fc.head = false
	return fc, nil
}

// NewTLS wraps c, a *net.TCPConn (or any syscall.Conn), in a TLS client
// connection of cfg, and that as New does. The handshake is the caller's
// (TLS().HandshakeContext), before anything else is read or written.
func NewTLS(c net.Conn, cfg *tls.Config, limit int64) (*Conn, error) {
	fc := &Conn{limit: limit, head: true}
	if err := fc.sock.init(c); err != nil {
		return nil, err
	}
	fc.tls = tls.Client(&fc.sock, cfg)
	fc.Conn = fc.tls
	return fc, nil
}

// TLS is the TLS connection, nil for plain TCP.
func (c *Conn) TLS() *tls.Conn { return c.tls }

// Socket is the TCP connection wrapped, for netpoll.Poller.Add.
func (c *Conn) Socket() syscall.Conn { return c.sock.Conn.(syscall.Conn) }

// Last returns when the last read that brought data ended, in Unix ns:
// taken after a message is read whole, when its last bytes arrived.
func (c *Conn) Last() int64 {
	if c == nil {
		return 0
	}
	return c.last
}

// Buffered is how many bytes are read from the socket and not yet handed
// on.
func (c *Conn) Buffered() int { return c.w - c.r }

// bufSize is the pooled buffer's size: one read takes what a busy
// connection has queued, many frames at once.
const bufSize = 4 << 10

// keepMax is the largest buffer given back to the pool.
const keepMax = 64 << 10

var pool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// room makes room in the buffer for n bytes after w, taking one from the
// pool if there is none and growing it for a message larger than it.
func (c *Conn) room(n int) []byte {
	if c.buf == nil {
		c.buf = pool.Get().(*[]byte)
		c.r, c.w = 0, 0
	}
	b := *c.buf
	if c.r > 0 && len(b)-c.w < n {
		copy(b, b[c.r:c.w])
		c.w -= c.r
		c.r = 0
	}
	if len(b)-c.w < n {
		nb := make([]byte, max(2*len(b), c.w+n))
		copy(nb, b[:c.w])
		b = nb
		*c.buf = b
	}
	return b[c.w:]
}

// release gives the buffer back once it is empty.
func (c *Conn) release() {
	if c.buf == nil || c.r < c.w {
		return
	}
	if len(*c.buf) <= keepMax {
		pool.Put(c.buf)
	}
	c.buf, c.r, c.w = nil, 0, 0
}

// fill reads what the socket has, at least one byte, blocking (under the
// connection's deadline) if it has none.
func (c *Conn) fill() error {
	if c.err != nil {
		return c.err
	}
	b := c.room(1)
	var src io.Reader = &c.sock
	if c.tls != nil {
		src = c.tls
	}
	n, err := src.Read(b)
	if n > 0 {
		c.w += n
		c.last = time.Now().UnixNano()
	}
	if n == 0 {
		c.release()
	}
	return err
}

// Outcomes of poll.
const (
	wouldBlock = iota // the socket had nothing
	drained           // it had less than there was room for: all it had
	more              // it filled the room: it may have more
)

// poll reads what the socket has without waiting, into room for at least
// want bytes. An error of the read is kept for Read to return once the
// bytes before it are read.
func (c *Conn) poll(want int) int {
	b := c.room(want)
	var n int
	var err error
	if c.tls == nil {
		n, err = c.sock.readNow(b)
		if n == 0 && err == nil {
			err = io.EOF
		}
	} else {
		c.sock.nowait = true
		n, err = c.tls.Read(b)
		c.sock.nowait = false
	}
	if n > 0 {
		c.w += n
		c.last = time.Now().UnixNano()
	}
	switch {
	case err == nil:
	case errors.Is(err, errNothingYet):
		c.release()
		if n > 0 {
			return more
		}
		return wouldBlock
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed):
		// A deadline that passed, or a closed socket: the blocking read
		// gorilla makes next returns it as the net package words it.
		c.stale = true
		c.release()
		return drained
	default:
		c.err = err
		c.release()
		return drained
	}
	// A plain read that took less than there was room for emptied the
	// socket. TLS hands on a record at a time, which says nothing of
	// what the socket holds.
	if c.tls == nil && n < len(b) {
		c.emptied = true
		return drained
	}
	return more
}

// Read hands gorilla the bytes of the current frame (or of the HTTP
// header), never past its end, reading the socket when none are
// buffered.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for c.w == c.r {
		if err := c.fill(); err != nil {
			if c.w > c.r {
				break
			}
			return 0, err
		}
	}
	avail := c.pending()
	head := c.head
	switch {
	case head:
		// Only what is handed on counts towards the header's end: a
		// reader smaller than the header reads it in several calls.
		if len(avail) > len(p) {
			avail = avail[:len(p)]
		}
		avail = c.headPart(avail)
	case c.left == 0:
		// At a frame boundary: gorilla may have only this frame's
		// header, which needs all of its bytes to size the frame.
		if err := c.header(); err != nil {
			return 0, err
		}
		avail = c.pending()
		fallthrough
	default:
		if int64(len(avail)) > c.left {
			avail = avail[:c.left]
		}
	}
	n := copy(p, avail)
	c.r += n
	if !head {
		c.left -= int64(n)
	}
	c.release()
	return n, nil
}

// pending is what is read from the socket and not yet handed on.
func (c *Conn) pending() []byte { return (*c.buf)[c.r:c.w] }

// headPart is the part of b up to and including the end of the HTTP
// header, and ends head mode there.
func (c *Conn) headPart(b []byte) []byte {
	const end = "\r\n\r\n"
	for i, ch := range b {
		switch {
		case ch == end[c.crlf]:
			c.crlf++
		case ch == '\r':
			c.crlf = 1
		default:
			c.crlf = 0
		}
		if int(c.crlf) == len(end) {
			c.head = false
			return b[:i+1]
		}
	}
	return b
}

// header reads until the frame header at r is whole, and sets left to
// the frame's length.
func (c *Conn) header() error {
	for {
		total, _, ok := frameAt(c.pending())
		if ok {
			c.left = total
			return nil
		}
		if err := c.fill(); err != nil {
			return err
		}
	}
}

// frameAt parses the frame header at the start of b: the frame's whole
// length (header and payload), and its header's. ok is false if b does
// not yet hold the whole header.
func frameAt(b []byte) (total int64, hdr int, ok bool) {
	if len(b) < 2 {
		return 0, 0, false
	}
	hdr = 2
	n := int64(b[1] & 0x7f)
	switch n {
	case 126:
		hdr += 2
	case 127:
		hdr += 8
	}
	if b[1]&0x80 != 0 {
		hdr += 4
	}
	if len(b) < hdr {
		return 0, 0, false
	}
	switch n {
	case 126:
		n = int64(b[2])<<8 | int64(b[3])
	case 127:
		n = 0
		for _, x := range b[2:10] {
			n = n<<8 | int64(x)
		}
		if n < 0 {
			// A length with its top bit set, which gorilla refuses:
			// hand it on as a frame of its header alone.
			n = 0
		}
	}
	return int64(hdr) + n, hdr, true
}

// maxHeader is the longest frame header.
const maxHeader = 14

// Ready reads what the socket has without blocking and reports whether
// gorilla can now read a message without waiting: a whole data message, a
// close frame, or an error, is buffered (or the connection's deadline has
// passed, which gorilla's read then returns). Pings and pongs at the
// front are taken out and given to OnControl. It is for a polled
// connection, between messages: call it when the socket is readable, and
// read a message each time it reports true.
//
// A read that took less than there was room for emptied the socket: until
// Ready next reports false, or Woken is called, it does not read again
// only to be told that nothing more came (edge-triggered readiness says
// so), which would cost a system call per message.
func (c *Conn) Ready() bool {
	ready := c.ready()
	if !ready {
		c.emptied = false
	}
	return ready
}

// Woken forgets that a read emptied the socket: call it at each readiness
// event, before its first Ready. What came since that read is announced
// by the event, not by a later one; a reader that stopped calling Ready
// before it said false (a held slow reader) would otherwise never read it,
// and a peer blocked on a full window sends nothing to wake it again.
func (c *Conn) Woken() { c.emptied = false }

func (c *Conn) ready() bool {
	for {
		if c.err != nil || c.stale {
			return true
		}
		need := 1
		if c.w > c.r {
			if c.head {
				return true
			}
			n, ready := c.scan()
			if ready {
				return true
			}
			need = max(n-(c.w-c.r), 1)
		}
		if c.emptied {
			return false
		}
		switch c.poll(need) {
		case wouldBlock:
			return false
		case drained:
			if c.err != nil || c.stale || (c.head && c.w > c.r) {
				return true
			}
			_, ready := c.scan()
			return ready
		}
	}
}

// scan looks at the buffered frames from r: it takes out the pings and
// pongs at the front, and reports whether a message is whole (ready), else
// how many bytes from r it needs at least.
func (c *Conn) scan() (need int, ready bool) {
	for c.buf != nil && c.w > c.r {
		b := (*c.buf)[c.r:c.w]
		pos := 0
		for {
			total, hdr, ok := frameAt(b[pos:])
			if !ok {
				return pos + maxHeader, false
			}
			op := b[pos] & 0x0f
			if total-int64(hdr) > c.limit {
				return 0, true // gorilla's read limit refuses it
			}
			end := pos + int(total)
			if end > len(b) {
				return end, false
			}
			if pos == 0 && (op == OpPing || op == OpPong) {
				c.control(op, b[:end], hdr)
				c.r += end
				c.release()
				break // scan again from the new r
			}
			// A close, or a message's final frame. A ping or pong
			// between a message's fragments is gorilla's to answer
			// as it reads the message, and does not end it.
			if op == OpClose || (op < OpClose && b[pos]&0x80 != 0) {
				return end, true
			}
			pos = end
		}
	}
	return 2, false
}

// control hands OnControl the payload of the control frame f, whose
// header is hdr bytes long, unmasked where it lies: the frame is consumed,
// and a copy would be an allocation per ping or pong (OnControl is an
// interface, so a local array escapes).
func (c *Conn) control(op byte, f []byte, hdr int) {
	payload := f[hdr:]
	if f[1]&0x80 != 0 {
		key := f[hdr-4 : hdr]
		for i := range payload {
			payload[i] ^= key[i&3]
		}
	}
	if c.OnControl != nil {
		c.OnControl.Control(int(op), payload)
	}
}
