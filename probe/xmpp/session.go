package xmpp

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsframe"
)

// session is one logged-in stream.
type session struct {
	d    *Driver
	conn *websocket.Conn
	// stamp tells when the frame just read came off the socket.
	stamp *wsframe.StampConn
	user  string
	nick  string

	// wmu serialises writers (the sender, the read loop's SM answers,
	// Close) and guards the outbound stanza count. Pings use
	// WriteControl, which gorilla allows concurrently.
	wmu sync.Mutex
	// counting is set once stream management is enabled: from then on
	// every stanza written counts towards the server's h.
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

	// guard orders read-deadline changes against Close.
	guard wsframe.Closer
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
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// Close sets closing before it takes the lock, so no writer that
	// holds the lock can follow its <close/>.
	if s.guard.Closing() {
		return errClosing
	}
	if counted && s.counting {
		s.out++
		s.sent.Store(s.out)
	}
	return s.writeLocked(b)
}

func (s *session) writeLocked(b []byte) error {
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.d.opts.WriteTimeout))
	return wsframe.Fail(s.conn, s.conn.WriteMessage(websocket.TextMessage, b))
}

// Login states, in order.
const (
	loginFeatures = iota
	loginAuth
	loginFeatures2
	loginResume
	loginBind
	loginEnable
	loginJoin
	loginDone
)

// login runs the stream from <open/> to the last room joined: SASL,
// stream restart, resumption or bind, stream management, presence, rooms.
// ctx is enforced by the caller closing the connection.
func (s *session) login(rooms []string, prev smState) error {
	d := s.d
	if err := s.write(openStream(d.opts.Domain), false); err != nil {
		return err
	}
	var (
		state    = loginFeatures
		scram    *scramClient
		smIn     bool
		password = d.opts.Password(s.user)
		// at is the stamp of the frame being handled.
		at int64
		// joining maps each room not yet joined to the id of its
		// owner-form request, "" while its self-presence is awaited.
		joining = make(map[string]string, len(rooms))
	)
	for _, r := range rooms {
		joining[strings.ToLower(r)] = ""
	}
	step := func(st *stanza) error {
		if smIn {
			if s.pendingSize += len(st.raw); s.pendingSize > maxPendingLogin {
				return errors.New("too much traffic during login")
			}
			s.pending = append(s.pending, pendingElem{raw: append([]byte(nil), st.raw...), at: at})
		}
		switch st.kind {
		case kindStreamError:
			return fmt.Errorf("stream error: %s", st.errorText())
		case kindClose:
			return errors.New("server closed the stream")
		}
		switch state {
		case loginFeatures:
			if st.kind != kindFeatures {
				return nil
			}
			switch {
			case st.mechSCRAM:
				var err error
				if scram, err = newSCRAM(&d.salts, s.user, password); err != nil {
					return err
				}
				state = loginAuth
				return s.write(authStanza("SCRAM-SHA-1", scram.first()), false)
			case st.mechPlain:
				state = loginAuth
				return s.write(authStanza("PLAIN", plainAuth(s.user, password)), false)
			}
			return errors.New("server offers neither SCRAM-SHA-1 nor PLAIN")
		case loginAuth:
			switch st.kind {
			case kindChallenge:
				if scram == nil {
					return errors.New("unexpected SASL challenge to PLAIN")
				}
				resp, err := scram.respond(st.sasl)
				if err != nil {
					return err
				}
				return s.write(saslResponse(resp), false)
			case kindSuccess:
				if scram != nil {
					if err := scram.verify(st.sasl); err != nil {
						return err
					}
				}
				state = loginFeatures2
				return s.write(openStream(d.opts.Domain), false)
			case kindFailure:
				return probe.Unauthorized(fmt.Errorf("authentication failed: %s", st.errorText()))
			}
		case loginFeatures2:
			if st.kind != kindFeatures {
				return nil
			}
			switch {
			case !st.featBind:
				return errors.New("server offers no resource binding")
			case !st.featSM:
				// Without it no direct message could be acknowledged.
				return errors.New("server offers no stream management (XEP-0198)")
			case prev.id != "":
				state = loginResume
				return s.write(resumeStanza(prev.id, prev.h), false)
			}
			state = loginBind
			return s.write(bindStanza(resource), false)
		case loginResume:
			switch st.kind {
			case kindResumed:
				// The server kept the stream, its rooms included, and
				// resends what we had not acknowledged.
				s.wmu.Lock()
				s.counting, s.out = true, st.h
				s.sent.Store(s.out)
				s.wmu.Unlock()
				s.in, s.acked, s.smID, s.resumed, smIn = prev.h, prev.h, prev.id, true, true
				state = loginDone
			case kindFailed:
				state = loginBind
				return s.write(bindStanza(resource), false)
			}
		case loginBind:
			if st.kind != kindIQ || st.id != "bind" {
				return nil
			}
			if st.typ != "result" {
				return fmt.Errorf("bind: %s", st.errorText())
			}
			// Stream management first, so that the messages the
			// server flushes at our initial presence (offline storage)
			// are covered by it.
			s.wmu.Lock()
			err := s.writeLocked(enableStanza(d.opts.Resume))
			s.counting = true
			s.wmu.Unlock()
			if err != nil {
				return err
			}
			if err := s.write(initialPresence, true); err != nil {
				return err
			}
			for _, r := range rooms {
				if err := s.write(joinStanza(r, s.nick), true); err != nil {
					return fmt.Errorf("join %s: %w", r, err)
				}
			}
			state = loginEnable
		case loginEnable:
			switch st.kind {
			case kindEnabled:
				smIn, s.smID = true, st.smID
				state = loginJoin
			case kindFailed:
				return fmt.Errorf("stream management refused: %s", st.errorText())
			}
		case loginJoin:
			if err := s.joinStep(st, joining); err != nil {
				return err
			}
		}
		if state == loginJoin && len(joining) == 0 {
			state = loginDone
		}
		return nil
	}
	st := stanzaPool.Get().(*stanza)
	defer stanzaPool.Put(st)
	for state != loginDone {
		bp, err := wsframe.Read(s.conn)
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return fmt.Errorf("server closed the connection: %d %s", ce.Code, ce.Text)
			}
			return err
		}
		at = s.stamp.Last()
		err = parseFrame(*bp, st, step)
		wsframe.Release(bp)
		if err != nil {
			return err
		}
	}
	return nil
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
		b = appendMessage((*bp)[:0], "chat", m.To, s.d.opts.Domain, m.Ref, m.Body)
	} else {
		b = appendMessage((*bp)[:0], "groupchat", m.Group, s.d.opts.MUCService, m.Ref, m.Body)
	}
	*bp = b
	if len(b) > maxStanza {
		return fmt.Errorf("message of %d bytes exceeds the %d-byte stanza limit", len(b), maxStanza)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.guard.Closing() {
		return errClosing
	}
	s.out++
	s.sent.Store(s.out)
	if direct {
		// Recorded before the write: the answer can come before
		// WriteMessage returns.
		s.amu.Lock()
		if len(s.acks) == maxPendingAcks {
			s.acks = append(s.acks[:0], s.acks[1:]...)
		}
		s.acks = append(s.acks, pendingAck{n: s.out, ref: m.Ref})
		s.amu.Unlock()
	}
	if err := s.writeLocked(b); err != nil {
		return err
	}
	if direct {
		return s.writeLocked(smRequest)
	}
	return nil
}

// Ping implements probe.Session with a WebSocket ping, which Prosody
// answers and which, unlike an XMPP ping, does not count as a stanza.
func (s *session) Ping() error {
	return wsframe.Fail(s.conn, s.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.d.opts.WriteTimeout)))
}

// Close implements probe.Session: the stream's <close/>, then a bounded wait
// for the server's, which Serve reads.
func (s *session) Close() error {
	if !s.guard.Begin(s.conn, closeGrace) {
		return nil
	}
	// <close/> is a data frame and needs the write lock. A write in
	// progress (the read loop's <a/>, a send) ends within microseconds and
	// is waited for; a sender stuck on a full socket holds the lock for up
	// to WriteTimeout, and rather than wait for it, close at the WebSocket
	// level.
	for wait := time.Now().Add(closeGrace / 10); !s.wmu.TryLock(); time.Sleep(time.Millisecond) {
		if time.Now().After(wait) {
			return wsframe.CloseFrame(s.conn, closeGrace)
		}
	}
	_ = s.conn.SetWriteDeadline(time.Now().Add(closeGrace))
	err := s.conn.WriteMessage(websocket.TextMessage, closeStream)
	s.wmu.Unlock()
	if err == nil {
		return nil
	}
	return wsframe.CloseFrame(s.conn, closeGrace)
}

// Serve implements probe.Session.
func (s *session) Serve(h probe.Handler) error {
	defer s.conn.Close()
	// Two missed heartbeats and a margin: the server answers every ping,
	// so silence that long means the connection is dead.
	idle := 2*s.d.opts.Heartbeat + 5*time.Second
	s.conn.SetPongHandler(func(string) error { return s.guard.Extend(s.conn, idle) })
	d := new(probe.Delivery)
	handle := func(st *stanza) error { return s.handle(st, h, d) }
	for _, e := range s.pending {
		d.At = e.at
		if err := s.frame(e.raw, handle); err != nil {
			return s.end(err)
		}
	}
	s.pending, s.pendingSize = nil, 0
	for {
		if s.serverClosed {
			// Only the WebSocket close is left to read.
			_ = s.guard.Extend(s.conn, closeGrace)
		} else {
			_ = s.guard.Extend(s.conn, idle)
		}
		bp, err := wsframe.Read(s.conn)
		if err != nil {
			return s.end(s.classify(err))
		}
		// Every stanza of the frame came with its last byte.
		d.At = s.stamp.Last()
		err = s.frame(*bp, handle)
		wsframe.Release(bp)
		if err != nil {
			if s.guard.Closing() {
				// What ends a session we are closing is our close.
				return s.end(&probe.Disconnect{Reason: metrics.ReasonShutdown, Err: err})
			}
			return s.end(err)
		}
	}
}

// frame handles every element of one frame, then acknowledges what it
// counted. The ack goes out as soon as the frame is handled, not only when
// the server asks: a stanza handed to the handler but not acknowledged
// when the connection drops is stored again and redelivered by the server
// (Prosody: to offline storage), which the ledger would see as a
// duplicate.
func (s *session) frame(b []byte, handle func(*stanza) error) error {
	st := stanzaPool.Get().(*stanza)
	err := parseFrame(b, st, handle)
	stanzaPool.Put(st)
	if err != nil {
		var d *probe.Disconnect
		if errors.As(err, &d) {
			return d
		}
		// A frame we cannot read might have been a delivery: end the
		// session rather than silently skip it.
		_ = s.conn.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseUnsupportedData, "malformed frame"),
			time.Now().Add(closeGrace))
		return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("malformed frame from server: %w", err)}
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

// handle handles one element in Serve. Its errors are *probe.Disconnect,
// which frame tells from the parser's.
func (s *session) handle(st *stanza, h probe.Handler, d *probe.Delivery) error {
	switch st.kind {
	case kindMessage:
		s.in++
		s.message(st, h, d)
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
		if st.typ == "get" || st.typ == "set" {
			if err := s.write(iqReply(st), true); err != nil && err != errClosing {
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
		if !s.serverClosed && !s.guard.Closing() {
			// Answer in kind; the server then closes the WebSocket.
			_ = s.write(closeStream, false)
		}
		s.serverClosed = true
	}
	return nil
}

// message handles a message stanza.
func (s *session) message(st *stanza, h probe.Handler, d *probe.Delivery) {
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
		_, nick := splitJID(st.from)
		if nick == "" || !st.hasBody {
			// The room itself: subject, notices.
			return
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
	s.d.forget(s.user, smState{id: s.smID, h: s.in}, keep)
	return err
}

// classify turns a read error into a Disconnect with its reason.
func (s *session) classify(err error) error {
	var ce *websocket.CloseError
	isClose := errors.As(err, &ce)
	code := 0
	if isClose && ce.Code != websocket.CloseAbnormalClosure {
		code = ce.Code
	}
	switch {
	case s.guard.Closing():
		return &probe.Disconnect{Reason: metrics.ReasonShutdown, Err: ignoreClosed(err)}
	case s.streamCond != "" || s.streamText != "":
		text := s.streamCond
		if s.streamText != "" {
			text += ": " + s.streamText
		}
		reason := metrics.ReasonServerClose
		// ejabberd's and Prosody's wording for a client that does not
		// keep up with its stream.
		if s.streamCond == "policy-violation" || strings.Contains(s.streamText, "Too many unacked stanzas") {
			reason = metrics.ReasonSlowConsumer
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

// ignoreClosed drops the errors a clean shutdown produces.
func ignoreClosed(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code == websocket.CloseNormalClosure || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
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
