package centrifugo

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// session is one logged-in connection of one device.
type session struct {
	d     *Driver
	conn  *wsconn.Conn
	user  string
	userB []byte
	st    *devState
	// chans are the channels the session subscribes to; not modified.
	chans []string
	// h is the handler of Serve's frames.
	h probe.Handler

	// cu is the device's place in its channels, nil with catch-up off.
	cu *probe.Catchup
	// marks is the session's copy of the stream mark of each channel it
	// keeps in cu (see streamMark); own are the client ids of the
	// device's sessions, this one's last (devState.clients). Both are
	// owned by the goroutine that runs the handshake, then by Serve's.
	marks map[string]streamMark
	own   [][]byte
	// tops holds, per channel, the stream top the last sync reply gave
	// and when, applied at the next one (see onSync); dueAt (Unix ns) is
	// when Due is next asked, dues its scratch. Serve's.
	tops  map[string]streamTop
	dueAt int64
	dues  []probe.Fetch

	ids atomic.Uint32
	// pmu guards the commands awaiting a reply: publishes (id to the
	// caller's ref), resubscribes (id to channel), history fetches and
	// syncs (catchup.go).
	pmu     sync.Mutex
	acks    map[uint32]uint64
	subs    map[uint32]string
	fetches map[uint32]*fetch
	syncs   map[uint32]string

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
	b = jsonscan.AppendString(b, tok)
	b = append(b, `,"name":"imcanary"}}`...)
	if err := s.write(b); err != nil {
		return err
	}
	end := time.Now().Add(s.d.conn.DialTimeout)
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
			s.ownClient(m.res.client)
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
	s.conn.SetIdle(wsconn.IdleFor(max(s.d.conn.Heartbeat, s.serverPing)))
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
// offset; with catch-up, one where the device has a place also asks for
// what was published since (the device's Catchup position and mark).
func (s *session) appendSubscribe(b []byte, id uint32, ch string) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, uint64(id), 10)
	b = append(b, `,"subscribe":{"channel":`...)
	b = jsonscan.AppendString(b, ch)
	b = append(b, `,"positioned":true`...)
	if s.cu != nil {
		b = append(b, `,"recoverable":true`...)
		if offset, m, ok := s.place(ch); ok {
			b = append(b, `,"recover":true,"offset":`...)
			b = strconv.AppendUint(b, offset, 10)
			b = append(b, `,"epoch":`...)
			b = jsonscan.AppendString(b, m.epoch)
		}
	}
	return append(b, "}}"...)
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
		b = jsonscan.AppendEscaped(b, m.Group)
	} else {
		a, c := s.user, m.To
		if c < a {
			a, c = c, a
		}
		b = append(b, s.d.cfg.DirectNamespace...)
		b = append(b, ":#"...)
		b = jsonscan.AppendEscaped(b, a)
		b = append(b, ',')
		b = jsonscan.AppendEscaped(b, c)
	}
	b = append(b, `","data":{"b":`...)
	b = jsonscan.AppendString(b, m.Body)
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

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session: a normal-closure frame, then a bounded
// wait for the server's reply, which Serve reads.
func (s *session) Close() error { return s.conn.Close() }

// Serve implements probe.Session: what the login kept is handled first,
// then what the connection reads.
func (s *session) Serve(h probe.Handler) error { return s.run(h).Serve() }

// Watch implements probe.Watcher: the session read by the Poller of its
// link, without a goroutine of its own.
func (s *session) Watch(h probe.Handler, done func(error)) bool { return s.run(h).Watch(done) }

// Hold implements probe.Holder: a watched slow reader's pause.
func (s *session) Hold(d time.Duration) bool { return s.conn.Hold(d) }

var (
	_ probe.Watcher = (*session)(nil)
	_ probe.Holder  = (*session)(nil)
)

func (s *session) run(h probe.Handler) wsconn.Session {
	return wsconn.Session{Conn: s.conn, Proto: s, Begin: func() error { return s.begin(h) }}
}

// begin hands h the frames kept from the login, in order.
func (s *session) begin(h probe.Handler) error {
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
	return nil
}

// Frame implements wsconn.Protocol.
func (s *session) Frame(b []byte, at int64) error {
	s.delivery.At = at
	if err := s.handleFrame(b, s.h); err != nil {
		return err
	}
	if err := s.fetchDue(at); err != nil {
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("history: %w", err)}
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
// publish (ack or rejection), a resubscribe, a history fetch or sync, or a
// token refresh.
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
	f, isFetch := s.fetches[id]
	if isFetch {
		delete(s.fetches, id)
	}
	syncCh, isSync := s.syncs[id]
	if isSync {
		delete(s.syncs, id)
	}
	s.pmu.Unlock()
	switch {
	case isFetch:
		if err := s.onFetch(f, m, frame, h); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
		}
	case isSync:
		if err := s.onSync(syncCh, m); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
		}
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
// session resubscribes at once, recovering with catch-up, and the reply
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
	b = jsonscan.AppendString(b, tok)
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
	// CloseConnectionLimit is "connection limit". Centrifugo v6.9.1
	// sends it in two cases: to a new connection of a user already at
	// client.user_connection_limit, which is refused at login, and to the
	// connections a user already had when a new one logs in under
	// client.subscribe_to_user_personal_channel.single_connection,
	// which are displaced. An established session closed with it is the
	// latter: the same user logged in elsewhere.
	CloseConnectionLimit = 3504
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
	case CloseConnectionLimit:
		return &probe.Disconnect{Reason: metrics.ReasonConflict, Code: code,
			Text: text + ": the user logged in elsewhere (single_connection)"}
	}
	return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: code, Text: text}
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
// token is unauthorized, anything else keeps err as it is (protocol). A
// connection limit at login is the user's client.user_connection_limit,
// which the login, not an earlier session, ran into: said so, not
// classed conflict, which is for a session displaced.
func loginClosed(code int, err error) error {
	switch code {
	case closeInvalidToken:
		return probe.Unauthorized(err)
	case CloseConnectionLimit:
		return fmt.Errorf("%w: the user has as many connections as client.user_connection_limit allows", err)
	}
	return err
}
