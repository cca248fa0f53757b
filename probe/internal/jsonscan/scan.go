// Package jsonscan is the JSON scanner behind the protocol adapters'
// hand-written frame parsers. It runs for every delivery, so it does not
// allocate: strings are unescaped in place (an unescaped JSON string is
// never longer than its escaped form). It still checks the grammar of all
// it reads, so a frame it cannot vouch for is an error, never half-read.
// The adapters fuzz their parsers against encoding/json. Its one encoder,
// AppendString, writes the strings of the adapters' frames.
package jsonscan

import (
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds the nesting of values Skip goes into, so that a hostile
// frame of a million '[' cannot exhaust the stack.
const MaxDepth = 32

// ErrEOF is returned for a frame that ends in the middle of a value.
var ErrEOF = errors.New("unexpected end of frame")

// Scanner reads JSON from B, starting at I.
type Scanner struct {
	B []byte
	I int
}

// More skips whitespace and reports whether anything follows (several
// messages may share a frame).
func (p *Scanner) More() bool {
	p.WS()
	return p.I < len(p.B)
}

// open expects the '{' of an object.
func (p *Scanner) Open() error {
	p.WS()
	if !p.Eat('{') {
		return p.Errorf("expected '{'")
	}
	return nil
}

// field reads the next key of an object and the ':' after it; ok is false
// once the closing '}' is consumed.
func (p *Scanner) Field(first bool) (key []byte, ok bool, err error) {
	p.WS()
	if p.Eat('}') {
		return nil, false, nil
	}
	if !first {
		if !p.Eat(',') {
			return nil, false, p.Errorf("expected ',' or '}'")
		}
		p.WS()
	}
	if key, err = p.Str(); err != nil {
		return nil, false, err
	}
	p.WS()
	if !p.Eat(':') {
		return nil, false, p.Errorf("expected ':'")
	}
	p.WS()
	return key, true, nil
}

// Errorf returns msg at the current offset, or ErrEOF at the end.
func (p *Scanner) Errorf(msg string) error {
	if p.I >= len(p.B) {
		return ErrEOF
	}
	return fmt.Errorf("%s at offset %d", msg, p.I)
}

// End checks that nothing but whitespace follows.
func (p *Scanner) End() error {
	p.WS()
	if p.I != len(p.B) {
		return p.Errorf("trailing data")
	}
	return nil
}

// WS skips whitespace.
func (p *Scanner) WS() {
	for p.I < len(p.B) {
		switch p.B[p.I] {
		case ' ', '\t', '\n', '\r':
			p.I++
		default:
			return
		}
	}
}

// Eat consumes c if it is next.
func (p *Scanner) Eat(c byte) bool {
	if p.I < len(p.B) && p.B[p.I] == c {
		p.I++
		return true
	}
	return false
}

// null consumes a null literal if one is next.
func (p *Scanner) Null() bool {
	if len(p.B)-p.I >= 4 && string(p.B[p.I:p.I+4]) == "null" {
		p.I += 4
		return true
	}
	return false
}

// str parses a string, or null as nil, and returns its unescaped content,
// which overwrites the frame in place when the string has escapes.
func (p *Scanner) Str() ([]byte, error) {
	if p.Null() {
		return nil, nil
	}
	if !p.Eat('"') {
		return nil, p.Errorf("expected string")
	}
	start := p.I
	// Fast path: no escapes, valid UTF-8, as probe frames are.
	for p.I < len(p.B) {
		c := p.B[p.I]
		switch {
		case c == '"':
			s := p.B[start:p.I]
			p.I++
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return s, nil
		case c == '\\':
			return p.unescape(start, true)
		case c < 0x20:
			return nil, p.Errorf("control character in string")
		}
		p.I++
	}
	return nil, ErrEOF
}

// skipStr validates a string without changing the frame.
func (p *Scanner) SkipStr() error {
	p.I++ // the opening quote, checked by the caller
	start := p.I
	for p.I < len(p.B) {
		c := p.B[p.I]
		switch {
		case c == '"':
			p.I++
			if !utf8.Valid(p.B[start : p.I-1]) {
				return fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return nil
		case c == '\\':
			_, err := p.unescape(start, false)
			return err
		case c < 0x20:
			return p.Errorf("control character in string")
		}
		p.I++
	}
	return ErrEOF
}

// unescape continues a string from its first backslash. With write, it
// writes the unescaped string over the escaped one and returns it; without,
// it only validates, and checks the UTF-8 of the unescaped runs.
func (p *Scanner) unescape(start int, write bool) ([]byte, error) {
	w := p.I
	run := p.I // start of the current unescaped run, when not writing
	if !utf8.Valid(p.B[start:p.I]) {
		return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
	}
	for p.I < len(p.B) {
		c := p.B[p.I]
		switch {
		case c == '"':
			p.I++
			if !write {
				if !utf8.Valid(p.B[run : p.I-1]) {
					return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
				}
				return nil, nil
			}
			s := p.B[start:w]
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
			}
			return s, nil
		case c < 0x20:
			return nil, p.Errorf("control character in string")
		case c != '\\':
			if write {
				p.B[w] = c
				w++
			}
			p.I++
			continue
		}
		if !write && !utf8.Valid(p.B[run:p.I]) {
			return nil, fmt.Errorf("invalid UTF-8 in string at offset %d", start)
		}
		if p.I+1 >= len(p.B) {
			return nil, ErrEOF
		}
		e := p.B[p.I+1]
		p.I += 2
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
				if p.I+1 < len(p.B) && p.B[p.I] == '\\' && p.B[p.I+1] == 'u' {
					save := p.I
					p.I += 2
					if lo, err = p.hex4(); err != nil {
						return nil, err
					}
					if utf16.DecodeRune(ru, lo) == utf8.RuneError {
						p.I = save
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
				w += utf8.EncodeRune(p.B[w:], ru)
			}
			run = p.I
			continue
		default:
			return nil, p.Errorf("bad escape")
		}
		if write {
			p.B[w] = r
			w++
		}
		run = p.I
	}
	return nil, ErrEOF
}

func (p *Scanner) hex4() (rune, error) {
	if p.I+4 > len(p.B) {
		return 0, ErrEOF
	}
	var r rune
	for _, c := range p.B[p.I : p.I+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, p.Errorf("bad \\u escape")
		}
	}
	p.I += 4
	return r, nil
}

// uint parses a non-negative integer that fits in 64 bits, or null as 0.
func (p *Scanner) Uint() (uint64, error) {
	if p.Null() {
		return 0, nil
	}
	start := p.I
	var n uint64
	for p.I < len(p.B) && '0' <= p.B[p.I] && p.B[p.I] <= '9' {
		d := uint64(p.B[p.I] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, fmt.Errorf("number out of range at offset %d", start)
		}
		n = n*10 + d
		p.I++
	}
	if p.I == start {
		return 0, p.Errorf("expected unsigned integer")
	}
	if p.I-start > 1 && p.B[start] == '0' {
		return 0, fmt.Errorf("leading zero at offset %d", start)
	}
	if p.I < len(p.B) {
		if c := p.B[p.I]; c == '.' || c == 'e' || c == 'E' {
			return 0, fmt.Errorf("expected unsigned integer at offset %d", start)
		}
	}
	return n, nil
}

// bool parses true or false, or null as false.
func (p *Scanner) Bool() (bool, error) {
	switch {
	case p.Null():
		return false, nil
	case p.lit("true") == nil:
		return true, nil
	case p.lit("false") == nil:
		return false, nil
	}
	return false, p.Errorf("expected boolean")
}

// skip validates and discards one JSON value, leaving the frame untouched.
func (p *Scanner) Skip(depth int) error {
	if depth > MaxDepth {
		return p.Errorf("nesting too deep")
	}
	if p.I >= len(p.B) {
		return ErrEOF
	}
	switch c := p.B[p.I]; {
	case c == '"':
		return p.SkipStr()
	case c == '{' || c == '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		p.I++
		p.WS()
		if p.Eat(closing) {
			return nil
		}
		for {
			p.WS()
			if c == '{' {
				if p.I >= len(p.B) || p.B[p.I] != '"' {
					return p.Errorf("expected string")
				}
				if err := p.SkipStr(); err != nil {
					return err
				}
				p.WS()
				if !p.Eat(':') {
					return p.Errorf("expected ':'")
				}
				p.WS()
			}
			if err := p.Skip(depth + 1); err != nil {
				return err
			}
			p.WS()
			if p.Eat(',') {
				continue
			}
			if p.Eat(closing) {
				return nil
			}
			return p.Errorf("expected ',' or closing bracket")
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
		return p.Errorf("unexpected character")
	}
}

func (p *Scanner) lit(s string) error {
	if len(p.B)-p.I < len(s) || string(p.B[p.I:p.I+len(s)]) != s {
		return p.Errorf("bad literal")
	}
	p.I += len(s)
	return nil
}

// number checks the JSON number grammar: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?
func (p *Scanner) number() error {
	p.Eat('-')
	digits := func() int {
		n := 0
		for p.I < len(p.B) && '0' <= p.B[p.I] && p.B[p.I] <= '9' {
			p.I++
			n++
		}
		return n
	}
	if p.Eat('0') {
		// no more integer digits allowed
	} else if digits() == 0 {
		return p.Errorf("bad number")
	}
	if p.Eat('.') && digits() == 0 {
		return p.Errorf("bad number")
	}
	if p.Eat('e') || p.Eat('E') {
		if !p.Eat('+') {
			p.Eat('-')
		}
		if digits() == 0 {
			return p.Errorf("bad number")
		}
	}
	return nil
}
