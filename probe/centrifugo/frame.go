package centrifugo

import (
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
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

// result is the union of the connect, subscribe and refresh results.
type result struct {
	epoch                                           []byte
	offset, ping, ttl                               uint64
	pong, expires, recoverable, recovered, wasRecov bool
	// pubsLo and pubsHi delimit the raw publications array of a
	// subscribe result in the frame; parsePubs reads it.
	pubsLo, pubsHi int
}

// pub is a publication: a push's or one recovered by a subscribe.
type pub struct {
	// body is data.b, the probe body; nil if data has no string "b".
	body   []byte
	user   []byte // info.user, the publisher
	epoch  []byte
	offset uint64
}

// maxDepth bounds the nesting of values the parser skips over, so that a
// hostile frame of a million '[' cannot exhaust the stack.
const maxDepth = 32

var errEOF = errors.New("unexpected end of frame")

type parser struct {
	b []byte
	i int
}

// more skips whitespace and reports whether another message follows.
func (p *parser) more() bool {
	p.ws()
	return p.i < len(p.b)
}

// message parses the next message of the frame into m.
func (p *parser) message(m *msg) error {
	*m = msg{}
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		m.fields++
		switch string(key) {
		case "id":
			m.id, err = p.uint()
		case "error":
			m.hasErr, m.errCode, m.errMsg = false, 0, nil
			if !p.null() {
				m.hasErr = true
				err = p.errorObject(m)
			}
		case "push":
			m.push, m.channel, m.pub, m.code, m.reason = pushNone, nil, pub{}, 0, nil
			if !p.null() {
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
		default:
			err = p.skip(0)
		}
		if err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
	}
}

func (p *parser) errorObject(m *msg) error {
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "code":
			m.errCode, err = p.uint()
		case "message":
			m.errMsg, err = p.str()
		default:
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) pushObject(m *msg) error {
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "channel":
			m.channel, err = p.str()
		case "pub":
			m.pub = pub{}
			if !p.null() {
				m.push = pushPub
				err = p.pubObject(&m.pub)
			}
		case "unsubscribe", "disconnect":
			m.code, m.reason = 0, nil
			if !p.null() {
				m.push = pushUnsubscribe
				if string(key) == "disconnect" {
					m.push = pushDisconnect
				}
				err = p.codeObject(m)
			}
		default:
			err = p.skip(0)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
}

// codeObject reads the code and reason of an unsubscribe or disconnect.
func (p *parser) codeObject(m *msg) error {
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "code":
			m.code, err = p.uint()
		case "reason":
			m.reason, err = p.str()
		default:
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) pubObject(pb *pub) error {
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "data":
			pb.body = nil
			if !p.null() {
				err = p.data(pb)
			}
		case "info":
			pb.user = nil
			if !p.null() {
				err = p.info(pb)
			}
		case "offset":
			pb.offset, err = p.uint()
		case "epoch":
			pb.epoch, err = p.str()
		default:
			err = p.skip(0)
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
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return p.skip(0)
	}
	p.i++
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		if string(key) == "b" {
			pb.body = nil
			if p.i < len(p.b) && p.b[p.i] == '"' {
				pb.body, err = p.str()
			} else {
				err = p.skip(0)
			}
		} else {
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
}

func (p *parser) info(pb *pub) error {
	if err := p.open(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		if string(key) == "user" {
			pb.user, err = p.str()
		} else {
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
}

// result reads a connect, subscribe, publish or refresh result: the fields
// of all of them that imcanary uses share one struct.
func (p *parser) result(m *msg, kind int) error {
	m.result, m.res = resNone, result{}
	if p.null() {
		return nil
	}
	m.result = kind
	if err := p.open(); err != nil {
		return err
	}
	r := &m.res
	for first := true; ; first = false {
		key, ok, err := p.field(first)
		if err != nil || !ok {
			return err
		}
		switch string(key) {
		case "epoch":
			r.epoch, err = p.str()
		case "offset":
			r.offset, err = p.uint()
		case "ping":
			r.ping, err = p.uint()
		case "ttl":
			r.ttl, err = p.uint()
		case "pong":
			r.pong, err = p.bool()
		case "expires":
			r.expires, err = p.bool()
		case "recoverable":
			r.recoverable, err = p.bool()
		case "recovered":
			r.recovered, err = p.bool()
		case "was_recovering":
			r.wasRecov, err = p.bool()
		case "publications":
			r.pubsLo, r.pubsHi = 0, 0
			if !p.null() {
				lo := p.i
				if p.i >= len(p.b) || p.b[p.i] != '[' {
					return p.errorf("expected array")
				}
				if err = p.skip(0); err == nil {
					r.pubsLo, r.pubsHi = lo, p.i
				}
			}
		default:
			err = p.skip(0)
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
}

// parsePubs calls fn for each publication of a raw publications array, as
// a subscribe result recovers them. It stops at fn's first error.
func parsePubs(b []byte, fn func(*pub) error) error {
	p := parser{b: b}
	p.ws()
	if !p.eat('[') {
		return p.errorf("expected '['")
	}
	var pb pub
	for first := true; ; first = false {
		p.ws()
		if p.eat(']') {
			return p.end()
		}
		if !first && !p.eat(',') {
			return p.errorf("expected ',' or ']'")
		}
		p.ws()
		pb = pub{}
		if err := p.pubObject(&pb); err != nil {
			return err
		}
		if err := fn(&pb); err != nil {
			return err
		}
	}
}

// open expects the '{' of an object.
func (p *parser) open() error {
	p.ws()
	if !p.eat('{') {
		return p.errorf("expected '{'")
	}
	return nil
}

// field reads the next key of an object and the ':' after it; ok is false
// once the closing '}' is consumed.
func (p *parser) field(first bool) (key []byte, ok bool, err error) {
	p.ws()
	if p.eat('}') {
		return nil, false, nil
	}
	if !first {
		if !p.eat(',') {
			return nil, false, p.errorf("expected ',' or '}'")
		}
		p.ws()
	}
	if key, err = p.str(); err != nil {
		return nil, false, err
	}
	p.ws()
	if !p.eat(':') {
		return nil, false, p.errorf("expected ':'")
	}
	p.ws()
	return key, true, nil
}

func (p *parser) errorf(msg string) error {
	if p.i >= len(p.b) {
		return errEOF
	}
	return fmt.Errorf("%s at offset %d", msg, p.i)
}

func (p *parser) end() error {
	p.ws()
	if p.i != len(p.b) {
		return p.errorf("trailing data")
	}
	return nil
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// null consumes a null literal if one is next.
func (p *parser) null() bool {
	if len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		return true
	}
	return false
}

// str parses a string, or null as nil, and returns its unescaped content,
// which overwrites the frame in place when the string has escapes.
func (p *parser) str() ([]byte, error) {
	if p.null() {
		return nil, nil
	}
	if !p.eat('"') {
		return nil, p.errorf("expected string")
	}
	start := p.i
	// Fast path: no escapes, valid UTF-8, as probe frames are.
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return s, nil
		case c == '\\':
			return p.unescape(start, true)
		case c < 0x20:
			return nil, p.errorf("control character in string")
		}
		p.i++
	}
	return nil, errEOF
}

// skipStr validates a string without changing the frame.
func (p *parser) skipStr() error {
	p.i++ // the opening quote, checked by the caller
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if !utf8.Valid(p.b[start : p.i-1]) {
				return fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return nil
		case c == '\\':
			_, err := p.unescape(start, false)
			return err
		case c < 0x20:
			return p.errorf("control character in string")
		}
		p.i++
	}
	return errEOF
}

// unescape continues a string from its first backslash. With write, it
// writes the unescaped string over the escaped one and returns it; without,
// it only validates, and checks the UTF-8 of the unescaped runs.
func (p *parser) unescape(start int, write bool) ([]byte, error) {
	w := p.i
	run := p.i // start of the current unescaped run, when not writing
	if !utf8.Valid(p.b[start:p.i]) {
		return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if !write {
				if !utf8.Valid(p.b[run : p.i-1]) {
					return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
				}
				return nil, nil
			}
			s := p.b[start:w]
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return s, nil
		case c < 0x20:
			return nil, p.errorf("control character in string")
		case c != '\\':
			if write {
				p.b[w] = c
				w++
			}
			p.i++
			continue
		}
		if !write && !utf8.Valid(p.b[run:p.i]) {
			return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
		}
		if p.i+1 >= len(p.b) {
			return nil, errEOF
		}
		e := p.b[p.i+1]
		p.i += 2
		var r byte
		switch e {
		case '"', '\\', '/':
			r = e
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			ru, err := p.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(ru) {
				// A surrogate pair is two escapes; a lone half is
				// replaced, as encoding/json does.
				lo := rune(-1)
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if lo, err = p.hex4(); err != nil {
						return nil, err
					}
					if utf16.DecodeRune(ru, lo) == utf8.RuneError {
						p.i = save
						lo = -1
					}
				}
				if lo >= 0 {
					ru = utf16.DecodeRune(ru, lo)
				} else {
					ru = utf8.RuneError
				}
			}
			if write {
				// Six escaped bytes always hold the at most four
				// encoded ones.
				w += utf8.EncodeRune(p.b[w:], ru)
			}
			run = p.i
			continue
		default:
			return nil, p.errorf("bad escape")
		}
		if write {
			p.b[w] = r
			w++
		}
		run = p.i
	}
	return nil, errEOF
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.b) {
		return 0, errEOF
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, p.errorf("bad \\u escape")
		}
	}
	p.i += 4
	return r, nil
}

// uint parses a non-negative integer that fits in 64 bits, or null as 0.
func (p *parser) uint() (uint64, error) {
	if p.null() {
		return 0, nil
	}
	start := p.i
	var n uint64
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, fmt.Errorf("number out of range at offset %d", start)
		}
		n = n*10 + d
		p.i++
	}
	if p.i == start {
		return 0, p.errorf("expected unsigned integer")
	}
	if p.i-start > 1 && p.b[start] == '0' {
		return 0, fmt.Errorf("leading zero at offset %d", start)
	}
	if p.i < len(p.b) {
		if c := p.b[p.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, fmt.Errorf("expected unsigned integer at offset %d", start)
		}
	}
	return n, nil
}

// bool parses true or false, or null as false.
func (p *parser) bool() (bool, error) {
	switch {
	case p.null():
		return false, nil
	case p.lit("true") == nil:
		return true, nil
	case p.lit("false") == nil:
		return false, nil
	}
	return false, p.errorf("expected boolean")
}

// skip validates and discards one JSON value, leaving the frame untouched.
func (p *parser) skip(depth int) error {
	if depth > maxDepth {
		return p.errorf("nesting too deep")
	}
	if p.i >= len(p.b) {
		return errEOF
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return p.skipStr()
	case c == '{' || c == '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		p.i++
		p.ws()
		if p.eat(closing) {
			return nil
		}
		for {
			p.ws()
			if c == '{' {
				if p.i >= len(p.b) || p.b[p.i] != '"' {
					return p.errorf("expected string")
				}
				if err := p.skipStr(); err != nil {
					return err
				}
				p.ws()
				if !p.eat(':') {
					return p.errorf("expected ':'")
				}
				p.ws()
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.eat(',') {
				continue
			}
			if p.eat(closing) {
				return nil
			}
			return p.errorf("expected ',' or closing bracket")
		}
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	default:
		return p.errorf("unexpected character")
	}
}

func (p *parser) lit(s string) error {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return p.errorf("bad literal")
	}
	p.i += len(s)
	return nil
}

// number checks the JSON number grammar: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?
func (p *parser) number() error {
	p.eat('-')
	digits := func() int {
		n := 0
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.eat('0') {
		// no more integer digits allowed
	} else if digits() == 0 {
		return p.errorf("bad number")
	}
	if p.eat('.') && digits() == 0 {
		return p.errorf("bad number")
	}
	if p.eat('e') || p.eat('E') {
		if !p.eat('+') {
			p.eat('-')
		}
		if digits() == 0 {
			return p.errorf("bad number")
		}
	}
	return nil
}
