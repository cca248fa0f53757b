// Package centrifugo is the probe driver for Centrifugo v6's bidirectional
// WebSocket protocol with JSON encoding: an HS256 token login, channels
// subscribed by the client, publications acknowledged by a reply to the
// publish command, and per-channel offsets and epochs as the server's own
// sequence.
//
// Groups are channels of the group namespace (chat:GROUP); direct messages
// go over user-limited channels of the direct namespace (dm:#alice,bob,
// the two users sorted), which only the users named after the '#' may
// subscribe to. Centrifugo delivers a publication to every subscriber, the
// publisher included: a session skips its own.
package centrifugo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var _ probe.Driver = (*Driver)(nil)

// Options configures the driver.
type Options struct {
	// URL is Centrifugo's WebSocket endpoint,
	// ws://127.0.0.1:8000/connection/websocket.
	URL string
	// Header is sent with every WebSocket upgrade: imcanary's User-Agent
	// and the configured target.headers. It is not modified.
	Header http.Header
	// Secret is the HMAC key of client.token.hmac_secret_key that signs
	// connection tokens (HS256). It is never logged.
	Secret []byte
	// GroupNamespace holds group channels. Default "chat".
	GroupNamespace string
	// DirectNamespace holds the user-limited channels of direct
	// messages; it needs allow_user_limited_channels and
	// allow_publish_for_subscriber. Default "dm".
	DirectNamespace string
	// TokenTTL is the lifetime of a connection token. Sessions refresh
	// their token at half of it. Default 1h.
	TokenTTL time.Duration
	// Heartbeat is the session's WebSocket ping interval; a session that
	// reads nothing for two of them (or two server pings) and a margin is
	// declared dead. Default 30s.
	Heartbeat time.Duration
	// DialTimeout bounds connect, login and the subscriptions together.
	// Default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write. Default 5s: a server that stops
	// reading must not block the sender, which serves other users too,
	// for longer.
	WriteTimeout time.Duration
	// Recover asks Centrifugo, when a user subscribes again after a
	// disconnect, for the publications it missed meanwhile (the
	// namespaces need history and allow_recovery). They arrive with
	// their original intended send time, so the ledger counts them late
	// rather than lost.
	Recover bool
	// MaxFrame bounds one received frame. Default 4 MiB: a subscribe
	// reply recovers up to 300 publications in one frame.
	MaxFrame int64
	// Logger receives debug logs of the server's own gaps; nil discards.
	Logger *slog.Logger
}

// Driver connects users to a Centrifugo server.
type Driver struct {
	opts Options
	log  *slog.Logger
	// conn is what every session's connection shares.
	conn *wsconn.Settings
	// groupPrefix is "chat:", what a group channel starts with.
	groupPrefix []byte

	mu sync.Mutex
	// chans maps a user to the channels it subscribes to: its groups'
	// and its direct conversations', both those it sends on and those it
	// receives on (a user-limited channel is published to only by a
	// subscriber).
	chans map[string][]string
	// state maps a user to the stream positions its sessions reached. It
	// outlives sessions, so that a reconnect can tell, from the offsets,
	// what the server published while the user was away.
	state map[string]*userState

	gaps, missed, recovered atomic.Uint64
}

// userState is one user's position in each of its channels.
type userState struct {
	mu  sync.Mutex
	pos map[string]*position
}

// position is the last offset a user's session saw in a channel, within
// the channel's epoch. known is false until a subscription told the epoch.
type position struct {
	offset uint64
	epoch  string
	known  bool
	// recovered is the highest offset a recovery delivered: the live
	// stream may bring those again, and they are not new deliveries.
	recovered uint64
}

// closeGrace is how long Close waits for the server's close reply.
const closeGrace = time.Second

// New returns a driver for the server at o.URL.
func New(o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("centrifugo: no url")
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("centrifugo: no token secret")
	}
	if o.GroupNamespace == "" {
		o.GroupNamespace = "chat"
	}
	if o.DirectNamespace == "" {
		o.DirectNamespace = "dm"
	}
	for _, ns := range []string{o.GroupNamespace, o.DirectNamespace} {
		if strings.ContainsAny(ns, ":#,") {
			return nil, fmt.Errorf("centrifugo: namespace %q: must not contain ':', '#' or ','", ns)
		}
	}
	if o.GroupNamespace == o.DirectNamespace {
		return nil, fmt.Errorf("centrifugo: group and direct namespace are both %q", o.GroupNamespace)
	}
	if o.TokenTTL <= 0 {
		o.TokenTTL = time.Hour
	}
	if o.TokenTTL < 2*time.Second {
		return nil, fmt.Errorf("centrifugo: token ttl %v: must be at least 2s", o.TokenTTL)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 30 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = 4 << 20
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{
		opts: o,
		log:  log,
		conn: &wsconn.Settings{
			Dialer: &websocket.Dialer{
				HandshakeTimeout: o.DialTimeout,
				// Small read buffers and a shared write pool keep an
				// idle session small, as in probe/reference.
				ReadBufferSize:  512,
				WriteBufferSize: 4096,
				WriteBufferPool: writePool,
			},
			URL: o.URL, Header: o.Header, MaxFrame: o.MaxFrame, WriteTimeout: o.WriteTimeout,
			// Two missed heartbeats and a margin; the login raises it
			// to two of the server's pings when those are slower
			// (session.connected).
			Idle:       2*o.Heartbeat + 5*time.Second,
			CloseGrace: closeGrace,
		},
		groupPrefix: []byte(o.GroupNamespace + ":"),
		chans:       map[string][]string{},
		state:       map[string]*userState{},
	}, nil
}

// ServerStats counts what Centrifugo's own stream positions revealed to
// this driver's sessions. The ledger, which checks imcanary's own sequence,
// stays the source of truth for loss: these counts say whether the server
// knew.
type ServerStats struct {
	// Gaps counts events: an offset that jumped, an epoch that changed
	// (the stream was lost, as at a restart of a memory engine), or a
	// close for insufficient state.
	Gaps uint64
	// Missed counts the publications the offsets skipped, on channels
	// whose epoch held. A session's own publications are included: the
	// offsets number every publication of a channel.
	Missed uint64
	// Recovered counts publications received through recovery on a
	// resubscribe.
	Recovered uint64
}

// ServerStats returns the driver's counts so far.
func (d *Driver) ServerStats() ServerStats {
	return ServerStats{Gaps: d.gaps.Load(), Missed: d.missed.Load(), Recovered: d.recovered.Load()}
}

// ServerGaps returns how many gaps the server's own numbering revealed:
// see ServerStats.Gaps.
func (d *Driver) ServerGaps() uint64 { return d.gaps.Load() }

// GroupChannel returns the channel of group g.
func (d *Driver) GroupChannel(g string) string { return d.opts.GroupNamespace + ":" + g }

// DirectChannel returns the user-limited channel of the direct
// conversation between a and b, in either direction.
func (d *Driver) DirectChannel(a, b string) string {
	return string(d.appendDirect(nil, a, b))
}

func (d *Driver) appendDirect(dst []byte, a, b string) []byte {
	if b < a {
		a, b = b, a
	}
	dst = append(dst, d.opts.DirectNamespace...)
	dst = append(dst, ":#"...)
	dst = append(dst, a...)
	dst = append(dst, ',')
	return append(dst, b...)
}

var writePool = &sync.Pool{}

// Provision implements probe.Driver. Centrifugo creates channels on first
// use and users are whoever holds a token, so nothing is created on the
// server: the plan only says which channels each user subscribes to.
func (d *Driver) Provision(_ context.Context, plan probe.Plan) error {
	set := make(map[string]map[string]bool)
	add := func(u, ch string) {
		if set[u] == nil {
			set[u] = map[string]bool{}
		}
		set[u][ch] = true
	}
	for _, g := range plan.Groups {
		for _, m := range g.Members {
			add(m, d.GroupChannel(g.Name))
		}
	}
	for _, p := range plan.Direct {
		// The user-limited part of a channel lists users separated by
		// ',' after the last '#': a name holding either would name
		// other users.
		for _, u := range []string{p.From, p.To} {
			if strings.ContainsAny(u, "#,") {
				return fmt.Errorf("provision: user %q: a name in a user-limited channel must not contain '#' or ','", u)
			}
		}
		ch := d.DirectChannel(p.From, p.To)
		add(p.From, ch)
		add(p.To, ch)
	}
	// Several populations (background, canary, soak) share the driver,
	// each with users of its own prefix: a plan replaces only its own
	// users' channels.
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, u := range plan.Users {
		delete(d.chans, u)
	}
	for u, chs := range set {
		d.chans[u] = slices.Sorted(maps.Keys(chs))
	}
	return nil
}

// Connect implements probe.Driver: it logs user in and subscribes to the
// user's channels, and returns once every subscription is confirmed, so
// that a user counted online receives what is sent to it.
func (d *Driver) Connect(ctx context.Context, user string, link probe.Link) (probe.Session, error) {
	d.mu.Lock()
	chans := d.chans[user]
	st := d.state[user]
	if st == nil {
		st = &userState{pos: map[string]*position{}}
		d.state[user] = st
	}
	d.mu.Unlock()
	s, err := d.connect(ctx, user, chans, st, link)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// token returns a connection token for user.
func (d *Driver) token(user string) (string, error) {
	now := time.Now()
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   user,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(d.opts.TokenTTL)),
	})
	s, err := t.SignedString(d.opts.Secret)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

func (d *Driver) connect(ctx context.Context, user string, chans []string, st *userState, link probe.Link) (*session, error) {
	s := &session{d: d, user: user, userB: []byte(user), st: st}
	_, err := wsconn.Open(ctx, d.conn, link, d.opts.DialTimeout, user, func(c *wsconn.Conn) error {
		s.conn = c
		return s.handshake(chans)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// session is one logged-in connection.
type session struct {
	d     *Driver
	conn  *wsconn.Conn
	user  string
	userB []byte
	st    *userState
	// h is the handler of Serve's frames.
	h probe.Handler

	ids atomic.Uint32
	// pmu guards the commands awaiting a reply: publishes (id to the
	// caller's ref) and resubscribes (id to channel).
	pmu  sync.Mutex
	acks map[uint32]uint64
	subs map[uint32]string

	// Owned by the goroutine that runs the handshake, then by Serve.
	early     []early
	earlySize int
	// readAt is when the frame the handshake is handling came off the
	// socket, for keepEarly.
	readAt     int64
	serverPing time.Duration
	refreshAt  int64 // Unix ns; 0 for none due
	refreshID  uint32
	// delivery is reused for every delivery; its At is the stamp of the
	// frame being handled, set when the frame is read, so that every
	// publication of a batched frame shares it.
	delivery probe.Delivery
}

// maxEarlyFactor bounds what the handshake keeps for Serve: a server that floods
// a session before it is logged in must not make it allocate without end.
const maxEarlyFactor = 4

// keepEarly keeps e for Serve, within maxEarlyFactor frames' worth. It
// stamps e with the last read, which is its frame's: the handshake handles
// each frame before it reads the next.
func (s *session) keepEarly(e early) error {
	if s.earlySize += len(e.raw); s.earlySize > maxEarlyFactor*int(s.d.opts.MaxFrame) {
		return fmt.Errorf("too much traffic during login: over %d bytes before the session was ready", maxEarlyFactor*s.d.opts.MaxFrame)
	}
	e.at = s.readAt
	s.early = append(s.early, e)
	return nil
}

// early is what arrived during the handshake, before a handler existed:
// a whole message (ch empty), or the publications a subscription
// recovered in channel ch, with the reply's epoch and offset (top), which
// the position reaches only once they are delivered. raw is a copy of the
// frame's bytes, and at its stamp (Delivery.At).
type early struct {
	ch    string
	raw   []byte
	epoch string
	top   uint64
	at    int64
}

// newID returns the next command id. Centrifugo treats a command without
// an id as a pong, so 0 is skipped when the counter wraps.
func (s *session) newID() uint32 {
	for {
		if id := s.ids.Add(1); id != 0 {
			return id
		}
	}
}

func (s *session) write(b []byte) error { return s.conn.Write(b) }

// handshake sends the connect command, then, once it is accepted, one
// subscribe per channel in a single frame, and reads until every reply is
// in. Publications that arrive meanwhile are kept for Serve.
func (s *session) handshake(chans []string) error {
	tok, err := s.d.token(s.user)
	if err != nil {
		return err
	}
	connectID := s.newID()
	b := append([]byte(`{"id":`), strconv.FormatUint(uint64(connectID), 10)...)
	b = append(b, `,"connect":{"token":`...)
	b = appendQuote(b, tok)
	b = append(b, `,"name":"imcanary"}}`...)
	if err := s.write(b); err != nil {
		return err
	}
	end := time.Now().Add(s.d.opts.DialTimeout)
	hs := loginState{connectID: connectID, chans: chans, subs: make(map[uint32]string, len(chans))}
	for !hs.connected || len(hs.subs) > 0 {
		bp, at, err := s.conn.Read(time.Until(end))
		s.readAt = at
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return loginClosed(ce.Code, fmt.Errorf("server closed the connection: %d %q", ce.Code, ce.Text))
			}
			return err
		}
		err = s.handshakeFrame(*bp, &hs)
		wsconn.Release(bp)
		if err != nil {
			return err
		}
	}
	return nil
}

// loginState is the state of a session's handshake.
type loginState struct {
	connectID uint32
	connected bool
	chans     []string
	// subs maps the ids of the subscribes awaiting their reply to their
	// channel.
	subs map[uint32]string
}

// handshakeFrame handles one frame read during the handshake.
func (s *session) handshakeFrame(frame []byte, hs *loginState) error {
	// A pristine copy: the parser unescapes in place, and what is kept
	// for Serve is parsed again there.
	raw := bytes.Clone(frame)
	var m msg
	p := parser{jsonscan.Scanner{B: frame}}
	for p.More() {
		start := p.I
		if err := p.message(&m); err != nil {
			return fmt.Errorf("malformed frame from server: %w", err)
		}
		switch {
		case m.push == pushPub || m.push == pushUnsubscribe:
			if err := s.keepEarly(early{raw: raw[start:p.I]}); err != nil {
				return err
			}
		case m.push == pushDisconnect:
			return loginClosed(int(m.code), fmt.Errorf("server disconnected: %d %q", m.code, m.reason))
		case m.push != pushNone:
		case m.id == uint64(hs.connectID):
			if m.hasErr {
				err := fmt.Errorf("connect refused: %d %s", m.errCode, m.errMsg)
				if m.errCode == errUnauthorized || m.errCode == errTokenExpired {
					err = probe.Unauthorized(err)
				}
				return err
			}
			hs.connected = true
			s.connected(&m.res)
			if err := s.subscribeAll(hs.chans, hs.subs); err != nil {
				return err
			}
		case m.id != 0 && m.id <= 1<<32-1 && hs.subs[uint32(m.id)] != "":
			ch := hs.subs[uint32(m.id)]
			delete(hs.subs, uint32(m.id))
			if m.hasErr {
				return fmt.Errorf("subscribe %s refused: %d %s", ch, m.errCode, m.errMsg)
			}
			var pubs []byte
			if m.res.pubsHi > m.res.pubsLo {
				pubs = raw[m.res.pubsLo:m.res.pubsHi]
			}
			// No handler yet: recovered publications join early.
			if err := s.subscribed(ch, &m.res, pubs, nil); err != nil {
				return err
			}
		case m.fields == 0:
			if err := s.pong(); err != nil {
				return err
			}
		}
	}
	return nil
}

// connected notes what the connect result says: the server's ping
// interval, and when the token expires.
func (s *session) connected(r *result) {
	s.serverPing = time.Duration(r.ping) * time.Second
	// Two missed heartbeats (ours, answered by WebSocket pongs, or the
	// server's pings) and a margin: silence that long means the
	// connection is dead.
	s.conn.SetIdle(max(2*s.d.opts.Heartbeat, 2*s.serverPing) + 5*time.Second)
	s.refreshAt = 0
	if r.expires && r.ttl > 0 {
		s.refreshAt = time.Now().Add(time.Duration(r.ttl) * time.Second / 2).UnixNano()
	}
}

// subscribeAll writes one subscribe per channel, in one frame, and records
// their ids in subs.
func (s *session) subscribeAll(chans []string, subs map[uint32]string) error {
	if len(chans) == 0 {
		return nil
	}
	var b []byte
	for i, ch := range chans {
		if i > 0 {
			b = append(b, '\n')
		}
		id := s.newID()
		subs[id] = ch
		b = s.appendSubscribe(b, id, ch)
	}
	return s.write(b)
}

// appendSubscribe appends a subscribe command. Every subscription asks
// for positioning, so that the reply carries the channel's epoch and
// offset; with Recover, one that has a known position also asks for what
// was published since.
func (s *session) appendSubscribe(b []byte, id uint32, ch string) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, uint64(id), 10)
	b = append(b, `,"subscribe":{"channel":`...)
	b = appendQuote(b, ch)
	b = append(b, `,"positioned":true`...)
	if s.d.opts.Recover {
		b = append(b, `,"recoverable":true`...)
		s.st.mu.Lock()
		if pos := s.st.pos[ch]; pos != nil && pos.known && pos.epoch != "" {
			b = append(b, `,"recover":true,"offset":`...)
			b = strconv.AppendUint(b, pos.offset, 10)
			b = append(b, `,"epoch":`...)
			b = appendQuote(b, pos.epoch)
		}
		s.st.mu.Unlock()
	}
	return append(b, "}}"...)
}

// subscribed takes the position a subscribe reply gives for ch, counting
// what the server published that this user's earlier sessions never saw,
// and delivers the publications it recovered (to h, or, during the
// handshake, to Serve later).
func (s *session) subscribed(ch string, r *result, pubs []byte, h probe.Handler) error {
	st := s.st
	st.mu.Lock()
	pos := st.pos[ch]
	if pos == nil {
		pos = &position{}
		st.pos[ch] = pos
	}
	var missed uint64
	gap, epochChanged := false, false
	switch {
	case !pos.known || len(r.epoch) == 0:
		// A first subscription, or one without positioning: nothing
		// was promised before.
	case string(r.epoch) != pos.epoch:
		gap, epochChanged = true, true
	case r.recovered:
		// The recovered publications continue from pos.
	case r.offset > pos.offset:
		gap, missed = true, r.offset-pos.offset
	}
	prev := pos.offset
	if len(r.epoch) > 0 {
		continues := pos.known && string(r.epoch) == pos.epoch
		if string(r.epoch) != pos.epoch {
			pos.epoch = string(r.epoch)
		}
		switch {
		case len(pubs) == 0:
			pos.offset = r.offset
		case !continues:
			// Nothing of this stream was seen yet: all it recovered
			// is ahead of the position.
			pos.offset = 0
		default:
			// The position stays at the last publication delivered
			// until deliverRecovered has handed the recovered ones
			// over: if the handshake fails, or the session ends
			// before Serve gets to them, the next subscription
			// recovers them again instead of asking from past them,
			// which would lose them with no count anywhere.
		}
		pos.known = true
	} else {
		pos.known = false
	}
	// The epoch whose position deliverRecovered moves; none without
	// positioning.
	epoch := ""
	if pos.known {
		epoch = pos.epoch
	}
	st.mu.Unlock()
	if gap {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets show publications missed while unsubscribed",
			"user", s.user, "channel", ch, "epoch_changed", epochChanged,
			"last_seen", prev, "offset", r.offset, "missed", missed, "recovering", r.wasRecov)
	}
	if len(pubs) == 0 {
		return nil
	}
	if h == nil {
		return s.keepEarly(early{ch: ch, raw: pubs, epoch: epoch, top: r.offset})
	}
	return s.deliverRecovered(ch, pubs, epoch, r.offset, h)
}

// deliverRecovered delivers the publications of a subscribe reply, then
// moves the user's position in ch up to the reply's offset top, if still
// in epoch (none: no position to move). Only once they are delivered: see
// subscribed.
func (s *session) deliverRecovered(ch string, pubs []byte, epoch string, top uint64, h probe.Handler) error {
	chb := []byte(ch)
	err := parsePubs(pubs, func(pb *pub) error {
		s.d.recovered.Add(1)
		s.onPub(chb, pb, h, true)
		return nil
	})
	if err != nil {
		return fmt.Errorf("recovered publications of %s: %w", ch, err)
	}
	if epoch == "" {
		return nil
	}
	st := s.st
	st.mu.Lock()
	if pos := st.pos[ch]; pos != nil && pos.known && pos.epoch == epoch {
		pos.offset = max(pos.offset, top)
		pos.recovered = max(pos.recovered, top)
	}
	st.mu.Unlock()
	return nil
}

// onPub tracks a publication's offset and delivers it, unless it is the
// user's own or one the user's position shows was delivered already.
// recovered says it came in a subscribe reply.
func (s *session) onPub(ch []byte, pb *pub, h probe.Handler, recovered bool) {
	if pb.offset != 0 && !s.track(ch, pb, recovered) {
		// At or below the position in the same epoch: offsets
		// number a channel's publications within an epoch, so this
		// one was delivered already, as when the live stream
		// repeats one a recovery brought. Delivered again, the
		// ledger would count it a duplicate.
		return
	}
	if bytes.Equal(pb.user, s.userB) {
		// Our own publication, echoed because we are subscribed: the
		// ledger expects a message only at its recipients.
		return
	}
	d := &s.delivery
	d.From, d.Group, d.Body, d.ServerSeq = pb.user, bytes.HasPrefix(ch, s.d.groupPrefix), pb.body, pb.offset
	h.OnDelivery(d)
}

// track advances the user's position in ch and counts a gap when the
// offsets skip or the epoch changes under a live subscription. It reports
// whether pb is fresh: false for an offset at or below a known position in
// the same epoch, a publication already delivered. The gaps of recovered
// publications are not counted here: subscribed counted them from the
// reply's offset.
func (s *session) track(ch []byte, pb *pub, recovered bool) (fresh bool) {
	st := s.st
	st.mu.Lock()
	pos := st.pos[string(ch)]
	if pos == nil || !pos.known {
		st.mu.Unlock()
		return true
	}
	prev := pos.offset
	var missed uint64
	gap := false
	fresh = true
	switch {
	case len(pb.epoch) > 0 && pos.epoch != "" && string(pb.epoch) != pos.epoch:
		gap = true
		pos.epoch, pos.offset = string(pb.epoch), pb.offset
	case pb.offset > pos.offset+1:
		gap, missed = true, pb.offset-pos.offset-1
		pos.offset = pb.offset
	case pb.offset == pos.offset+1:
		pos.offset = pb.offset
	case pb.offset <= pos.recovered:
		// A publication a recovery already delivered, which the live
		// stream also brought: the server's overlap, not a duplicate.
		fresh = false
	}
	// Any other offset at or below the position is delivered again: a
	// server that pushes the same publication twice is at fault, and the
	// ledger counts the duplicate.
	st.mu.Unlock()
	if gap && !recovered {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets skipped publications", "user", s.user, "channel", string(ch),
			"last_seen", prev, "offset", pb.offset, "missed", missed)
	}
	return fresh
}

// sendPool holds encoded publish commands between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Send implements probe.Session: a publish command whose reply, matched by
// id, is the ack. The body travels as a JSON string, data.b: Centrifugo's
// JSON protocol embeds publication data as JSON.
func (s *session) Send(m *probe.Message) error {
	id := s.newID()
	// Registered before the write: the reply can beat the write's return.
	s.pmu.Lock()
	if s.acks == nil {
		s.acks = make(map[uint32]uint64)
	}
	s.acks[id] = m.Ref
	s.pmu.Unlock()
	bp := sendPool.Get().(*[]byte)
	b := append((*bp)[:0], `{"id":`...)
	b = strconv.AppendUint(b, uint64(id), 10)
	b = append(b, `,"publish":{"channel":"`...)
	if m.Group != "" {
		b = append(b, s.d.groupPrefix...)
		b = appendEscaped(b, m.Group)
	} else {
		a, c := s.user, m.To
		if c < a {
			a, c = c, a
		}
		b = append(b, s.d.opts.DirectNamespace...)
		b = append(b, ":#"...)
		b = appendEscaped(b, a)
		b = append(b, ',')
		b = appendEscaped(b, c)
	}
	b = append(b, `","data":{"b":`...)
	b = appendQuoteBytes(b, m.Body)
	b = append(b, "}}}"...)
	err := s.write(b)
	*bp = b
	sendPool.Put(bp)
	if err != nil {
		s.pmu.Lock()
		delete(s.acks, id)
		s.pmu.Unlock()
	}
	return err
}

// Ping implements probe.Session with a WebSocket ping, which Centrifugo
// answers with a pong; the server's own application-level pings are
// answered in Serve.
func (s *session) Ping() error { return s.conn.Ping() }

// pong answers the server's ping, the empty message, with an empty
// message. Exactly one per ping: Centrifugo disconnects a client for a
// pong it did not ask for.
func (s *session) pong() error {
	return s.write([]byte("{}"))
}

// Close implements probe.Session: a normal-closure frame, then a bounded
// wait for the server's reply, which Serve reads.
func (s *session) Close() error { return s.conn.Close() }

// Serve implements probe.Session: what the login kept is handled first,
// then what the connection reads.
func (s *session) Serve(h probe.Handler) error {
	s.h = h
	for i, e := range s.early {
		s.delivery.At = e.at
		var err error
		if e.ch != "" {
			err = s.deliverRecovered(e.ch, e.raw, e.epoch, e.top, h)
		} else {
			err = s.handleFrame(e.raw, h)
		}
		if err != nil {
			s.early = nil
			err = s.conn.Failed(err)
			s.conn.Abort()
			return err
		}
		s.early[i] = early{}
	}
	s.early = nil
	return s.conn.Serve(s)
}

// Frame implements wsconn.Protocol.
func (s *session) Frame(b []byte, at int64) error {
	s.delivery.At = at
	if err := s.handleFrame(b, s.h); err != nil {
		return err
	}
	// The server pings every 25 s, so frames come often enough for this
	// check to refresh the token well before it expires.
	if s.refreshAt != 0 && time.Now().UnixNano() >= s.refreshAt {
		if err := s.refresh(); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("token refresh: %w", err)}
		}
	}
	return nil
}

// Ended implements wsconn.Protocol: Centrifugo's close codes say what a
// close means (closeReason).
func (s *session) Ended(err error) *probe.Disconnect {
	return wsconn.Ended(err, func(code int, text string) *probe.Disconnect { return closeReason(s.d, code, text) })
}

// handleFrame handles every message of a frame, and returns a
// *probe.Disconnect when the session must end.
func (s *session) handleFrame(b []byte, h probe.Handler) error {
	var m msg
	p := parser{jsonscan.Scanner{B: b}}
	for p.More() {
		if err := p.message(&m); err != nil {
			// The connection layer ends the session: a frame we
			// cannot read might have held a delivery.
			return err
		}
		var err error
		switch {
		case m.push == pushPub:
			s.onPub(m.channel, &m.pub, h, false)
		case m.push == pushUnsubscribe:
			err = s.onUnsubscribe(&m)
		case m.push == pushDisconnect:
			// Centrifugo sends disconnects over WebSocket as close
			// frames; a push is what other transports get, read the
			// same way.
			return closeReason(s.d, int(m.code), string(m.reason))
		case m.push != pushNone:
			// Join, leave and other pushes count for nothing.
		case m.id != 0:
			err = s.onReply(&m, b, h)
		case m.fields == 0:
			if err = s.pong(); err != nil {
				err = &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("pong: %w", err)}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// onReply handles the reply to a command sent from a running session: a
// publish (ack or rejection), a resubscribe or a token refresh.
func (s *session) onReply(m *msg, frame []byte, h probe.Handler) error {
	if m.id > 1<<32-1 {
		return nil
	}
	id := uint32(m.id)
	s.pmu.Lock()
	ref, isAck := s.acks[id]
	if isAck {
		delete(s.acks, id)
	}
	ch, isSub := s.subs[id]
	if isSub {
		delete(s.subs, id)
	}
	s.pmu.Unlock()
	switch {
	case isAck && m.hasErr:
		h.OnReject(ref, strconv.FormatUint(m.errCode, 10)+" "+string(m.errMsg))
	case isAck:
		h.OnAck(ref, probe.Ack{})
	case isSub && m.hasErr:
		return &probe.Disconnect{Reason: metrics.ReasonError,
			Err: fmt.Errorf("resubscribe %s refused: %d %s", ch, m.errCode, m.errMsg)}
	case isSub:
		var pubs []byte
		if m.res.pubsHi > m.res.pubsLo {
			pubs = frame[m.res.pubsLo:m.res.pubsHi]
		}
		if err := s.subscribed(ch, &m.res, pubs, h); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
		}
	case id == s.refreshID && s.refreshID != 0:
		s.refreshID = 0
		if m.hasErr {
			return &probe.Disconnect{Reason: metrics.ReasonError,
				Err: fmt.Errorf("token refresh refused: %d %s", m.errCode, m.errMsg)}
		}
		if m.res.expires && m.res.ttl > 0 {
			s.refreshAt = time.Now().Add(time.Duration(m.res.ttl) * time.Second / 2).UnixNano()
		}
	}
	return nil
}

// onUnsubscribe handles the server unsubscribing the session from a
// channel. Codes from 2500 advise resubscribing, as for insufficient state
// (2500), when the server saw this subscriber fall behind the stream: the
// session resubscribes at once, recovering if configured, and the reply
// shows what was skipped. Lower codes are final; the session ends, and the
// reconnect subscribes again.
func (s *session) onUnsubscribe(m *msg) error {
	ch := string(m.channel)
	if m.code < 2500 {
		return &probe.Disconnect{Reason: metrics.ReasonServerClose,
			Err: fmt.Errorf("unsubscribed from %s: %d %s", ch, m.code, m.reason)}
	}
	s.d.log.Debug("server unsubscribed, resubscribing", "user", s.user, "channel", ch, "code", m.code, "reason", string(m.reason))
	id := s.newID()
	s.pmu.Lock()
	if s.subs == nil {
		s.subs = make(map[uint32]string)
	}
	s.subs[id] = ch
	s.pmu.Unlock()
	if err := s.write(s.appendSubscribe(nil, id, ch)); err != nil {
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("resubscribe %s: %w", ch, err)}
	}
	return nil
}

// refresh sends a fresh token before the connection's expires.
func (s *session) refresh() error {
	tok, err := s.d.token(s.user)
	if err != nil {
		return err
	}
	s.refreshID, s.refreshAt = s.newID(), 0
	b := append([]byte(`{"id":`), strconv.FormatUint(uint64(s.refreshID), 10)...)
	b = append(b, `,"refresh":{"token":`...)
	b = appendQuote(b, tok)
	b = append(b, "}}"...)
	return s.write(b)
}

// Centrifugo's close codes that imcanary tells apart.
const (
	// CloseSlow is Centrifugo's "slow": the client's queue passed
	// client.queue_max_size.
	CloseSlow = 3008
	// CloseInsufficientState is "insufficient state": the server saw a
	// gap in a channel's stream it could not repair.
	CloseInsufficientState = 3010
)

// closeReason classifies a close (or disconnect push) the server sent.
func closeReason(d *Driver, code int, text string) *probe.Disconnect {
	switch code {
	case CloseSlow:
		return &probe.Disconnect{Reason: metrics.ReasonSlowConsumer, Code: code, Text: text}
	case CloseInsufficientState:
		d.gaps.Add(1)
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: code,
			Text: text + ": the server detected a gap in a channel stream"}
	}
	return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: code, Text: text}
}

func appendQuote(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// appendQuoteBytes appends s as a JSON string.
func appendQuoteBytes(b, s []byte) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// appendEscaped escapes s for a JSON string. Probe bodies and names are
// plain ASCII, so the loop rarely escapes anything; it still escapes
// correctly whatever it is given.
func appendEscaped[S string | []byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return b
}

// Centrifugo's codes for a client whose credentials it refuses: the
// connect reply's errors 101 (unauthorized) and 109 (token expired), and
// the close 3500 "invalid token" that v6.9.1 sends for a token signed with
// another key (TestRealWrongSecret).
const (
	errUnauthorized   = 101
	errTokenExpired   = 109
	closeInvalidToken = 3500
)

// loginClosed classes a close or disconnect during the login: a refused
// token is unauthorized, anything else keeps err as it is.
func loginClosed(code int, err error) error {
	if code == closeInvalidToken {
		return probe.Unauthorized(err)
	}
	return err
}
