package embedded

import (
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// frame holds the fields imcanary needs from one server frame. Its slices
// alias the frame's bytes.
type frame struct {
	typ, id, from, group, msgID, body, code, message []byte
	seq                                              uint64
}

// maxDepth bounds the nesting of values the parser skips over, so that a
// hostile frame of a million '[' cannot exhaust the stack.
const maxDepth = 32

// parseFrame extracts the known fields of a server frame: one JSON object.
//
// It is a hand-written parser because it runs for every delivery: it does
// not allocate, and it unescapes strings in place (an unescaped JSON string
// is never longer than its escaped form). It still checks the whole frame
// is valid JSON, since a frame it cannot vouch for must end the session
// rather than be half-read. Unknown fields are skipped.
func parseFrame(b []byte, f *frame) error {
	*f = frame{}
	p := parser{b: b}
	p.ws()
	if !p.eat('{') {
		return p.errorf("expected '{'")
	}
	p.ws()
	if p.eat('}') {
		return p.end()
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return err
		}
		p.ws()
		if !p.eat(':') {
			return p.errorf("expected ':'")
		}
		p.ws()
		var dst *[]byte
		switch string(key) {
		case "type":
			dst = &f.typ
		case "id":
			dst = &f.id
		case "from":
			dst = &f.from
		case "group":
			dst = &f.group
		case "msg_id":
			dst = &f.msgID
		case "body":
			dst = &f.body
		case "code":
			dst = &f.code
		case "message":
			dst = &f.message
		case "seq":
			if f.seq, err = p.uint(); err != nil {
				return err
			}
		default:
			if err := p.skip(0); err != nil {
				return err
			}
		}
		if dst != nil {
			if *dst, err = p.str(); err != nil {
				return fmt.Errorf("field %q: %w", key, err)
			}
		}
		p.ws()
		if p.eat(',') {
			continue
		}
		if p.eat('}') {
			return p.end()
		}
		return p.errorf("expected ',' or '}'")
	}
}

type parser struct {
	b []byte
	i int
}

var errEOF = errors.New("unexpected end of frame")

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

// str parses a string and returns its unescaped content, which overwrites
// the frame in place when the string has escapes.
func (p *parser) str() ([]byte, error) {
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
			return p.unescape(start)
		case c < 0x20:
			return nil, p.errorf("control character in string")
		}
		p.i++
	}
	return nil, errEOF
}

// unescape continues str from the first backslash, writing the unescaped
// string over the escaped one.
func (p *parser) unescape(start int) ([]byte, error) {
	w := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:w]
			p.i++
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return s, nil
		case c < 0x20:
			return nil, p.errorf("control character in string")
		case c != '\\':
			p.b[w] = c
			w++
			p.i++
			continue
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
			// Six escaped bytes always hold the at most four encoded ones.
			w += utf8.EncodeRune(p.b[w:], ru)
			continue
		default:
			return nil, p.errorf("bad escape")
		}
		p.b[w] = r
		w++
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

// uint parses a non-negative integer that fits in 64 bits.
func (p *parser) uint() (uint64, error) {
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
	return n, nil
}

// skip parses and discards one JSON value.
func (p *parser) skip(depth int) error {
	if depth > maxDepth {
		return p.errorf("nesting too deep")
	}
	if p.i >= len(p.b) {
		return errEOF
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, err := p.str()
		return err
	case c == '{' || c == '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		p.i++
		p.ws()
		if p.eat(close) {
			return nil
		}
		for {
			p.ws()
			if c == '{' {
				if _, err := p.str(); err != nil {
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
			if p.eat(close) {
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
