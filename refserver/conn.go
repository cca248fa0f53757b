package refserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// conn is one WebSocket connection. The handler goroutine that accepted it
// is its reader and its owner: it starts the writer, and returns only after
// the writer has exited and the socket is closed.
type conn struct {
	s   *Server
	ws  *websocket.Conn
	log *slog.Logger
	// p is the state of a connection the Poller reads (see poll.go),
	// nil for one read by a goroutine, which uses the channels below.
	p *polled

	// send is the bounded send queue. Only the writer receives from it;
	// senders never block on it (see Server.enqueue).
	send chan []byte
	// start hands the writer login_ok and the offline backlog, which must
	// go out before anything in send and may be longer than send is.
	start chan [][]byte
	// quit is closed by closeWith; the writer then sends the close frame.
	quit       chan struct{}
	writerDone chan struct{}

	// closing mirrors quit for checks under Server.mu that must not block.
	closing atomic.Bool
	// mu orders closeWith against the reader extending its deadline, so
	// that a close's short deadline is never overwritten by an idle one.
	mu      sync.Mutex
	code    int
	reason  string
	closeBy time.Time
	// final is a frame the writer sends just before the close frame: the
	// error that explains a refused login.
	final []byte

	// user and loginN are set once at login, before the conn is
	// published in Server.users, and read under Server.mu. loginN is the
	// login's number (see Server.logins).
	user   string
	loginN uint64
	// held is the delivery held back by the reorder fault, heldGen tells
	// one hold from the next, heldSelf says it is a self-sync delivery
	// and heldAt is Server.logins when it was held; all are guarded by
	// Server.mu.
	held       []byte
	heldStream string
	heldGen    uint64
	heldSelf   bool
	heldAt     uint64
}

// serveWS upgrades the request and hands the connection to the Poller
// (see poll.go), returning at once; or, without one, runs it on the
// handler's own goroutine, which saves a goroutine per connection and
// lets Close wait for handlers alone.
func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	poller, ok := s.track()
	if !ok {
		http.Error(w, "server shutting down", http.StatusServiceUnavailable)
		return
	}
	polled := false
	defer func() {
		if !polled {
			s.conns.Done()
		}
	}()
	up := &s.up
	if poller != nil {
		w, up = pollHijacker{ResponseWriter: w, limit: s.opts.MaxFrame + 1}, &s.pollUp
	}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		// Upgrade has already answered the request.
		s.log.Debug("upgrade failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	if n := s.opts.SendBuffer; n > 0 {
		if tc, ok := tcpConn(ws.NetConn()); ok {
			if err := tc.SetWriteBuffer(n); err != nil {
				s.log.Debug("setting the send buffer", "remote", r.RemoteAddr, "err", err)
			}
		}
	}
	s.stats.connections.Add(1)
	c := &conn{s: s, ws: ws, log: s.log.With("remote", r.RemoteAddr)}
	polled = s.watch(c, poller)
	if !polled {
		c.send = make(chan []byte, s.opts.SendQueue)
		c.start = make(chan [][]byte, 1)
		c.quit = make(chan struct{})
		c.writerDone = make(chan struct{})
		ws.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		ws.SetPingHandler(c.onPing)
		ws.SetPongHandler(func(string) error { c.extend(); return nil })
	}

	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.live[c] = struct{}{}
	}
	s.mu.Unlock()
	if closed {
		c.closeWith(websocket.CloseGoingAway, "server shutting down")
	}
	if polled {
		// Bytes that came before the registration.
		c.p.h.Wake()
		return
	}

	go c.writeLoop() // exits after quit, or on a write error
	c.readLoop()
	c.finish()
	s.stats.connections.Add(-1)
}

// closeWith starts closing the connection with code and reason; code 0
// closes without a close frame (the peer is gone or already closed). Only
// the first call counts; it reports whether it was the first. It never
// blocks, so it may be called with Server.mu held.
func (c *conn) closeWith(code int, reason string) bool {
	return c.closeAfter(nil, code, reason)
}

// closeAfter is closeWith that has the writer send final, if not nil,
// just before the close frame; frames still queued are discarded as
// usual.
func (c *conn) closeAfter(final []byte, code int, reason string) bool {
	// A close frame's payload is at most 125 bytes, two of them the code.
	for len(reason) > 123 {
		_, n := utf8.DecodeLastRuneInString(reason)
		reason = reason[:len(reason)-n]
	}
	c.mu.Lock()
	if c.closing.Load() {
		c.mu.Unlock()
		return false
	}
	c.closing.Store(true)
	c.code, c.reason, c.final = code, reason, final
	grace := closeGrace
	if code == CloseSlowConsumer {
		grace = slowCloseGrace
	}
	c.closeBy = time.Now().Add(grace)
	// The reader keeps reading until the peer echoes the close frame,
	// but no longer than closeGrace.
	c.ws.SetReadDeadline(c.closeBy)
	c.mu.Unlock()
	if p := c.p; p != nil {
		c.arm()
		p.wmu.Lock()
		c.kick()
		p.wmu.Unlock()
		return true
	}
	close(c.quit)
	return true
}

func (c *conn) closeInfo() (code int, reason string, by time.Time) {
	code, reason, by, _ = c.closeState()
	return code, reason, by
}

func (c *conn) closeState() (code int, reason string, by time.Time, final []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code, c.reason, c.closeBy, c.final
}

// hurry cuts a close in progress to closeGrace from now, for the server's
// shutdown.
func (c *conn) hurry() {
	c.mu.Lock()
	if by := time.Now().Add(closeGrace); c.closing.Load() && by.Before(c.closeBy) {
		c.closeBy = by
		c.ws.SetReadDeadline(by)
	}
	c.mu.Unlock()
	if c.p != nil {
		c.arm()
	}
}

// extend pushes the idle deadline out after any frame from the peer.
func (c *conn) extend() {
	if p := c.p; p != nil {
		// A store, which the Poller's clock reads when it comes.
		p.h.SetDeadline(time.Now().Add(c.s.opts.IdleTimeout).UnixNano())
		if c.closing.Load() {
			// A close began meanwhile: its deadline, not this one.
			c.arm()
		}
		return
	}
	c.mu.Lock()
	if !c.closing.Load() {
		c.ws.SetReadDeadline(time.Now().Add(c.s.opts.IdleTimeout))
	}
	c.mu.Unlock()
}

// onPing answers a WebSocket ping; it runs on the reader goroutine.
func (c *conn) onPing(data string) error {
	c.extend()
	err := c.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(controlWait))
	var ne net.Error
	if err == nil || errors.Is(err, websocket.ErrCloseSent) || (errors.As(err, &ne) && ne.Timeout()) {
		// A pong lost behind a blocked writer is the slow consumer's
		// problem, not a reason to end the read loop.
		return nil
	}
	return err
}

// readLoop reads frames until the connection fails or, once closing, until
// the peer echoes the close frame or closeGrace is up.
func (c *conn) readLoop() {
	for c.readOne() {
	}
}

// readOne reads and handles one frame, and reports false once the
// connection's reading is over (readFailed has been called).
func (c *conn) readOne() bool {
	s := c.s
	{
		mt, r, err := c.ws.NextReader()
		if err != nil {
			c.readFailed(err)
			return false
		}
		if c.closing.Load() {
			return true // drain until the peer's close
		}
		c.extend()
		if mt != websocket.TextMessage {
			c.closeWith(websocket.ClosePolicyViolation, "binary frames are not supported")
			return true
		}
		// The limit is enforced here rather than with SetReadLimit, which
		// answers with 1009 before the server can say 1008 (see doc.go).
		// Reading one byte past it is enough to know; the rest is
		// skipped by the next NextReader.
		buf := s.getBuf()
		_, err = buf.ReadFrom(io.LimitReader(r, s.opts.MaxFrame+1))
		if err != nil {
			s.putBuf(buf)
			c.readFailed(err)
			return false
		}
		if int64(buf.Len()) > s.opts.MaxFrame {
			c.closeWith(websocket.ClosePolicyViolation, fmt.Sprintf("frame too large: limit %d bytes", s.opts.MaxFrame))
		} else {
			c.handle(buf.Bytes())
		}
		s.putBuf(buf)
		return true
	}
}

func (c *conn) readFailed(err error) {
	var ce *websocket.CloseError
	var ne net.Error
	switch {
	case c.closing.Load():
		// The peer's echo or closeGrace: the close is complete.
	case errors.As(err, &ce):
		// The peer closed first; gorilla has echoed its close frame.
		c.log.Debug("peer closed", "user", c.user, "code", ce.Code, "text", ce.Text)
		c.closeWith(0, "")
	case errors.As(err, &ne) && ne.Timeout():
		c.closeWith(CloseIdle, "idle timeout")
	default:
		c.log.Debug("read failed", "user", c.user, "err", err)
		c.closeWith(0, "")
	}
}

// finish runs on the reader after readLoop: it unregisters the connection,
// lets the writer send its close frame until closeGrace is up, then closes
// the socket, which also frees a writer stuck on a peer that stopped
// reading.
func (c *conn) finish() {
	s := c.s
	c.unregister()
	_, _, by := c.closeInfo()
	t := time.NewTimer(time.Until(by))
	select {
	case <-c.writerDone:
	case <-t.C:
	case <-s.done:
		// Shutting down: a slow consumer's longer grace gives way to
		// the server's own bound.
		t.Reset(min(time.Until(by), closeGrace))
		select {
		case <-c.writerDone:
		case <-t.C:
		}
	}
	t.Stop()
	c.ws.Close()
	<-c.writerDone
	code, reason, _ := c.closeInfo()
	c.log.Debug("connection closed", "user", c.user, "code", code, "reason", reason)
}

// unregister takes the connection out of the server's routing: a
// delivery held for it goes on to the user's other sessions.
func (c *conn) unregister() {
	s := c.s
	s.mu.Lock()
	delete(s.live, c)
	if c.user != "" {
		sessions := slices.DeleteFunc(s.users[c.user], func(o *conn) bool { return o == c })
		if len(sessions) == 0 {
			delete(s.users, c.user)
		} else {
			s.users[c.user] = sessions
		}
	}
	if c.held != nil {
		// A held delivery was in flight, not lost: it goes to the user's
		// sessions that logged in since, or to the next one.
		s.releaseHeld(c)
	}
	s.mu.Unlock()
}

// abort closes the socket under the connection, which fails a write
// stuck on it and ends its reading.
func (c *conn) abort() {
	c.ws.NetConn().Close()
	if c.p != nil {
		// A closed socket raises no event of its own.
		c.p.h.Wake()
	}
}

// writeLoop is the only goroutine that writes data frames. It exits after
// sending the close frame, or when a write fails.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	select {
	case batch := <-c.start:
		for _, b := range batch {
			if !c.write(b) {
				return
			}
		}
	case <-c.quit:
		c.writeClose()
		return
	}
	for {
		select {
		case b := <-c.send:
			if !c.write(b) {
				return
			}
		case <-c.quit:
			c.writeClose()
			return
		}
	}
}

// write sends one frame and reports whether the writer should go on.
func (c *conn) write(b []byte) bool {
	select {
	case <-c.quit:
		// select picks at random among ready cases; a close must not
		// wait behind a full queue of frames.
		c.writeClose()
		return false
	default:
	}
	c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := c.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		c.log.Debug("write failed", "user", c.user, "err", err)
		c.closeWith(0, "")
		// Wake the reader: nobody reads what a broken socket would echo.
		c.abort()
		return false
	}
	return true
}

func (c *conn) writeClose() {
	code, reason, by, final := c.closeState()
	if code == 0 {
		return
	}
	if final != nil {
		c.ws.SetWriteDeadline(by)
		if c.ws.WriteMessage(websocket.TextMessage, final) != nil {
			return
		}
	}
	// Fails fast if the peer's close was already echoed or by has passed.
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), by)
}

// handle acts on one text frame from the peer.
func (c *conn) handle(data []byte) {
	var f inFrame
	if err := json.Unmarshal(data, &f); err != nil {
		c.closeWith(websocket.ClosePolicyViolation, "malformed JSON: "+err.Error())
		return
	}
	if c.user == "" {
		if f.Type != "login" {
			c.closeWith(websocket.ClosePolicyViolation, fmt.Sprintf("first frame must be login, not %q", f.Type))
			return
		}
		c.login(&f)
		return
	}
	switch f.Type {
	case "send":
		c.s.sendMessage(c, &f)
	case "group":
		c.s.setGroup(c, &f)
	case "history":
		c.s.history(c, &f)
	case "seqs":
		c.s.seqs(c, &f)
	case "ping":
		c.s.enqueue(c, appendReply(nil, "pong", f.ID))
	case "login":
		c.closeWith(websocket.ClosePolicyViolation, "already logged in")
	case "":
		c.closeWith(websocket.ClosePolicyViolation, `missing frame "type"`)
	default:
		c.closeWith(websocket.ClosePolicyViolation, fmt.Sprintf("unknown frame type %q", f.Type))
	}
}

// login registers c as f.User's session. The token is never logged.
func (c *conn) login(f *inFrame) {
	s := c.s
	switch {
	case f.User == "":
		c.closeWith(CloseUnauthorized, "missing user")
		return
	case !s.authorized(f.User, f.Token):
		c.log.Debug("login refused", "user", f.User)
		c.closeWith(CloseUnauthorized, "bad token")
		return
	}
	s.mu.Lock()
	if s.closed || c.closing.Load() {
		s.mu.Unlock()
		return
	}
	var active []*conn
	for _, o := range s.users[f.User] {
		if isOpen(o) {
			active = append(active, o)
		}
	}
	if limit := s.opts.MaxDevices; len(active) >= limit {
		reason := fmt.Sprintf("device limit %d reached", limit)
		s.stats.deviceLimit.Add(1)
		if s.opts.DevicePolicy == DevicePolicyRefuse {
			s.mu.Unlock()
			msg := fmt.Sprintf("device limit %d reached: %q has %d sessions", limit, f.User, len(active))
			c.closeAfter(appendError(nil, f.ID, "device_limit", msg), CloseConflict, reason)
			c.log.Debug("login refused", "user", f.User, "reason", reason)
			return
		}
		// Oldest first: s.users is in login order.
		for _, o := range active[:len(active)-limit+1] {
			o.closeWith(CloseConflict, reason)
		}
	}
	s.logins++
	c.user, c.loginN = f.User, s.logins
	s.users[f.User] = append(s.users[f.User], c)
	batch := [][]byte{appendReply(nil, "login_ok", f.ID)}
	if q := s.offline[f.User]; q != nil {
		delete(s.offline, f.User)
		for _, b := range q.frames {
			s.offBytes -= int64(len(b))
		}
		if s.stalls(f.User) {
			// The backlog is delivered to this session like anything
			// else, so the stall discards it like anything else.
			s.stats.stalled.Add(uint64(len(q.frames)))
		} else {
			batch = append(batch, q.frames...)
			s.stats.deliveries.Add(uint64(len(q.frames)))
		}
	}
	// Sent under mu, so nothing routed to c afterwards can overtake it;
	// start has room for exactly this one batch.
	if c.p != nil {
		c.begin(batch)
	} else {
		c.start <- batch
	}
	s.mu.Unlock()
	s.stats.logins.Add(1)
	c.log.Debug("login", "user", f.User, "backlog", len(batch)-1)
}
