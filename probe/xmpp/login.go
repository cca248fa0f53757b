package xmpp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// loginState is where a login stands.
type loginState int

// Login states, in order.
const (
	loginFeatures loginState = iota
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
	if err := s.write(openStream(d.cfg.Domain), false); err != nil {
		return err
	}
	l := &loginRun{s: s, rooms: rooms, prev: prev, state: loginFeatures, password: d.opts.Password(s.user),
		joining: make(map[string]string, len(rooms))}
	for _, r := range rooms {
		l.joining[strings.ToLower(r)] = ""
	}
	st := stanzaPool.Get().(*stanza)
	defer stanzaPool.Put(st)
	for l.state != loginDone {
		bp, readAt, err := s.conn.Read(d.conn.DialTimeout)
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return fmt.Errorf("server closed the connection: %d %s", ce.Code, ce.Text)
			}
			return err
		}
		l.at = readAt
		err = parseFrame(*bp, st, l.step)
		wsconn.Release(bp)
		if err != nil {
			return err
		}
	}
	return nil
}

// loginRun is one login's progress through its states.
type loginRun struct {
	s        *session
	rooms    []string
	prev     smState
	state    loginState
	scram    *scramClient
	smIn     bool
	password string
	// at is the stamp of the frame being handled.
	at int64
	// joining maps each room not yet joined to the id of its
	// owner-form request, "" while its self-presence is awaited.
	joining map[string]string
	// carbonsWait is set while the answer to enabling message carbons
	// is awaited.
	carbonsWait bool
}

// step handles one element of the login.
func (l *loginRun) step(st *stanza) error {
	s := l.s
	if l.smIn {
		if s.pendingSize += len(st.raw); s.pendingSize > maxPendingLogin {
			return errors.New("too much traffic during login")
		}
		s.pending = append(s.pending, pendingElem{raw: append([]byte(nil), st.raw...), at: l.at})
	}
	switch st.kind {
	case kindStreamError:
		return fmt.Errorf("stream error: %s", st.errorText())
	case kindClose:
		return errors.New("server closed the stream")
	case kindIQ:
		if l.carbonsWait && st.id == "carbons" && (st.typ == "result" || st.typ == "error") {
			l.carbonsWait = false
			if st.typ == "error" && s.index > 0 {
				// Without carbons the device would miss what its
				// siblings send, which the population owes it.
				return fmt.Errorf("server refused message carbons (XEP-0280), which a user's second device needs: %s", st.errorText())
			}
			if l.state == loginJoin && len(l.joining) == 0 {
				l.state = loginDone
			}
			return nil
		}
	}
	var err error
	switch l.state {
	case loginFeatures:
		err = l.features(st)
	case loginAuth:
		err = l.auth(st)
	case loginFeatures2:
		err = l.features2(st)
	case loginResume:
		err = l.resume(st)
	case loginBind:
		err = l.bind(st)
	case loginEnable:
		err = l.enable(st)
	case loginJoin:
		err = s.joinStep(st, l.joining)
	}
	if err != nil {
		return err
	}
	if l.state == loginJoin && len(l.joining) == 0 && !l.carbonsWait {
		l.state = loginDone
	}
	return nil
}

// features picks the SASL mechanism.
func (l *loginRun) features(st *stanza) error {
	s := l.s
	if st.kind != kindFeatures {
		return nil
	}
	switch {
	case st.mechSCRAM:
		var err error
		if l.scram, err = newSCRAM(&s.d.salts, s.user, l.password); err != nil {
			return err
		}
		l.state = loginAuth
		return s.write(authStanza("SCRAM-SHA-1", l.scram.first()), false)
	case st.mechPlain:
		l.state = loginAuth
		return s.write(authStanza("PLAIN", plainAuth(s.user, l.password)), false)
	}
	return errors.New("server offers neither SCRAM-SHA-1 nor PLAIN")
}

// auth runs the SASL exchange.
func (l *loginRun) auth(st *stanza) error {
	s := l.s
	switch st.kind {
	case kindChallenge:
		if l.scram == nil {
			return errors.New("unexpected SASL challenge to PLAIN")
		}
		resp, err := l.scram.respond(st.sasl)
		if err != nil {
			return err
		}
		return s.write(saslResponse(resp), false)
	case kindSuccess:
		if l.scram != nil {
			if err := l.scram.verify(st.sasl); err != nil {
				return err
			}
		}
		l.state = loginFeatures2
		return s.write(openStream(s.d.cfg.Domain), false)
	case kindFailure:
		return probe.Unauthorized(fmt.Errorf("authentication failed: %s", st.errorText()))
	}
	return nil
}

// features2 resumes the previous stream or binds a resource, after the
// stream restart.
func (l *loginRun) features2(st *stanza) error {
	s := l.s
	if st.kind != kindFeatures {
		return nil
	}
	switch {
	case !st.featBind:
		return errors.New("server offers no resource binding")
	case !st.featSM:
		// Without it no direct message could be acknowledged.
		return errors.New("server offers no stream management (XEP-0198)")
	case l.prev.id != "":
		l.state = loginResume
		return s.write(resumeStanza(l.prev.id, l.prev.h), false)
	}
	l.state = loginBind
	return s.write(bindStanza(s.resource), false)
}

// resume handles the answer to a resumption.
func (l *loginRun) resume(st *stanza) error {
	s := l.s
	switch st.kind {
	case kindResumed:
		// The server kept the stream, its rooms included, and
		// resends what we had not acknowledged.
		_ = s.conn.WriteWith(func(func([]byte) error) error {
			s.counting, s.out = true, st.h
			s.sent.Store(s.out)
			return nil
		})
		s.in, s.acked, s.smID, s.resumed, l.smIn = l.prev.h, l.prev.h, l.prev.id, true, true
		l.state = loginDone
	case kindFailed:
		l.state = loginBind
		return s.write(bindStanza(s.resource), false)
	}
	return nil
}

// bind handles the bound resource, then asks for stream management,
// carbons, presence and the rooms.
func (l *loginRun) bind(st *stanza) error {
	s := l.s
	if st.kind != kindIQ || st.id != "bind" {
		return nil
	}
	if st.typ != "result" {
		return fmt.Errorf("bind: %s", st.errorText())
	}
	if _, r := splitJID(string(st.jid)); r != "" {
		// The server may bind another resource than asked.
		s.resource = r
	}
	// Stream management first, so that the messages the
	// server flushes at our initial presence (offline storage)
	// are covered by it.
	err := s.conn.WriteWith(func(write func([]byte) error) error {
		s.counting = true
		return write(enableStanza(s.d.cfg.Resume))
	})
	if err != nil {
		return err
	}
	// Carbons before presence, so that no message sent by a
	// sibling device once this one is available is missed.
	// Always, whatever the number of devices: the driver is
	// not told it, and a user with one resource gets no
	// carbons, so it costs one iq a login and nothing else.
	if err := s.write(carbonsEnable, true); err != nil {
		return err
	}
	l.carbonsWait = true
	if err := s.write(initialPresence, true); err != nil {
		return err
	}
	for _, r := range l.rooms {
		if err := s.write(joinStanza(r, s.nick), true); err != nil {
			return fmt.Errorf("join %s: %w", r, err)
		}
	}
	l.state = loginEnable
	return nil
}

// enable handles the answer to enabling stream management.
func (l *loginRun) enable(st *stanza) error {
	switch st.kind {
	case kindEnabled:
		l.smIn, l.s.smID = true, st.smID
		l.state = loginJoin
	case kindFailed:
		return fmt.Errorf("stream management refused: %s", st.errorText())
	}
	return nil
}
