// Package reference is the probe driver for the protocol of imcanary's own
// reference server (package refserver): JSON frames over WebSocket, a
// token login, acks carrying a server id and a per-conversation sequence.
package reference

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsframe"
	"github.com/imcanary/imcanary/refserver"
)

var _ probe.Driver = (*Driver)(nil)

// Options configures the driver.
type Options struct {
	// URL is the target's WebSocket endpoint, ws://host:port/ws.
	URL string
	// Header is sent with every WebSocket upgrade: imcanary's User-Agent
	// and the configured target.headers. It is not modified.
	Header http.Header
	// Secret signs login tokens; nil logs in with a placeholder token,
	// which only a target without a secret accepts.
	Secret []byte
	// Heartbeat is the session's ping interval; a session that reads
	// nothing for two of them and a margin is declared dead.
	Heartbeat time.Duration
	// DialTimeout bounds connect and login together. Default 10s.
	DialTimeout time.Duration
	// MaxFrame bounds one received frame. Default 64 KiB.
	MaxFrame int64
	// WriteTimeout bounds one write. Default 5s: a target that stops
	// reading must not block the sender, which serves other users too,
	// for longer.
	WriteTimeout time.Duration
}

// Driver connects users to a reference server.
type Driver struct {
	opts   Options
	dialer *websocket.Dialer

	mu sync.Mutex
	// groupsOf maps a user to the groups it belongs to, so that each login
	// re-creates them: a restarted target has forgotten its groups, and
	// idempotent re-creation heals that without a provisioning pass.
	groupsOf map[string][]probe.Group
}

// closeGrace is how long Close waits for the target's close reply.
const closeGrace = time.Second

// New returns a driver for the target at o.URL.
func New(o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("embedded: no target url")
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 30 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = 64 << 10
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	return &Driver{
		opts: o,
		dialer: &websocket.Dialer{
			HandshakeTimeout: o.DialTimeout,
			// Small read buffers and a shared write pool keep an idle
			// session near 10 KiB: the default 4 KiB buffers per
			// connection would double it. Writes are staged in a pooled
			// 4 KiB buffer, so most messages still go out as one frame.
			ReadBufferSize:  512,
			WriteBufferSize: 4096,
			WriteBufferPool: writePool,
			// Stamps each read, for Delivery.At.
			NetDialContext: wsframe.NetDialContext,
		},
		groupsOf: map[string][]probe.Group{},
	}, nil
}

var writePool = &sync.Pool{}

// Provision implements probe.Driver. Users need no provisioning: the target
// creates a user at its first login. Groups are created through a
// short-lived session of a provisioning user, and again at each member's
// login.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	// Several populations (background, canary, soak) share the driver,
	// each with users of its own prefix: a plan replaces only its own
	// users' groups.
	groupsOf := make(map[string][]probe.Group)
	for _, g := range plan.Groups {
		for _, m := range g.Members {
			groupsOf[m] = append(groupsOf[m], g)
		}
	}
	d.mu.Lock()
	for _, u := range plan.Users {
		delete(d.groupsOf, u)
	}
	maps.Copy(d.groupsOf, groupsOf)
	d.mu.Unlock()
	if len(plan.Groups) == 0 {
		return nil
	}
	// The provisioner's name derives from the plan's first group so that
	// it never collides with a user of the population: a second login of a
	// population user would kick its real session.
	s, err := d.connect(ctx, plan.Groups[0].Name+"-provisioner", nil)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	// Shutdown must not wait for a target that stopped answering.
	stop := context.AfterFunc(ctx, func() { s.conn.NetConn().Close() })
	defer stop()
	defer s.conn.Close()
	// Keep a bounded window of requests in flight: writing thousands of
	// groups before reading a reply would fill the target's send queue
	// with our own oks and get the provisioner kicked as a slow reader.
	const window = 8
	var f frame
	readOK := func() error {
		_ = s.conn.SetReadDeadline(time.Now().Add(d.opts.DialTimeout))
		buf, err := wsframe.Read(s.conn)
		if err != nil {
			return err
		}
		defer wsframe.Release(buf)
		if err := parseFrame(*buf, &f); err != nil {
			return err
		}
		switch string(f.typ) {
		case "ok":
			return nil
		case "error":
			return fmt.Errorf("target refused group request %s: %s: %s", f.id, f.code, f.message)
		}
		return fmt.Errorf("unexpected reply type %q", f.typ)
	}
	inflight := 0
	for i, g := range plan.Groups {
		if err := s.writeGroup(g, "p"+strconv.Itoa(i)); err != nil {
			return fmt.Errorf("provision group %s: %w", g.Name, err)
		}
		if inflight++; inflight == window {
			if err := readOK(); err != nil {
				return fmt.Errorf("provision: %w", err)
			}
			inflight--
		}
	}
	// Provisioning is done only once the target has confirmed every group.
	for ; inflight > 0; inflight-- {
		if err := readOK(); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	return nil
}

// Connect implements probe.Driver.
func (d *Driver) Connect(ctx context.Context, user string) (probe.Session, error) {
	d.mu.Lock()
	groups := d.groupsOf[user]
	d.mu.Unlock()
	s, err := d.connect(ctx, user, groups)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (d *Driver) connect(ctx context.Context, user string, groups []probe.Group) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.DialTimeout)
	defer cancel()
	conn, err := wsframe.Dial(ctx, d.dialer, d.opts.URL, d.opts.Header)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(d.opts.MaxFrame)
	s := &session{d: d, conn: conn, stamp: wsframe.StampOf(conn)}
	// Interrupt the login exchange if ctx ends; the net.Conn is closed
	// below on every failure path.
	stop := context.AfterFunc(ctx, func() { conn.NetConn().Close() })
	err = s.login(user)
	for i := 0; err == nil && i < len(groups); i++ {
		if err = s.writeGroup(groups[i], "g"+strconv.Itoa(i)); err != nil {
			err = fmt.Errorf("group %s: %w", groups[i].Name, err)
		}
	}
	// stop reports false if ctx ended meanwhile: the connection is closed
	// then, even if the login got through.
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("login %s: %w", user, ctx.Err())
		}
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	return s, nil
}

// session is one logged-in connection.
type session struct {
	d    *Driver
	conn *websocket.Conn
	// stamp tells when the frame just read came off the socket.
	stamp *wsframe.StampConn
	// wmu serialises writers: the sender and the login path. Pings and
	// closes use WriteControl, which gorilla allows concurrently.
	wmu sync.Mutex
	// guard orders read-deadline changes against Close.
	guard wsframe.Closer
}

func (s *session) login(user string) error {
	token := "open"
	if s.d.opts.Secret != nil {
		token = refserver.Token(s.d.opts.Secret, user)
	}
	b := append([]byte(`{"type":"login","id":"login","user":`), quote(user)...)
	b = append(b, `,"token":`...)
	b = append(b, quote(token)...)
	b = append(b, '}')
	if err := s.write(b); err != nil {
		return err
	}
	_ = s.conn.SetReadDeadline(time.Now().Add(s.d.opts.DialTimeout))
	buf, err := wsframe.Read(s.conn)
	if err != nil {
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code == refserver.CloseUnauthorized {
			return probe.Unauthorized(fmt.Errorf("the target closed the login with %d %q", ce.Code, ce.Text))
		}
		return err
	}
	defer wsframe.Release(buf)
	var f frame
	if err := parseFrame(*buf, &f); err != nil {
		return fmt.Errorf("malformed login reply: %w", err)
	}
	switch string(f.typ) {
	case "login_ok":
		return nil
	case "error":
		return fmt.Errorf("login refused: %s: %s", f.code, f.message)
	}
	return fmt.Errorf("unexpected login reply type %q", f.typ)
}

func (s *session) writeGroup(g probe.Group, id string) error {
	b := append([]byte(`{"type":"group","id":`), quote(id)...)
	b = append(b, `,"group":`...)
	b = append(b, quote(g.Name)...)
	b = append(b, `,"members":[`...)
	for i, m := range g.Members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, quote(m)...)
	}
	b = append(b, "]}"...)
	return s.write(b)
}

func (s *session) write(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.d.opts.WriteTimeout))
	return wsframe.Fail(s.conn, s.conn.WriteMessage(websocket.TextMessage, b))
}

// sendPool holds encoded send frames between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Send implements probe.Session.
func (s *session) Send(m *probe.Message) error {
	bp := sendPool.Get().(*[]byte)
	b := append((*bp)[:0], `{"type":"send","id":"`...)
	b = strconv.AppendUint(b, m.Ref, 10)
	if m.Group != "" {
		b = append(b, `","group":`...)
		b = appendQuote(b, m.Group)
	} else {
		b = append(b, `","to":`...)
		b = appendQuote(b, m.To)
	}
	b = append(b, `,"body":`...)
	b = appendQuoteBytes(b, m.Body)
	b = append(b, '}')
	err := s.write(b)
	*bp = b
	sendPool.Put(bp)
	return err
}

// Ping implements probe.Session.
func (s *session) Ping() error {
	return wsframe.Fail(s.conn, s.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.d.opts.WriteTimeout)))
}

// Close implements probe.Session: a normal-closure frame, then a bounded wait
// for the target's reply, which Serve reads.
func (s *session) Close() error {
	if !s.guard.Begin(s.conn, closeGrace) {
		return nil
	}
	return wsframe.CloseFrame(s.conn, closeGrace)
}

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error {
	defer s.conn.Close()
	var f frame
	d := new(probe.Delivery)
	// Two missed heartbeats and a margin: the target answers every ping,
	// so silence that long means the connection is dead.
	idle := 2*s.d.opts.Heartbeat + 5*time.Second
	s.conn.SetPongHandler(func(string) error { return s.guard.Extend(s.conn, idle) })
	for {
		_ = s.guard.Extend(s.conn, idle)
		bp, err := wsframe.Read(s.conn)
		if err != nil {
			return s.classify(err)
		}
		at := s.stamp.Last()
		if err := parseFrame(*bp, &f); err != nil {
			wsframe.Release(bp)
			// A frame we cannot read might have been a delivery: end
			// the session rather than silently skip it.
			_ = s.conn.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseUnsupportedData, "malformed frame"),
				time.Now().Add(closeGrace))
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("malformed frame from target: %w", err)}
		}
		switch string(f.typ) {
		case "msg":
			d.From, d.Group, d.Body, d.ServerSeq, d.At = f.from, len(f.group) > 0, f.body, f.seq, at
			h.OnDelivery(d)
		case "ack":
			if ref, ok := parseRef(f.id); ok {
				h.OnAck(ref, probe.Ack{ServerID: f.msgID, Seq: f.seq})
			}
		case "error":
			if ref, ok := parseRef(f.id); ok {
				h.OnReject(ref, string(f.code))
			}
		}
		wsframe.Release(bp)
	}
}

// classify turns a read error into a Disconnect with its reason.
func (s *session) classify(err error) error {
	var ce *websocket.CloseError
	switch {
	case s.guard.Closing():
		return &probe.Disconnect{Reason: metrics.ReasonShutdown, Err: ignoreClosed(err)}
	case errors.As(err, &ce) && ce.Code == websocket.CloseAbnormalClosure:
		// 1006 is gorilla's name for a connection that ended without a
		// close frame: the network failed, the server did not close.
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
	case errors.As(err, &ce) && ce.Code == refserver.CloseSlowConsumer:
		return &probe.Disconnect{Reason: metrics.ReasonSlowConsumer, Code: ce.Code, Text: ce.Text}
	case errors.As(err, &ce):
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: ce.Code, Text: ce.Text}
	}
	return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
}

// ignoreClosed drops the errors a clean shutdown produces.
func ignoreClosed(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code == websocket.CloseNormalClosure || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// parseRef parses the decimal id the sender put on a send frame. Other ids
// (login, group) are not refs.
func parseRef(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	return n, err == nil
}

func quote(s string) []byte { return appendQuote(nil, s) }

func appendQuote(b []byte, s string) []byte {
	return appendQuoteBytes(b, []byte(s))
}

// appendQuoteBytes appends s as a JSON string. Probe bodies and names are
// plain ASCII, so the loop rarely escapes anything; it still escapes
// correctly whatever it is given.
func appendQuoteBytes(b, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
