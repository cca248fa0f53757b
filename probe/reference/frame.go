package reference

import (
	"fmt"

	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// frame holds the fields imcanary needs from one server frame. Its slices
// alias the frame's bytes.
type frame struct {
	typ, id, from, group, conv, msgID, body, code, message []byte
	seq, last, first                                       uint64
	more                                                   bool
	// convs is the raw object of a seqs answer, conversation to newest
	// seq, read by eachConv.
	convs []byte
}

// parseFrame extracts the known fields of a server frame: one JSON object.
//
// It is a hand-written parser because it runs for every delivery: it does
// not allocate, and it unescapes strings in place (an unescaped JSON string
// is never longer than its escaped form). It still checks the whole frame
// is valid JSON, since a frame it cannot vouch for must end the session
// rather than be half-read. Unknown fields are skipped.
func parseFrame(b []byte, f *frame) error {
	*f = frame{}
	p := jsonscan.Scanner{B: b}
	p.WS()
	if !p.Eat('{') {
		return p.Errorf("expected '{'")
	}
	p.WS()
	if p.Eat('}') {
		return p.End()
	}
	for {
		p.WS()
		key, err := p.Str()
		if err != nil {
			return err
		}
		p.WS()
		if !p.Eat(':') {
			return p.Errorf("expected ':'")
		}
		p.WS()
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
		case "conv":
			dst = &f.conv
		case "seq":
			if f.seq, err = p.Uint(); err != nil {
				return err
			}
		case "last":
			if f.last, err = p.Uint(); err != nil {
				return err
			}
		case "first":
			if f.first, err = p.Uint(); err != nil {
				return err
			}
		case "more":
			if f.more, err = p.Bool(); err != nil {
				return err
			}
		case "convs":
			start := p.I
			if err := p.Skip(0); err != nil {
				return err
			}
			f.convs = p.B[start:p.I]
		default:
			if err := p.Skip(0); err != nil {
				return err
			}
		}
		if dst != nil {
			if *dst, err = p.Str(); err != nil {
				return fmt.Errorf("field %q: %w", key, err)
			}
		}
		p.WS()
		if p.Eat(',') {
			continue
		}
		if p.Eat('}') {
			return p.End()
		}
		return p.Errorf("expected ',' or '}'")
	}
}

// eachConv calls fn with each conversation and newest seq of a seqs
// answer's convs object, which parseFrame has checked is valid JSON; an
// entry that is not a whole number is an error.
func eachConv(convs []byte, fn func(conv []byte, last uint64)) error {
	if len(convs) == 0 {
		return nil
	}
	p := jsonscan.Scanner{B: convs}
	if err := p.Open(); err != nil {
		return fmt.Errorf("convs: %w", err)
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil {
			return fmt.Errorf("convs: %w", err)
		}
		if !ok {
			return nil
		}
		last, err := p.Uint()
		if err != nil {
			return fmt.Errorf("convs %q: %w", key, err)
		}
		fn(key, last)
	}
}
