package probe

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// The probe body is plain ASCII separated by single spaces, so that every
// protocol can carry it verbatim (JSON strings, XML text, protobuf bytes)
// without escaping, and a receiver can parse it without allocating:
//
//	imc1 RUN SENDER STREAM SEQ INTENDED_NS VOID_LO-VOID_HI [PADDING]
//
// RUN identifies the sending process, SENDER the user, STREAM the sender's
// conversation ("d.PEER" or "g.GROUP"); SEQ counts from 1 within (RUN,
// SENDER, STREAM). INTENDED_NS is the scheduled send time in Unix
// nanoseconds: latency is measured from it, so a sender that falls behind
// shows up as latency instead of hiding it. VOID_LO-VOID_HI names sequence
// numbers that the sender wrote but the server never acknowledged (0-0 for
// none): a receiver that misses them does not count them as lost, because the
// server never promised them.
//
// A sender whose recipients live in other processes (a population laid
// out across shards) adds, after the void span, what those receivers
// cannot see for themselves:
//
//	... VOID_LO-VOID_HI rRESOLVED [mOFFMASK] [bBEGUN] [PADDING]
//
// RESOLVED is the sender's resolved mark: every seq up to it was either
// acknowledged by the server or written off. OFFMASK (hexadecimal, left
// out when 0) has bit i set when seq RESOLVED-i was written off, so that
// each message repeats the fate of the 64 seqs below its mark, and a
// receiver that misses one message still learns them from the next.
// BEGUN is the intended time (Unix ns) of the stream's seq 1: a receiver
// that began before it is owed the stream from its start.
//
// Earlier versions read six fields and take the rest for padding, so
// they parse these bodies too; and a token that is not exactly one of
// these ends them here, so that whatever an earlier version accepted
// still parses the same.
//
// Nothing but the message itself links sender and receiver, which is what
// lets shards in different processes check each other.

const bodyMagic = "imc1"

// Header is a parsed probe body. Its slices alias the parsed body.
type Header struct {
	Run, Sender, Stream []byte
	Seq                 uint64
	Intended            int64
	VoidLo, VoidHi      uint64
	// HasResolved says the body carries the resolved mark; Resolved,
	// OffMask and Begun are what it carries (Begun 0 for none).
	HasResolved bool
	Resolved    uint64
	OffMask     uint64
	Begun       int64
}

// Errors returned by ParseBody.
var (
	ErrNotProbe    = errors.New("not a probe message")
	ErrBadBody     = errors.New("malformed probe message")
	errFieldNumber = errors.New("malformed probe message: bad number")
)

// AppendBody appends a probe body to dst, padded with 'x' to at least size
// bytes, and returns the extended slice.
func AppendBody(dst []byte, h *Header, size int) []byte {
	start := len(dst)
	dst = append(dst, bodyMagic...)
	dst = append(dst, ' ')
	dst = append(dst, h.Run...)
	dst = append(dst, ' ')
	dst = append(dst, h.Sender...)
	dst = append(dst, ' ')
	dst = append(dst, h.Stream...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, h.Seq, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, h.Intended, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, h.VoidLo, 10)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, h.VoidHi, 10)
	if h.HasResolved {
		dst = append(dst, " r"...)
		dst = strconv.AppendUint(dst, h.Resolved, 10)
	}
	if h.OffMask != 0 {
		dst = append(dst, " m"...)
		dst = strconv.AppendUint(dst, h.OffMask, 16)
	}
	if h.Begun > 0 {
		dst = append(dst, " b"...)
		dst = strconv.AppendInt(dst, h.Begun, 10)
	}
	if pad := size - (len(dst) - start); pad > 1 {
		dst = append(dst, ' ')
		for range pad - 1 {
			dst = append(dst, 'x')
		}
	}
	return dst
}

// ParseBody parses a probe body into h without allocating. It returns
// ErrNotProbe for a body that is not imcanary's and ErrBadBody (wrapped) for
// one that claims to be but is corrupt.
func ParseBody(b []byte, h *Header) error {
	rest, ok := bytes.CutPrefix(b, []byte(bodyMagic+" "))
	if !ok {
		return ErrNotProbe
	}
	var f [6][]byte
	for i := range f {
		var field []byte
		field, rest, _ = bytes.Cut(rest, []byte{' '})
		if len(field) == 0 {
			return ErrBadBody
		}
		f[i] = field
	}
	h.Run, h.Sender, h.Stream = f[0], f[1], f[2]
	var err error
	if h.Seq, err = parseUint(f[3]); err != nil || h.Seq == 0 {
		return errFieldNumber
	}
	iv, err := parseUint(f[4])
	if err != nil || iv > 1<<63-1 {
		return errFieldNumber
	}
	h.Intended = int64(iv)
	lo, hi, ok := bytes.Cut(f[5], []byte{'-'})
	if !ok {
		return ErrBadBody
	}
	if h.VoidLo, err = parseUint(lo); err != nil {
		return errFieldNumber
	}
	if h.VoidHi, err = parseUint(hi); err != nil || h.VoidHi < h.VoidLo {
		return errFieldNumber
	}
	h.HasResolved, h.Resolved, h.OffMask, h.Begun = false, 0, 0, 0
	parseMarks(rest, h)
	return nil
}

// parseMarks reads the optional tokens after the void span into h, in
// any order, each at most once; the first token that is not exactly one
// of them is padding, and ends them.
func parseMarks(rest []byte, h *Header) {
	var seen [3]bool
	// Padding ('x') is the common rest, and may be kilobytes: it ends
	// the marks before it is scanned for a space.
	for len(rest) > 1 && rest[0] != 'x' {
		var tok []byte
		tok, rest, _ = bytes.Cut(rest, []byte{' '})
		if len(tok) < 2 {
			return
		}
		var (
			n   uint64
			ok  bool
			idx int
		)
		switch tok[0] {
		case 'r':
			idx = 0
			n, ok = jsonscan.ParseUint(tok[1:])
		case 'm':
			idx = 1
			n, ok = parseHex(tok[1:])
		case 'b':
			idx = 2
			n, ok = jsonscan.ParseUint(tok[1:])
			ok = ok && n <= 1<<63-1
		}
		if !ok || seen[idx] {
			return
		}
		seen[idx] = true
		switch idx {
		case 0:
			h.HasResolved, h.Resolved = true, n
		case 1:
			h.OffMask = n
		case 2:
			h.Begun = int64(n)
		}
	}
}

// parseHex parses 1 to 16 lowercase hexadecimal digits.
func parseHex(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			n = n<<4 | uint64(c-'0')
		case 'a' <= c && c <= 'f':
			n = n<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return n, true
}

// parseUint parses a decimal field of a body.
func parseUint(b []byte) (uint64, error) {
	n, ok := jsonscan.ParseUint(b)
	if !ok {
		return 0, errFieldNumber
	}
	return n, nil
}

// StreamKey returns the "RUN SENDER STREAM" part of body, which ParseBody
// parsed into h: contiguous in body, so that indexing a map with
// string(key) does not allocate.
func StreamKey(body []byte, h *Header) []byte {
	return body[len(bodyMagic)+1 : len(bodyMagic)+1+len(h.Run)+1+len(h.Sender)+1+len(h.Stream)]
}
