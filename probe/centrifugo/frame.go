package centrifugo

import (
	"fmt"

	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// A Centrifugo WebSocket frame carries one or more JSON messages (replies
// and pushes), separated by newlines. The parser below reads them in turn.
//
// It is hand-written because it runs for every delivery: it does not
// allocate, and it unescapes the strings it extracts in place (an unescaped
// JSON string is never longer than its escaped form). Values it skips are
// validated but left untouched, so that a span it skipped (the publications
// of a subscribe reply) can be parsed later. It checks the whole frame is
// valid JSON: a frame it cannot vouch for must end the session rather than
// be half-read. Unknown fields are skipped, null reads as absent, and a key
// given twice keeps its last value, as encoding/json does.

// Kinds of reply result.
const (
	resNone = iota
	resConnect
	resSubscribe
	resPublish
	resRefresh
	resHistory
)

// Kinds of push.
const (
	pushNone = iota
	pushOther
	pushPub
	pushUnsubscribe
	pushDisconnect
)

// msg holds the fields imcanary needs from one message. Its slices alias
// the frame's bytes.
type msg struct {
	id uint64
	// fields counts the message's top-level keys: the server's ping is
	// the empty object.
	fields int

	hasErr  bool
	errCode uint64
	errMsg  []byte

	result int
	res    result

	push    int
	channel []byte
	pub     pub
	// code and reason are those of an unsubscribe or disconnect push.
	code   uint64
	reason []byte
}

// result is the union of the connect, subscribe, refresh and history
// results.
type result struct {
	// client is the connection's id (connect): Centrifugo names the
	// publisher's connection in every publication's info.client.
	client                                          []byte
	epoch                                           []byte
	offset, ping, ttl                               uint64
	pong, expires, recoverable, recovered, wasRecov bool
	// pubsLo and pubsHi delimit the raw publications array of a
	// subscribe or history result in the frame; parsePubs reads it.
	pubsLo, pubsHi int
}

// pub is a publication: a push's or one recovered by a subscribe.
type pub struct {
	// body is data.b, the probe body; nil if data has no string "b".
	body   []byte
	user   []byte // info.user, the publisher
	client []byte // info.client, the publisher's connection
	epoch  []byte
	offset uint64
}

// parser reads the messages of one frame.
type parser struct{ jsonscan.Scanner }

// message parses the next message of the frame into m.
func (p *parser) message(m *msg) error {
	*m = msg{}
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		m.fields++
		switch string(key) {
		case "id":
			m.id, err = p.Uint()
		case "error":
			m.hasErr, m.errCode, m.errMsg = false, 0, nil
			if !p.Null() {
				m.hasErr = true
				err = p.errorObject(m)
			}
		case "push":
			m.push, m.channel, m.pub, m.code, m.reason = pushNone, nil, pub{}, 0, nil
			if !p.Null() {
				m.push = pushOther
				err = p.pushObject(m)
			}
		case "connect":
			err = p.result(m, resConnect)
		case "subscribe":
			err = p.result(m, resSubscribe)
		case "publish":
			err = p.result(m, resPublish)
		case "refresh":
			err = p.result(m, resRefresh)
		case "history":
			err = p.result(m, resHistory)
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
	}
}

func (p *parser) errorObject(m *msg) error {
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "code":
			m.errCode, err = p.Uint()
		case "message":
			m.errMsg, err = p.Str()
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) pushObject(m *msg) error {
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "channel":
			m.channel, err = p.Str()
		case "pub":
			m.pub = pub{}
			if !p.Null() {
				m.push = pushPub
				err = p.pubObject(&m.pub)
			}
		case "unsubscribe", "disconnect":
			m.code, m.reason = 0, nil
			if !p.Null() {
				m.push = pushUnsubscribe
				if string(key) == "disconnect" {
					m.push = pushDisconnect
				}
				err = p.codeObject(m)
			}
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
}

// codeObject reads the code and reason of an unsubscribe or disconnect.
func (p *parser) codeObject(m *msg) error {
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "code":
			m.code, err = p.Uint()
		case "reason":
			m.reason, err = p.Str()
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) pubObject(pb *pub) error {
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "data":
			pb.body = nil
			if !p.Null() {
				err = p.data(pb)
			}
		case "info":
			pb.user, pb.client = nil, nil
			if !p.Null() {
				err = p.info(pb)
			}
		case "offset":
			pb.offset, err = p.Uint()
		case "epoch":
			pb.epoch, err = p.Str()
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
}

// data reads the publication's payload: imcanary's is {"b":"BODY"}. Any
// other payload is skipped and leaves body nil, which the ledger counts as
// malformed.
func (p *parser) data(pb *pub) error {
	if p.I >= len(p.B) || p.B[p.I] != '{' {
		return p.Skip(0)
	}
	p.I++
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		if string(key) == "b" {
			pb.body = nil
			if p.I < len(p.B) && p.B[p.I] == '"' {
				pb.body, err = p.Str()
			} else {
				err = p.Skip(0)
			}
		} else {
			err = p.Skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) info(pb *pub) error {
	if err := p.Open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "user":
			pb.user, err = p.Str()
		case "client":
			pb.client, err = p.Str()
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return err
		}
	}
}

// result reads a connect, subscribe, publish, refresh or history result:
// the fields of all of them that imcanary uses share one struct.
func (p *parser) result(m *msg, kind int) error {
	m.result, m.res = resNone, result{}
	if p.Null() {
		return nil
	}
	m.result = kind
	if err := p.Open(); err != nil {
		return err
	}
	r := &m.res
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "client":
			r.client, err = p.Str()
		case "epoch":
			r.epoch, err = p.Str()
		case "offset":
			r.offset, err = p.Uint()
		case "ping":
			r.ping, err = p.Uint()
		case "ttl":
			r.ttl, err = p.Uint()
		case "pong":
			r.pong, err = p.Bool()
		case "expires":
			r.expires, err = p.Bool()
		case "recoverable":
			r.recoverable, err = p.Bool()
		case "recovered":
			r.recovered, err = p.Bool()
		case "was_recovering":
			r.wasRecov, err = p.Bool()
		case "publications":
			r.pubsLo, r.pubsHi = 0, 0
			if !p.Null() {
				lo := p.I
				if p.I >= len(p.B) || p.B[p.I] != '[' {
					return p.Errorf("expected array")
				}
				if err = p.Skip(0); err == nil {
					r.pubsLo, r.pubsHi = lo, p.I
				}
			}
		default:
			err = p.Skip(0)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
}

// parsePubs calls fn for each publication of a raw publications array, as
// a subscribe result recovers them and a history result returns them. It
// stops at fn's first error.
func parsePubs(b []byte, fn func(*pub) error) error {
	p := parser{jsonscan.Scanner{B: b}}
	p.WS()
	if !p.Eat('[') {
		return p.Errorf("expected '['")
	}
	var pb pub
	for first := true; ; first = false {
		p.WS()
		if p.Eat(']') {
			return p.End()
		}
		if !first && !p.Eat(',') {
			return p.Errorf("expected ',' or ']'")
		}
		p.WS()
		pb = pub{}
		if err := p.pubObject(&pb); err != nil {
			return err
		}
		if err := fn(&pb); err != nil {
			return err
		}
	}
}
