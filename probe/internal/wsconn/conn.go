package wsconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/internal/wsframe"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Settings are what every connection of one adapter shares: where to
// dial, how long to wait, and how to say goodbye. An adapter makes them
// once, with NewSettings, in its constructor; they are not modified
// afterwards.
type Settings struct {
	URL string
	// Header is sent with the upgrade: the User-Agent and the configured
	// target.headers.
	Header http.Header
	// Subprotocol, if set, is the one the server must choose.
	Subprotocol string
	// MaxFrame bounds one received frame. Default 64 KiB.
	MaxFrame int64
	// WriteBuffer is the size of the pooled buffer each write is staged
	// in: a frame up to it goes out whole. Default 4 KiB.
	WriteBuffer int
	// DialTimeout bounds the dial, the upgrade and the login together
	// (Open), and each read of a login. Default 10 s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write: a server that stops reading must not
	// block the sender, which serves other users too, for longer.
	// Default 5 s.
	WriteTimeout time.Duration
	// Heartbeat is the sessions' keepalive interval. Default 30 s. The
	// idle timeout follows from it (IdleFor).
	Heartbeat time.Duration
	// CloseGrace is how long Close waits for the server's reply.
	CloseGrace time.Duration
	// Farewell, if set, is the data frame Close writes to end the
	// protocol's stream (XMPP's <close/>) in place of a WebSocket close
	// frame; the server then closes the WebSocket itself.
	Farewell []byte
	// TextOnly refuses binary frames: a protocol of text frames ends
	// the session on one (ErrBinary) rather than read it as text.
	TextOnly bool
	// Binary writes binary data frames (the Farewell too): a protocol
	// of binary packets, as MQTT over WebSocket is.
	Binary bool
	// TLS, if set, is the client TLS configuration of wss:// (trusted
	// roots); nil verifies against the system's roots (SSL_CERT_FILE).
	// NewSettings gives it a ClientSessionCache if it has none.
	TLS *tls.Config
	// Dial, if set, opens the byte stream in place of a TCP dial over the
	// link, whose socket options then do not apply: tests point it at an
	// in-memory network (internal/memnet) so that a client and its fake
	// server run inside one synctest bubble.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	dialer websocket.Dialer
}

// Defaults of the zero Settings fields.
const (
	DefaultMaxFrame     = 64 << 10
	DefaultWriteBuffer  = 4 << 10
	DefaultDialTimeout  = 10 * time.Second
	DefaultWriteTimeout = 5 * time.Second
	DefaultHeartbeat    = 30 * time.Second
)

// NewSettings returns s with its zero fields at their defaults, ready to
// dial with.
func NewSettings(s Settings) *Settings {
	set := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&s.DialTimeout, DefaultDialTimeout)
	set(&s.WriteTimeout, DefaultWriteTimeout)
	set(&s.Heartbeat, DefaultHeartbeat)
	if s.MaxFrame <= 0 {
		s.MaxFrame = DefaultMaxFrame
	}
	if s.WriteBuffer <= 0 {
		s.WriteBuffer = DefaultWriteBuffer
	}
	s.dialer = websocket.Dialer{
		HandshakeTimeout: s.DialTimeout,
		// A small read buffer, frames read into pooled buffers (Read),
		// and a write buffer from a pool keep an idle session near
		// 10 KiB: gorilla's default 4 KiB buffers per connection would
		// double it.
		ReadBufferSize:  512,
		WriteBufferSize: s.WriteBuffer,
		WriteBufferPool: writePool(s.WriteBuffer),
	}
	if s.Subprotocol != "" {
		s.dialer.Subprotocols = []string{s.Subprotocol}
	}
	// One session cache for every connect of these Settings: without
	// one, each login is a full handshake and a reconnect storm costs
	// the target a full key exchange per session.
	tc := &tls.Config{}
	if s.TLS != nil {
		tc = s.TLS.Clone()
	}
	if tc.ClientSessionCache == nil {
		tc.ClientSessionCache = tls.NewLRUClientSessionCache(sessionCacheSize)
	}
	s.TLS = tc
	s.dialer.TLSClientConfig = tc
	return &s
}

// At returns a copy of s that dials u instead: a protocol whose login is
// in the URL (OpenIM's user and token) dials each session at its own. The
// copy shares s's TLS session cache and buffer pool.
func (s *Settings) At(u string) *Settings {
	c := *s
	c.URL = u
	return &c
}

// dataType is the WebSocket message type of the data frames written.
func (s *Settings) dataType() int {
	if s.Binary {
		return websocket.BinaryMessage
	}
	return websocket.TextMessage
}

// IdleFor is how long a session that keeps alive every heartbeat may read
// nothing before it is dead: two missed heartbeats and a margin, as the
// server answers every ping.
func IdleFor(heartbeat time.Duration) time.Duration { return 2*heartbeat + 5*time.Second }

// writePools holds one pool per write buffer size, as gorilla asks.
var (
	writePoolsMu sync.Mutex
	writePools   = map[int]*sync.Pool{}
)

func writePool(size int) *sync.Pool {
	writePoolsMu.Lock()
	defer writePoolsMu.Unlock()
	p := writePools[size]
	if p == nil {
		p = &sync.Pool{}
		writePools[size] = p
	}
	return p
}

// Conn is one session's connection: the socket and its read loop, the
// keepalive and idle deadline, serialised writes, the close handshake and
// the classing of how the session ended. An adapter is the protocol: it
// encodes what it writes, decodes each frame Serve hands it (Protocol) and
// keeps its protocol's state; it never touches the socket.
//
// Serve runs on the goroutine that owns the session; Write, Ping and Close
// may be called from others, concurrently with Serve and each other.
type Conn struct {
	ws    *websocket.Conn
	stamp Stamper
	s     *Settings
	// poller watches the connection once Watch is called; watching is
	// the watch from then on.
	poller   *netpoll.Poller
	watching atomic.Pointer[watch]
	// wmu serialises data frames: gorilla allows one writer at a time.
	// Pings and close frames use WriteControl, which it allows beside.
	wmu sync.Mutex
	// guard orders read-deadline changes against Close.
	guard Closer
	// idle is the read deadline Serve keeps; SetIdle shortens it.
	idle time.Duration
}

// Dial opens a connection to s.URL over link. Its errors are classed for
// probe.FailureReason and name the URL without anything secret it holds.
func Dial(ctx context.Context, s *Settings, link probe.Link) (*Conn, error) {
	d := s.dialer
	var framed int64
	wss := strings.HasPrefix(s.URL, "wss://")
	if link.Poller != nil && s.Dial == nil && (wss || strings.HasPrefix(s.URL, "ws://")) {
		// A connection a Poller can watch once it is logged in.
		// wsframe hands gorilla one frame at a time, so gorilla's own
		// read buffer need hold no more than a frame header's worth.
		framed = s.MaxFrame
		d.ReadBufferSize = 128
	}
	d.NetDialContext = netDialer(link, framed, nil)
	if framed > 0 && wss {
		// TLS inside wsframe, where Ready can see the frames it
		// decrypts: the handshake is made in the dial, not by gorilla.
		d.NetDialTLSContext = netDialer(link, framed, s.TLS)
	}
	if s.Dial != nil {
		d.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := s.Dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &StampConn{Conn: c}, nil
		}
	}
	var tr *connectTrace
	if link.Connect != nil {
		tr = &connectTrace{start: time.Now()}
		ctx = httptrace.WithClientTrace(ctx, tr.hooks())
	}
	ws, err := dial(ctx, &d, s.URL, s.Header)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		tr.record(link.Connect, time.Now())
	}
	if s.Subprotocol != "" && ws.Subprotocol() != s.Subprotocol {
		ws.Close()
		return nil, fmt.Errorf("dial %s: server chose subprotocol %q, want %s", probe.RedactURL(s.URL), ws.Subprotocol(), s.Subprotocol)
	}
	ws.SetReadLimit(s.MaxFrame)
	c := &Conn{ws: ws, stamp: StampOf(ws), s: s, idle: IdleFor(s.Heartbeat), poller: link.Poller}
	if fc, ok := ws.NetConn().(*wsframe.Conn); ok {
		// A write that failed after Write returned (see wsframe): the
		// socket is closed as after any failed write, and the read that
		// then fails ends the session.
		fc.SetOnWriteError(func(error) { ws.NetConn().Close(); c.wake() })
	}
	return c, nil
}

// Open dials a connection for user over link and runs login on it, the
// two within s.DialTimeout: a session that is logged in, or an error that says
// which step failed ("login USER: …") and leaves nothing open. login runs
// the protocol's login exchange with c.Write and c.Read; a ctx that ends
// meanwhile interrupts it.
func Open(ctx context.Context, s *Settings, link probe.Link, user string, login func(c *Conn) error) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.DialTimeout)
	defer cancel()
	c, err := Dial(ctx, s, link)
	if err != nil {
		return nil, err
	}
	stop := c.Interrupt(ctx)
	began := time.Now()
	err = login(c)
	// stop reports false if ctx ended meanwhile: the connection is closed
	// then, even if the login got through.
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Abort()
		switch {
		case ctx.Err() != nil:
			// The deadline or the caller's end is the cause, whatever
			// the read said when the socket closed under it.
			err = ctx.Err()
		case isTimeout(err):
			// A login read's own deadline, which is the login's
			// timeout reached a moment before ctx's. gorilla hides
			// the net package's error behind one of its own that
			// says only Timeout, so errors.Is cannot see it.
			err = context.DeadlineExceeded
		}
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	if link.Connect != nil {
		link.Connect.Phase[metrics.Login].Observe(time.Since(began).Seconds())
	}
	return c, nil
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// dial opens a WebSocket and classes its errors: an upgrade answered with
// another status than 101 is probe.HandshakeStatus; a network or TLS
// error keeps its type under the wrapping.
func dial(ctx context.Context, d *websocket.Dialer, url string, header http.Header) (*websocket.Conn, error) {
	ws, resp, err := d.DialContext(ctx, url, header)
	if err == nil {
		return ws, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		return nil, fmt.Errorf("dial %s: %w", probe.RedactURL(url), probe.HandshakeStatus(resp.StatusCode, resp.Status))
	}
	return nil, fmt.Errorf("dial %s: %w", probe.RedactURL(url), err)
}

// Interrupt closes the socket if ctx ends before stop is called: a login
// exchange reads and writes without a context of its own. stop reports
// false if ctx ended first, and the connection is then closed.
func (c *Conn) Interrupt(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.ws.NetConn().Close(); c.wake() })
}

// Abort closes the socket at once, without a close handshake: a failed
// login, or a provisioning connection done with.
func (c *Conn) Abort() {
	c.ws.Close()
	c.wake()
}

// Read reads the next data frame, waiting at most timeout: the login
// exchange's read, before Serve. The bytes are in a pooled buffer, to be
// given back with Release; at is when they came off the socket.
func (c *Conn) Read(timeout time.Duration) (bp *[]byte, at int64, err error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(timeout))
	bp, err = c.read()
	if err != nil {
		return nil, 0, err
	}
	return bp, c.stamp.Last(), nil
}

// Write writes b as one data frame, text unless Settings.Binary. A failed write ends the session (see
// Fail): gorilla keeps a write error for good.
func (c *Conn) Write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(b)
}

// WriteWith runs f with the write lock held, handing it the writer of data
// frames: a protocol whose frames must be counted in the order written
// (XMPP stream management) counts and writes under one lock.
func (c *Conn) WriteWith(f func(write func([]byte) error) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return f(c.writeLocked)
}

// WriteText writes b as one text frame, whatever Settings.Binary says: a
// protocol of binary requests whose keepalive is text (OpenIM's
// {"type":"ping"}).
func (c *Conn) WriteText(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(c.s.WriteTimeout))
	return c.fail(c.ws.WriteMessage(websocket.TextMessage, b))
}

func (c *Conn) writeLocked(b []byte) error {
	_ = c.ws.SetWriteDeadline(time.Now().Add(c.s.WriteTimeout))
	return c.fail(c.ws.WriteMessage(c.s.dataType(), b))
}

// fail is Fail, and has a watch look at the socket it closed: no read
// waits on it to fail in the watch's place.
func (c *Conn) fail(err error) error {
	if err != nil {
		err = Fail(c.ws, err)
		c.wake()
	}
	return err
}

// Ping sends a WebSocket ping; the pong extends the idle deadline. It is
// written as a message under the write lock, not with WriteControl, which
// allocates a frame buffer and a timer at each call: at a heartbeat per
// session, most of an idle prober's garbage.
func (c *Conn) Ping() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(c.s.WriteTimeout))
	return c.fail(c.ws.WriteMessage(websocket.PingMessage, nil))
}

// Closing reports whether Close has been called.
func (c *Conn) Closing() bool { return c.guard.Closing() }

// Close ends the session cleanly: the protocol's Farewell or a WebSocket
// normal-closure frame, then a wait of at most CloseGrace for the server's
// reply, which Serve reads before it returns with reason shutdown. It is
// idempotent, and safe beside Serve and writers.
func (c *Conn) Close() error {
	grace := c.s.CloseGrace
	if !c.guard.Begin(c.ws, grace) {
		return nil
	}
	if w := c.watching.Load(); w != nil {
		// No read waits on the deadline Begin set: the watch's must
		// come at it.
		w.closeBy(grace)
	}
	if c.s.Farewell == nil {
		return CloseFrame(c.ws, grace)
	}
	// The farewell is a data frame and needs the write lock. A write in
	// progress ends within microseconds and is waited for; a sender stuck
	// on a full socket holds the lock for up to WriteTimeout, and rather
	// than wait for it, close at the WebSocket level.
	for wait := time.Now().Add(grace / 10); !c.wmu.TryLock(); time.Sleep(time.Millisecond) {
		if time.Now().After(wait) {
			return CloseFrame(c.ws, grace)
		}
	}
	_ = c.ws.SetWriteDeadline(time.Now().Add(grace))
	err := c.ws.WriteMessage(c.s.dataType(), c.s.Farewell)
	c.wmu.Unlock()
	if err == nil {
		return nil
	}
	return CloseFrame(c.ws, grace)
}

// SetIdle changes the read deadline Serve keeps between frames, from the
// next frame on: a protocol whose server has ended its stream waits only
// for the WebSocket close. It is for Protocol.Frame, on Serve's goroutine.
func (c *Conn) SetIdle(d time.Duration) { c.idle = d }

// Protocol is what an adapter does with what its connection reads. Both
// methods run on Serve's goroutine.
type Protocol interface {
	// Frame handles one data frame. b aliases the read buffer and is
	// valid only during the call; at is when its last byte came off the
	// socket (Unix ns), for probe.Delivery.At. An error ends the session:
	// a *probe.Disconnect as it is, anything else as a frame the adapter
	// could not read (see Conn.Failed).
	Frame(b []byte, at int64) error
	// Ended classes the read error that ended a session imcanary did not
	// close: a *websocket.CloseError for a close frame from the server,
	// any other error for a connection that failed. Most adapters return
	// Ended(err, theirCloseReasons).
	Ended(err error) *probe.Disconnect
}

// Serve reads frames until the session ends, handing each to p, and
// returns why it ended, always as a *probe.Disconnect. It closes the
// socket before it returns.
func (c *Conn) Serve(p Protocol) error {
	defer c.ws.Close()
	c.ws.SetPongHandler(func(string) error { return c.guard.Extend(c.ws, c.idle) })
	for {
		_ = c.guard.Extend(c.ws, c.idle)
		bp, err := c.read()
		if errors.Is(err, ErrBinary) {
			return c.Failed(err)
		}
		if err != nil {
			if c.guard.Closing() {
				return &probe.Disconnect{Reason: metrics.ReasonShutdown, Err: ignoreClosed(err)}
			}
			return p.Ended(err)
		}
		err = p.Frame(*bp, c.stamp.Last())
		Release(bp)
		if err != nil {
			return c.Failed(err)
		}
	}
}

// ErrBinary is the error of a binary frame on a connection of text frames
// (Settings.TextOnly).
var ErrBinary = errors.New("binary frame: this protocol reads text frames only")

// read reads the next data frame, refusing a binary one if TextOnly.
func (c *Conn) read() (*[]byte, error) {
	bp, typ, err := ReadType(c.ws)
	if err == nil && c.s.TextOnly && typ == websocket.BinaryMessage {
		Release(bp)
		return nil, ErrBinary
	}
	return bp, err
}

// Failed turns the error of a frame the adapter handled into why the
// session ends: our own close if it is closing, a *probe.Disconnect as it
// is, and anything else a frame it could not read, which might have been a
// delivery, so the session ends (with close 1003) rather than skip it
// silently. An adapter that handles frames kept from its login, before
// Serve, ends the session with it too.
func (c *Conn) Failed(err error) error {
	if c.guard.Closing() {
		return &probe.Disconnect{Reason: metrics.ReasonShutdown, Err: err}
	}
	if d, ok := errors.AsType[*probe.Disconnect](err); ok {
		return d
	}
	_ = c.ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseUnsupportedData, "malformed frame"),
		time.Now().Add(c.s.CloseGrace))
	return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("malformed frame from server: %w", err)}
}

// Ended classes the read error of a session imcanary did not close as
// most protocols need: no close frame (gorilla's 1006) is a network
// error; a close frame is what closeReason says of its code (a protocol's
// slow-consumer close), else server_close; anything else is an error.
// closeReason may be nil.
func Ended(err error, closeReason func(code int, text string) *probe.Disconnect) *probe.Disconnect {
	ce, ok := errors.AsType[*websocket.CloseError](err)
	switch {
	case ok && ce.Code == websocket.CloseAbnormalClosure:
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
	case ok && closeReason != nil:
		if d := closeReason(ce.Code, ce.Text); d != nil {
			return d
		}
		fallthrough
	case ok:
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: ce.Code, Text: ce.Text}
	}
	return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
}

// ignoreClosed drops the errors a clean shutdown produces.
func ignoreClosed(err error) error {
	if ce, ok := errors.AsType[*websocket.CloseError](err); ok && ce.Code == websocket.CloseNormalClosure || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
