package xmpp

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// session is one logged-in stream: one device of one user.
type session struct {
	d    *Driver
	conn *wsconn.Conn
	user string
	// bare is the user's JID, resource the device's (as the server bound
	// it), nick its name in the user's rooms, and index the device's
	// index; key names the device in the driver's resumption state.
	bare     string
	resource string
	nick     string
	index    int
	key      string
	// cat is the device's catch-up state, nil when catch-up is off.
	cat *catchup

	// The connection's write lock (Conn.WriteWith) guards the outbound
	// stanza count: the sender, the read loop's SM answers and Close all
	// write. counting is set once stream management is enabled: from then
	// on every stanza written counts towards the server's h.
	counting bool
	out      uint32
	// sent mirrors out for the read loop, which checks the server's
	// counts against it without taking the write lock.
	sent atomic.Uint32

	// amu guards acks, the direct messages awaiting the server's <a/>,
	// in the order written. The sender appends and the read loop pops.
	amu  sync.Mutex
	acks []pendingAck

	// The fields below belong to the login, then to the Serve goroutine.
	// in counts the stanzas received since stream management was
	// enabled; acked is the last count sent to the server, and askedAck
	// says the server requested one.
	in       uint32
	acked    uint32
	askedAck bool
	smID     string
	resumed  bool
	// pending holds copies of the elements read during login after stream
	// management was enabled: Serve handles (and counts) them first, so
	// that nothing read before the handler existed is lost or acked
	// unseen.
	pending     []pendingElem
	pendingSize int
	// streamCond and streamText are the server's stream error, if any;
	// serverClosed is set by its <close/>.
	streamCond   string
	streamText   string
	serverClosed bool
	fromBuf      []byte
	ackBuf       []uint64
	aBuf         []byte
	// h and delivery are Serve's.
	h        probe.Handler
	delivery probe.Delivery
}

// pendingElem is an element read during login, kept for Serve with the
// stamp of the frame it came in.
type pendingElem struct {
	raw []byte
	at  int64
}

// pendingAck is a direct message written as the nth counted stanza.
type pendingAck struct {
	n   uint32
	ref uint64
}

const (
	// maxPendingAcks bounds the direct messages a session remembers
	// without an ack: the population writes off unacked messages after
	// its deadline, so entries this old are dead anyway.
	maxPendingAcks = 4096
	// maxPendingLogin bounds what login buffers for Serve.
	maxPendingLogin = 1 << 20
)

// sendPool holds encoded messages between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// errClosing is the error of a write after Close: nothing may follow the
// stream's <close/>.
var errClosing = errors.New("session closing")

// write writes one element as one frame; counted says it is a stanza the
// server counts for stream management.
func (s *session) write(b []byte, counted bool) error {
	return s.conn.WriteWith(func(write func([]byte) error) error {
		// Close marks the connection closing before it takes the
		// lock, so no writer that holds the lock can follow its
		// <close/>.
		if s.conn.Closing() {
			return errClosing
		}
		if counted && s.counting {
			s.out++
			s.sent.Store(s.out)
		}
		return write(b)
	})
}

// joinStep handles one element while rooms are being joined.
func (s *session) joinStep(st *stanza, joining map[string]string) error {
	switch st.kind {
	case kindPresence:
		bare, nick := splitJID(st.from)
		room := strings.ToLower(bare)
		formID, waiting := joining[room]
		if !waiting || formID != "" {
			return nil
		}
		switch {
		case st.typ == "error":
			return fmt.Errorf("join %s: %s", bare, st.errorText())
		case !st.self && nick != s.nick:
			// Another occupant.
			return nil
		case st.typ == "unavailable":
			return fmt.Errorf("join %s: removed at once", bare)
		case st.created:
			// A new room: accept the default configuration, which
			// unlocks it for the other members (XEP-0045 §10.1.2).
			id := "own-" + strconv.Itoa(len(joining)) + "-" + room
			joining[room] = id
			return s.write(instantRoomStanza(id, bare), true)
		}
		delete(joining, room)
	case kindIQ:
		for room, id := range joining {
			if id == "" || st.id != id {
				continue
			}
			if st.typ == "error" {
				return fmt.Errorf("configure room %s: %s", room, st.errorText())
			}
			delete(joining, room)
			return nil
		}
	}
	return nil
}

// Send implements probe.Session. A direct message is followed by an SM
// request, whose answer acknowledges it; a group message is acknowledged by
// its reflection.
func (s *session) Send(m *probe.Message) error {
	bp := sendPool.Get().(*[]byte)
	defer sendPool.Put(bp)
	direct := m.Group == ""
	var b []byte
	if direct {
		b = appendMessage((*bp)[:0], "chat", m.To, s.d.cfg.Domain, m.Ref, m.Body)
	} else {
		b = appendMessage((*bp)[:0], "groupchat", m.Group, s.d.cfg.MUCService, m.Ref, m.Body)
	}
	*bp = b
	if len(b) > maxStanza {
		return fmt.Errorf("message of %d bytes exceeds the %d-byte stanza limit", len(b), maxStanza)
	}
	return s.conn.WriteWith(func(write func([]byte) error) error {
		if s.conn.Closing() {
			return errClosing
		}
		s.out++
		s.sent.Store(s.out)
		if direct {
			// Recorded before the write: the answer can come before
			// the write returns.
			s.amu.Lock()
			if len(s.acks) == maxPendingAcks {
				s.acks = append(s.acks[:0], s.acks[1:]...)
			}
			s.acks = append(s.acks, pendingAck{n: s.out, ref: m.Ref})
			s.amu.Unlock()
		}
		if err := write(b); err != nil {
			return err
		}
		if direct {
			return write(smRequest)
		}
		return nil
	})
}

// Ping implements probe.Session with a WebSocket ping, which Prosody
// answers and which, unlike an XMPP ping, does not count as a stanza.
func (s *session) Ping() error { return s.conn.Ping() }

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session: the stream's <close/> (the connection's
// Farewell), then a bounded wait for the server's, which Serve reads.
func (s *session) Close() error { return s.conn.Close() }

// Serve implements probe.Session: the elements the login kept are handled
// first, then what the connection reads.
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
	return wsconn.Session{Conn: s.conn, Proto: s, Begin: func() error { return s.begin(h) }, Finish: s.end}
}

// begin hands h the stanzas kept from the login, in order.
func (s *session) begin(h probe.Handler) error {
	s.h = h
	for _, e := range s.pending {
		s.delivery.At = e.at
		if err := s.frame(e.raw); err != nil {
			err = s.conn.Failed(err)
			s.conn.Abort()
			return s.end(err)
		}
	}
	s.pending, s.pendingSize = nil, 0
	return nil
}

// Frame implements wsconn.Protocol.
func (s *session) Frame(b []byte, at int64) error {
	// Every stanza of the frame came with its last byte.
	s.delivery.At = at
	return s.frame(b)
}

// frame handles every element of one frame, then acknowledges what it
// counted. The ack goes out as soon as the frame is handled, not only when
// the server asks: a stanza handed to the handler but not acknowledged
// when the connection drops is stored again and redelivered by the server
// (Prosody: to offline storage), which the ledger would see as a
// duplicate.
func (s *session) frame(b []byte) error {
	st := stanzaPool.Get().(*stanza)
	err := parseFrame(b, st, s.handleStanza)
	stanzaPool.Put(st)
	if err != nil {
		// A *probe.Disconnect from handle, or a frame we cannot read,
		// which might have been a delivery: the connection layer ends
		// the session either way.
		return err
	}
	if s.askedAck || s.in != s.acked {
		s.askedAck, s.acked = false, s.in
		s.aBuf = appendAck(s.aBuf[:0], s.in)
		if err := s.write(s.aBuf, false); err != nil && err != errClosing {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
		}
	}
	return nil
}

// handleStanza handles one element in Serve. Its errors are
// *probe.Disconnect, which the connection layer tells from the parser's.
func (s *session) handleStanza(st *stanza) error {
	h, d := s.h, &s.delivery
	switch st.kind {
	case kindMessage:
		s.in++
		s.message(st, h, d)
		return nil
	case kindPresence:
		s.in++
		if _, nick := splitJID(st.from); st.typ == "unavailable" && st.removed && (st.self || nick == s.nick) {
			// Kicked from a room: its deliveries would stop without
			// a sign. End the session, so that it rejoins.
			bare, _ := splitJID(st.from)
			text := "removed from room " + bare
			return &probe.Disconnect{Reason: metrics.ReasonServerClose, Text: text, Err: errors.New(text)}
		}
	case kindIQ:
		s.in++
		switch {
		case st.typ == "get" || st.typ == "set":
			if err := s.write(iqReply(st), true); err != nil && err != errClosing {
				return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
			}
		case s.cat != nil && strings.HasPrefix(st.id, queryPrefix):
			if err := s.writeQueries(s.cat.answered(st, s.now())); err != nil && err != errClosing {
				return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
			}
		}
	case kindOther:
		// Prosody counts any element of the client namespace.
		if st.client {
			s.in++
		}
	case kindR:
		s.askedAck = true
	case kindA:
		if st.hasH {
			if int32(st.h-s.sent.Load()) > 0 {
				// More handled than we ever sent: a server that
				// lies here would have us report unsent messages as
				// accepted.
				return &probe.Disconnect{Reason: metrics.ReasonError,
					Err: fmt.Errorf("server acknowledged %d stanzas, more than the %d sent", st.h, s.sent.Load())}
			}
			s.acknowledge(st.h, h)
		}
	case kindStreamError:
		s.streamCond, s.streamText = st.cond, string(st.text)
	case kindClose:
		if !s.serverClosed && !s.conn.Closing() {
			// Answer in kind; the server then closes the WebSocket.
			_ = s.write(closeStream, false)
		}
		s.serverClosed = true
		// Only the WebSocket close is left to read.
		s.conn.SetIdle(closeGrace)
	}
	return nil
}

// message handles a message stanza.
func (s *session) message(st *stanza, h probe.Handler, d *probe.Delivery) {
	d.Recovered = false
	switch st.wrap {
	case wrapResult:
		s.recovered(st, h, d)
		return
	case wrapSent, wrapReceived:
		s.carbon(st, h, d)
		return
	}
	switch st.typ {
	case "error":
		if ref, ok := parseRef(st.id); ok {
			// A bounced message still counts in the server's h: drop
			// its pending ack, or the <a/> that follows would report
			// as accepted what the server refused. (A bounce that
			// comes after its <a/> is beyond repair: XEP-0198's h
			// means received, not accepted.)
			s.amu.Lock()
			s.acks = slices.DeleteFunc(s.acks, func(a pendingAck) bool { return a.ref == ref })
			s.amu.Unlock()
			h.OnReject(ref, st.errorText())
		}
		return
	case "groupchat":
		bare, nick := splitJID(st.from)
		if nick == "" || !st.hasBody {
			// The room itself: subject, notices.
			return
		}
		if s.cat != nil && !st.history {
			s.cat.pushed(bare, st.sidBy(bare), s.now())
		}
		if nick == s.nick {
			// Our own message reflected by the room: its ack.
			if ref, ok := parseRef(st.id); ok {
				h.OnAck(ref, probe.Ack{})
			}
			return
		}
		if st.history {
			// History the room replays: not a delivery. Delays
			// stamped by others (offline storage, SM resends) mark
			// late deliveries, which count.
			return
		}
		s.fromBuf = append(s.fromBuf[:0], nick...)
		d.Group = true
	default:
		if !st.hasBody {
			return
		}
		if s.cat != nil {
			s.cat.pushed(s.cat.self, st.sidBy(s.cat.self), s.now())
		}
		s.fromBuf = append(s.fromBuf[:0], localpart(st.from)...)
		d.Group = false
	}
	d.From, d.Body, d.ServerSeq = s.fromBuf, st.body, 0
	h.OnDelivery(d)
}

// acknowledge reports the direct messages that h, the server's count of our
// stanzas, covers. Counts wrap at 2^32 (XEP-0198).
func (s *session) acknowledge(hv uint32, h probe.Handler) {
	s.amu.Lock()
	n := 0
	for n < len(s.acks) && int32(hv-s.acks[n].n) >= 0 {
		n++
	}
	refs := s.ackBuf[:0]
	for _, a := range s.acks[:n] {
		refs = append(refs, a.ref)
	}
	s.acks = append(s.acks[:0], s.acks[n:]...)
	s.amu.Unlock()
	// The handler runs without the lock: it takes the population's.
	for _, ref := range refs {
		h.OnAck(ref, probe.Ack{})
	}
	s.ackBuf = refs
}

// end records the stream's state for a resumption and returns err.
func (s *session) end(err error) error {
	var d *probe.Disconnect
	keep := errors.As(err, &d) && d.Reason != metrics.ReasonShutdown && s.streamCond == ""
	s.d.forget(s.key, smState{id: s.smID, h: s.in}, keep)
	return err
}

// Ended implements wsconn.Protocol: a read error of a session imcanary did
// not close, classed with what the stream said before it ended (a stream
// error, its <close/>).
func (s *session) Ended(err error) *probe.Disconnect {
	var ce *websocket.CloseError
	isClose := errors.As(err, &ce)
	code := 0
	if isClose && ce.Code != websocket.CloseAbnormalClosure {
		code = ce.Code
	}
	switch {
	case s.streamCond != "" || s.streamText != "":
		text := s.streamCond
		if s.streamText != "" {
			text += ": " + s.streamText
		}
		reason := metrics.ReasonServerClose
		switch {
		// ejabberd's and Prosody's wording for a client that does not
		// keep up with its stream.
		case s.streamCond == "policy-violation" || strings.Contains(s.streamText, "Too many unacked stanzas"):
			reason = metrics.ReasonSlowConsumer
		// The same resource logged in elsewhere (RFC 6120 §4.9.3.3):
		// the server's policy, not a fault.
		case s.streamCond == "conflict":
			reason = metrics.ReasonConflict
		}
		d := &probe.Disconnect{Reason: reason, Code: code, Text: text}
		if code == 0 {
			// Without a close code Disconnect.Error shows only Err.
			d.Err = errors.New("stream error " + text)
		}
		return d
	case isClose && ce.Code == websocket.CloseAbnormalClosure:
		// 1006 is gorilla's name for a connection that ended without a
		// close frame: the network failed, the server did not close.
		if s.serverClosed {
			return &probe.Disconnect{Reason: metrics.ReasonServerClose, Text: "stream closed"}
		}
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
	case isClose:
		text := ce.Text
		if s.serverClosed {
			text = "stream closed: " + text
		}
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Code: ce.Code, Text: text}
	case s.serverClosed:
		return &probe.Disconnect{Reason: metrics.ReasonServerClose, Text: "stream closed", Err: err}
	}
	return &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
}

// parseRef parses the decimal id the sender put on a message. Other ids
// are not refs.
func parseRef(id string) (uint64, bool) {
	if len(id) == 0 || len(id) > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(id, 10, 64)
	return n, err == nil
}

// carbon handles a carbon copy (XEP-0280): a message another resource of
// the user sent (<sent/>) or received (<received/>), delivered as the
// message it forwards.
func (s *session) carbon(st *stanza, h probe.Handler, d *probe.Delivery) {
	// XEP-0280 §11: only the user's own account sends carbons; anyone
	// else's is forged.
	if !strings.EqualFold(st.from, s.bare) || !st.fwd || !st.fwdHasBody {
		return
	}
	switch st.fwdType {
	case "groupchat", "error", "headline":
		return
	}
	if s.cat != nil {
		s.cat.pushed(s.cat.self, st.sidBy(s.cat.self), s.now())
	}
	if st.wrap == wrapSent {
		// Sent by a sibling device: from the user itself, which the
		// ledger owes to this device when the population has several.
		s.fromBuf = append(s.fromBuf[:0], s.user...)
	} else {
		s.fromBuf = append(s.fromBuf[:0], localpart(st.fwdFrom)...)
	}
	d.From, d.Group, d.Body, d.ServerSeq = s.fromBuf, false, st.fwdBody, 0
	h.OnDelivery(d)
}

// recovered handles an archive result (XEP-0313): a message the device
// fetched, delivered as recovered. Its own messages (its resource's in the
// user's archive, its nick's in a room's) are not: the device holds them.
func (s *session) recovered(st *stanza, h probe.Handler, d *probe.Delivery) {
	if s.cat == nil {
		return
	}
	jid, room, ok := s.cat.result(st)
	if !ok || !st.fwd || !st.fwdHasBody {
		return
	}
	if room {
		bare, nick := splitJID(st.fwdFrom)
		if st.fwdType != "groupchat" || nick == "" || nick == s.nick || !strings.EqualFold(bare, jid) {
			return
		}
		s.fromBuf = append(s.fromBuf[:0], nick...)
		d.Group = true
	} else {
		switch st.fwdType {
		case "groupchat", "error", "headline":
			return
		}
		bare, res := splitJID(st.fwdFrom)
		if strings.EqualFold(bare, s.bare) && res == s.resource {
			return
		}
		s.fromBuf = append(s.fromBuf[:0], localpart(st.fwdFrom)...)
		d.Group = false
	}
	d.From, d.Body, d.ServerSeq, d.Recovered = s.fromBuf, st.fwdBody, 0, true
	h.OnDelivery(d)
	d.Recovered = false
}

// Sync implements probe.Syncer: it asks each of the device's archives for
// what it holds after the device's place, unless a query of it is under
// way. The answers come through Serve.
func (s *session) Sync() error {
	if s.cat == nil {
		return nil
	}
	return s.writeQueries(s.cat.syncAll(time.Now().Unix()))
}

// writeQueries writes archive queries, stanzas the server counts.
func (s *session) writeQueries(qs [][]byte) error {
	for _, q := range qs {
		if err := s.write(q, true); err != nil {
			return err
		}
	}
	return nil
}

// now is the time of the frame being handled, in Unix seconds: marks
// are kept to the second.
func (s *session) now() int64 {
	if at := s.delivery.At; at != 0 {
		return at / int64(time.Second)
	}
	return time.Now().Unix()
}
