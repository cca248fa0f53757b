package refserver

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/internal/wsframe"
)

// The reactor: a connection that waits for its next frame holds no
// goroutine. The kernel says when its socket has data (netpoll, the
// prober's own poller), a worker reads every whole frame there is
// (wsframe says, without blocking, whether one is) and returns. The
// goroutine-per-connection server held a reader parked in a read, a
// writer parked on its queue, the queue's 256 slots and net/http's
// request state for every idle connection: about 33 KB each
// (BenchmarkServerMemory).
//
// What each part became:
//   - the reader: ready, run by the Poller; it reads as readLoop did, one
//     frame at a time through readOne, and finishes the connection the
//     same way.
//   - the idle deadline: kept by the Poller's clock (Handle.SetDeadline),
//     which a frame only moves by a store; once it has passed, ready
//     closes as the read deadline's timeout did (expire).
//   - the writer: flush, a goroutine that exists only while the
//     connection has frames to write, started by the first frame queued
//     and ended when the queue is empty. Its writes wait for the socket,
//     under the write timeout, as the writer's did.
//   - the send queue: a slice, nil when empty, bounded by SendQueue frames
//     as the channel was: a full queue is a slow consumer.
//   - pongs: queued ahead of the frames, as WriteControl jumped the queue.

// polled is a connection's state while a Poller reads it.
type polled struct {
	fc *wsframe.Conn
	h  *netpoll.Handle

	// rmu orders ready's runs for the race detector and the Go memory
	// model: the Poller never runs two at once, but its hand-over from
	// one worker to the next goes through the kernel. ended says finish
	// has run.
	rmu   sync.Mutex
	ended bool

	// tmu makes reading the state a deadline is set for and setting it
	// one step, so that a close's shorter deadline is never overwritten
	// by an idle one computed before it.
	tmu sync.Mutex

	// wmu guards the write side.
	wmu sync.Mutex
	// start is login_ok and the offline backlog, which go out first and
	// may be longer than the queue is (see Server.login).
	start [][]byte
	// queue[head:] is the send queue; at most SendQueue frames. It
	// starts in small, so that the usual one or two frames at a time
	// allocate nothing, and lets go of a larger array once emptied.
	queue [][]byte
	head  int
	small [2][]byte
	// flushFn is flush as a func value, made once: a go statement with a
	// method value allocates its closure at each start.
	flushFn func()
	// pongDue says a ping is not yet answered, and pong is its payload
	// (a pong answers the latest ping only); often empty.
	pong    []byte
	pongDue bool
	// flushing says a flush goroutine runs; flushed that none ever will
	// again (the close is written or a write failed); read that ready has
	// finished reading. The last of flush and finish to end closes the
	// socket.
	flushing, flushed, read bool
}

// queued is how many frames the send queue holds. Called with wmu held.
func (p *polled) queued() int { return len(p.queue) - p.head }

// pollHijacker hands gorilla's Upgrade the hijacked TCP connection wrapped
// in a wsframe.Conn, through which the Poller can tell whether a whole
// frame is waiting. A connection that is not plain TCP (TLS, a test's
// pipe) is handed on as it is, and read by a goroutine.
type pollHijacker struct {
	http.ResponseWriter
	limit int64
}

func (h pollHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		if fc, err := wsframe.NewUpgraded(tc, h.limit); err == nil {
			return fc, brw, nil
		}
	}
	return nc, brw, nil
}

// tcpConn is the TCP connection under a WebSocket's, if it is one.
func tcpConn(nc net.Conn) (*net.TCPConn, bool) {
	if fc, ok := nc.(*wsframe.Conn); ok && fc.TLS() == nil {
		nc = fc.Conn
	}
	tc, ok := nc.(*net.TCPConn)
	return tc, ok
}

// watch has poller read c, and reports false, having changed nothing,
// if it cannot: the connection is then read by a goroutine.
func (s *Server) watch(c *conn, poller *netpoll.Poller) bool {
	fc, ok := c.ws.NetConn().(*wsframe.Conn)
	if !ok || poller == nil {
		return false
	}
	// Frames are written by the flush goroutine, which may wait: what
	// the socket will not take stays in the send queue, where it counts
	// towards the slow-consumer bound, not in a backlog of wsframe's.
	fc.SetBlockingWrites()
	p := &polled{fc: fc}
	p.flushFn = c.flush
	c.p = p
	fc.OnControl = c
	// ready may run as soon as Add returns: it waits for the Handle.
	p.rmu.Lock()
	defer p.rmu.Unlock()
	h, err := poller.Add(fc.Socket(), c)
	if err != nil {
		c.p, fc.OnControl = nil, nil
		s.log.Debug("not polled", "err", err)
		return false
	}
	p.h = h
	h.SetDeadline(time.Now().Add(s.opts.IdleTimeout).UnixNano())
	return true
}

// Ready reads every whole frame buffered or waiting on the socket, and
// finishes the connection when its read fails (a close, a deadline, a
// broken socket).
func (c *conn) Ready() {
	p := c.p
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if p.ended {
		return
	}
	if d := p.h.Deadline(); d != 0 && time.Now().UnixNano() >= d {
		c.expire()
	}
	p.fc.Woken()
	for p.fc.Ready() {
		if !c.readOne() {
			p.ended = true
			c.finishPolled()
			return
		}
	}
}

// Control answers a ping read between frames, and counts it and a pong
// as the peer's sign of life.
func (c *conn) Control(op int, payload []byte) {
	c.extend()
	if op != wsframe.OpPing {
		return
	}
	p := c.p
	p.wmu.Lock()
	p.pong, p.pongDue = append(p.pong[:0], payload...), true
	c.kick()
	p.wmu.Unlock()
}

// expire runs in ready once the deadline has passed: at the idle deadline
// it closes the connection as idle, at a close's deadline it closes the
// socket, and the reader, woken, finishes. A close's deadline that moved
// meanwhile is set again.
func (c *conn) expire() {
	now := time.Now()
	if c.closing.Load() {
		if _, _, by := c.closeInfo(); by.After(now) {
			c.arm()
			return
		}
		// The close's time is up, as finish's wait was: the socket
		// closes under a flush still stuck on it, and the reader
		// finishes.
		c.abort()
		return
	}
	c.closeWith(CloseIdle, "idle timeout")
}

// arm sets a closing connection's deadline to its close's.
func (c *conn) arm() {
	p := c.p
	p.tmu.Lock()
	defer p.tmu.Unlock()
	if c.closing.Load() {
		_, _, due := c.closeInfo()
		p.h.SetDeadline(due.UnixNano())
	}
}

// kick starts a flush unless one runs or the write side is done. Called
// with wmu held.
func (c *conn) kick() {
	p := c.p
	if p.flushing || p.flushed {
		return
	}
	p.flushing = true
	go p.flushFn()
}

// push queues b, and reports false if the queue is full. A closing
// connection takes it and drops it, as the writer dropped what was queued
// behind a close.
func (c *conn) push(b []byte) bool {
	p := c.p
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.queued() >= c.s.opts.SendQueue {
		return false
	}
	if c.closing.Load() {
		return true
	}
	if p.queue == nil {
		p.queue = p.small[:0]
	}
	p.queue = append(p.queue, b)
	c.kick()
	return true
}

// begin queues login_ok and the offline backlog, ahead of everything.
func (c *conn) begin(batch [][]byte) {
	p := c.p
	p.wmu.Lock()
	p.start = batch
	c.kick()
	p.wmu.Unlock()
}

// room is how many more frames the send queue takes.
func (c *conn) room() int {
	if c.p == nil {
		return cap(c.send) - len(c.send)
	}
	p := c.p
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return c.s.opts.SendQueue - p.queued()
}

// next takes the next frame to write, and whether it is a pong; nil once
// the connection is closing or nothing is left. Called with wmu held.
func (p *polled) next() (b []byte, pong bool) {
	switch {
	case p.pongDue:
		// A copy: the next ping's payload may come meanwhile.
		p.pongDue = false
		return append(make([]byte, 0, len(p.pong)), p.pong...), true
	case len(p.start) > 0:
		b, p.start[0] = p.start[0], nil
		p.start = p.start[1:]
		if len(p.start) == 0 {
			p.start = nil
		}
		return b, false
	case p.queued() > 0:
		b, p.queue[p.head] = p.queue[p.head], nil
		p.head++
		if p.head == len(p.queue) {
			// Emptied: a larger array goes, so an idle connection
			// holds none.
			p.queue, p.head, p.small = nil, 0, [2][]byte{}
		}
		return b, false
	}
	return nil, false
}

// flush writes what is queued until nothing is, or until the connection
// closes: then it writes the close frame (and drops the rest), and is the
// last flush.
func (c *conn) flush() {
	p := c.p
	for {
		p.wmu.Lock()
		if c.closing.Load() {
			p.start, p.queue, p.head, p.pong, p.pongDue = nil, nil, 0, nil, false
			p.wmu.Unlock()
			c.writeClose()
			p.wmu.Lock()
			p.flushing, p.flushed = false, true
			last := p.read
			p.wmu.Unlock()
			if last {
				c.release()
			}
			return
		}
		b, pong := p.next()
		if b == nil && !pong {
			p.flushing = false
			p.wmu.Unlock()
			return
		}
		p.wmu.Unlock()
		if pong {
			// A pong lost behind a blocked socket is the slow consumer's
			// problem; a broken one fails the next write.
			_ = c.ws.WriteControl(websocket.PongMessage, b, time.Now().Add(controlWait))
			continue
		}
		c.write(b) // a failure closes, and the next round sees it
	}
}

// finishPolled is finish for a polled connection: it unregisters it and,
// unless a flush still runs (to write the close frame, within the close's
// deadline), closes the socket.
func (c *conn) finishPolled() {
	p := c.p
	p.h.Remove()
	c.unregister()
	p.wmu.Lock()
	p.read = true
	last := !p.flushing
	p.flushed = true
	p.wmu.Unlock()
	if last {
		c.release()
	}
}

// release closes a polled connection's socket, once both its reading and
// its writing are over.
func (c *conn) release() {
	s := c.s
	c.p.h.SetDeadline(0)
	c.ws.Close()
	s.stats.connections.Add(-1)
	code, reason, _ := c.closeInfo()
	c.log.Debug("connection closed", "user", c.user, "code", code, "reason", reason)
	s.conns.Done()
}
