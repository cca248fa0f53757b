package wsconn

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/internal/wsframe"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// watch is Serve without a goroutine: the Poller runs ready when the
// socket has data, ready reads every whole message there is (wsframe.Conn
// says, without blocking, whether one is) and returns. The idle deadline
// that Serve's blocking read would meet is kept by the Poller's clock
// (Handle.SetDeadline), which wakes ready to read the deadline's error
// once it has passed: a dead peer, a timeout and
// a close end the session as they end Serve's, through the same error
// paths and classes.
type watch struct {
	c    *Conn
	fc   *wsframe.Conn
	p    Protocol
	done func(error)
	h    *netpoll.Handle

	// mu orders ready's runs for the race detector and the Go memory
	// model: the Poller never runs two at once, but its hand-over from
	// one worker to the next goes through the kernel.
	mu    sync.Mutex
	ended bool

	// hold (ns) is how long the handler of the frame being read asked
	// reading to stop (Hold); heldUntil (Unix ns) is when a hold ends,
	// 0 when there is none. While it lasts, the frames behind wait in the
	// socket buffers and then on the server, as behind a reader that
	// sleeps, but no goroutine waits: a timer wakes ready at its end.
	hold      atomic.Int64
	heldUntil atomic.Int64
	holdTimer *time.Timer
}

// Watch starts reading the session on the Poller the connection was
// dialled with, handing p each frame as Serve does, and returns at once;
// done gets Serve's result, once, after the socket is closed. It reports
// false, having done nothing, if the connection cannot be watched (no
// Poller, a dialer of the Settings' own, a session already closing): call
// Serve then. A wss connection is watched too: its TLS is inside the
// wsframe.Conn the Poller reads.
// Frames read during the login and still buffered are handed on first.
func (c *Conn) Watch(p Protocol, done func(error)) bool {
	fc, ok := c.ws.NetConn().(*wsframe.Conn)
	if !ok || c.poller == nil || c.guard.Closing() {
		return false
	}
	// The login's reads left a deadline; from now on the Poller's clock
	// keeps it, and ready sets the socket's own only once it has passed.
	// (A Close meanwhile brings it forward: see below.)
	if c.ws.SetReadDeadline(time.Time{}) != nil {
		return false
	}
	w := &watch{c: c, fc: fc, p: p, done: done}
	fc.OnControl = w
	// Frames already in the socket are read as soon as Add arms it, on a
	// worker: ready waits for mu until the watch is published, so that
	// their handler finds it (a slow reader's Hold on the first frame
	// said false without this, and its pause slept on the worker).
	w.mu.Lock()
	h, err := c.poller.Add(fc.Socket(), w)
	if err != nil {
		w.mu.Unlock()
		fc.OnControl = nil
		return false
	}
	w.h = h
	// The session is dead when nothing is read until then; each frame
	// moves it on (extend), a store that the Poller's clock finds when
	// it comes.
	h.SetDeadline(time.Now().Add(c.idle).UnixNano())
	c.watching.Store(w)
	w.mu.Unlock()
	if c.guard.Closing() {
		// Close came between the check above and the store: it may not
		// have seen the watch to bring its deadline forward.
		w.closeBy(c.s.CloseGrace)
	}
	// Bytes that came with the login's last frame, or before Add.
	h.Wake()
	return true
}

// wake has a watch look at its socket: one closed under it (a failed
// write, Abort) reads as closed at once, not at the idle deadline, and
// a hold ends.
func (c *Conn) wake() {
	if w := c.watching.Load(); w != nil {
		w.heldUntil.Store(0)
		w.h.Wake()
	}
}

// Hold stops reading the connection for d once the frame being handled
// returns, and reports true, if the connection is watched and Hold is
// called from its frame handler; holds asked while handling one frame add
// up. A connection read by Serve reports false: its handler holds reading
// by taking its time. A close, an abort or a failed write ends a hold.
func (c *Conn) Hold(d time.Duration) bool {
	w := c.watching.Load()
	if w == nil || d <= 0 {
		return w != nil
	}
	w.hold.Add(int64(d))
	return true
}

// Ready reads every whole message buffered or waiting on the socket.
func (w *watch) Ready() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	c := w.c
	if until := w.heldUntil.Load(); until != 0 {
		if time.Now().UnixNano() < until && !c.guard.Closing() {
			// Data came during a hold: it waits for the hold's timer.
			return
		}
		w.heldUntil.Store(0)
	}
	if d := w.h.Deadline(); d != 0 && time.Now().UnixNano() >= d {
		// The idle deadline (or a close's grace) has passed: the
		// socket's own is set in the past, and the read below fails
		// as Serve's would.
		_ = w.fc.SetReadDeadline(time.Now())
	}
	w.fc.Woken()
	for w.fc.Ready() {
		bp, err := c.read()
		if err != nil {
			switch {
			case errors.Is(err, ErrBinary):
				w.end(c.Failed(err))
			case c.guard.Closing():
				w.end(&probe.Disconnect{Reason: metrics.ReasonShutdown, Err: ignoreClosed(err)})
			default:
				w.end(w.p.Ended(err))
			}
			return
		}
		w.extend()
		err = w.p.Frame(*bp, c.stamp.Last())
		Release(bp)
		if err != nil {
			w.end(c.Failed(err))
			return
		}
		if d := w.hold.Swap(0); d > 0 && !c.guard.Closing() {
			w.holdFor(time.Duration(d))
			return
		}
	}
}

// holdFor stops reading for d: ready returns without draining the socket,
// so edge-triggered readiness stays quiet until more data comes (which
// ready then leaves) or the hold's timer wakes it. The idle deadline
// starts again after the hold, as a sleeping reader's next read's would.
func (w *watch) holdFor(d time.Duration) {
	until := time.Now().Add(d)
	w.heldUntil.Store(until.UnixNano())
	w.h.SetDeadline(until.Add(w.c.idle).UnixNano())
	if w.holdTimer == nil {
		w.holdTimer = time.AfterFunc(d, w.holdEnded)
		return
	}
	w.holdTimer.Reset(d)
}

// holdEnded is the hold's timer: reading resumes whatever the wall clock
// says (heldUntil only keeps out the readiness events that come during a
// hold, and a clock stepped back must not stretch it).
func (w *watch) holdEnded() {
	w.heldUntil.Store(0)
	w.h.Wake()
}

// extend moves the idle deadline to c.idle from now, unless closing.
func (w *watch) extend() {
	if !w.c.guard.Closing() {
		w.h.SetDeadline(time.Now().Add(w.c.idle).UnixNano())
	}
}

// Control answers a ping and takes a pong as a sign of life, as gorilla's
// handlers do for Serve.
func (w *watch) Control(op int, payload []byte) {
	switch op {
	case wsframe.OpPong:
		w.extend()
	case wsframe.OpPing:
		err := w.c.ws.WriteControl(websocket.PongMessage, payload, time.Now().Add(w.c.s.WriteTimeout))
		if err != nil && !errors.Is(err, websocket.ErrCloseSent) {
			Fail(w.c.ws, err)
			// ready is running: its next Ready reads the closed socket.
		}
	}
}

// closeBy brings the deadline to grace from now: Close has begun, and the
// server's reply is waited for that long.
func (w *watch) closeBy(grace time.Duration) {
	w.h.SetDeadline(time.Now().Add(grace).UnixNano())
	if w.heldUntil.Swap(0) != 0 {
		// The server's reply to the close is read now, not after the
		// hold.
		w.h.Wake()
	}
}

// end closes the connection and reports why the session ended, once.
func (w *watch) end(err error) {
	w.ended = true
	w.h.SetDeadline(0)
	if w.holdTimer != nil {
		w.holdTimer.Stop()
	}
	w.h.Remove()
	w.c.ws.Close()
	w.fc.OnControl = nil
	w.done(err)
}

// Watchable reports whether Watch can take the connection: a plain
// WebSocket dialled with a Poller, not closing.
func (c *Conn) Watchable() bool {
	_, ok := c.ws.NetConn().(*wsframe.Conn)
	return ok && c.poller != nil && !c.guard.Closing()
}

// Session is an adapter's session as its probe.Session's Serve and
// probe.Watcher's Watch see it: Begin runs before the read loop (the
// handler is set, frames kept from the login are handled) and its error
// ends the session there; Finish, if set, turns the read loop's result
// into the session's (what the session never saw counts now, its stream
// state is kept for a resume). Begin's error is the session's as it is:
// Begin ends the connection itself.
type Session struct {
	Conn   *Conn
	Proto  Protocol
	Begin  func() error
	Finish func(error) error
}

func (s Session) finish(err error) error {
	if s.Finish != nil {
		return s.Finish(err)
	}
	return err
}

// Serve runs the session on the calling goroutine: probe.Session.Serve.
func (s Session) Serve() error {
	if s.Begin != nil {
		if err := s.Begin(); err != nil {
			return err
		}
	}
	return s.finish(s.Conn.Serve(s.Proto))
}

// Watch runs the session on the connection's Poller and returns at once:
// probe.Watcher.Watch. It reports false, having done nothing, if the
// connection cannot be watched. Should it turn out unwatchable after
// Begin (Close came meanwhile), it is served on the calling goroutine.
func (s Session) Watch(done func(error)) bool {
	if !s.Conn.Watchable() {
		return false
	}
	if s.Begin != nil {
		if err := s.Begin(); err != nil {
			done(err)
			return true
		}
	}
	end := done
	if s.Finish != nil {
		end = func(err error) { done(s.Finish(err)) }
	}
	if !s.Conn.Watch(s.Proto, end) {
		end(s.Conn.Serve(s.Proto))
	}
	return true
}
