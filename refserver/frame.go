package refserver

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// inFrame is every client frame. Decoding goes through encoding/json: the
// server's own cost is not what imcanary measures, and one lenient struct
// keeps the protocol in a single place.
type inFrame struct {
	Type    string   `json:"type"`
	ID      string   `json:"id"`
	User    string   `json:"user"`
	Token   string   `json:"token"`
	Group   string   `json:"group"`
	Members []string `json:"members"`
	To      string   `json:"to"`
	// Conv, After and Limit are a history request's. Limit is a pointer
	// so that an absent limit (the default page) differs from 0.
	Conv  string `json:"conv"`
	After uint64 `json:"after"`
	Limit *int   `json:"limit"`
	// Body stays raw so a delivery carries the sender's bytes verbatim and
	// the hot path never re-escapes it. RawMessage copies, which matters:
	// the read buffer goes back to a pool once the frame is handled.
	Body json.RawMessage `json:"body"`
}

// The outgoing frames below are built by appending, without reflection:
// msg and ack are written once per message (msg once per fan-out, shared by
// every recipient), which makes them the server's hot path.

// appendAck appends {"type":"ack","id":…,"msg_id":"…","conv":…,"seq":…}.
func appendAck(dst []byte, id string, msgID uint64, conv string, seq uint64) []byte {
	dst = append(dst, `{"type":"ack","id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"msg_id":"`...)
	dst = strconv.AppendUint(dst, msgID, 10)
	dst = append(dst, `","conv":`...)
	dst = appendString(dst, conv)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	return append(dst, '}')
}

// appendMsg appends a delivery. toKey is "to" for a direct message and
// "group" for a group message; body is already a valid JSON string.
func appendMsg(dst []byte, from, toKey, to, conv string, msgID, seq uint64, body []byte) []byte {
	dst = append(dst, `{"type":"msg","from":`...)
	dst = appendString(dst, from)
	dst = append(dst, ',', '"')
	dst = append(dst, toKey...)
	dst = append(dst, '"', ':')
	dst = appendString(dst, to)
	dst = append(dst, `,"conv":`...)
	dst = appendString(dst, conv)
	dst = append(dst, `,"msg_id":"`...)
	dst = strconv.AppendUint(dst, msgID, 10)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"body":`...)
	dst = append(dst, body...)
	return append(dst, '}')
}

// msgPrefix is how every msg frame from appendMsg begins; a history
// answer inserts its "id" right after it.
const msgPrefix = `{"type":"msg",`

// appendHistMsg appends msg, a frame from appendMsg, with "id":id added:
// a message in a history answer.
func appendHistMsg(dst []byte, id string, msg []byte) []byte {
	dst = append(dst, msgPrefix...)
	dst = append(dst, `"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, ',')
	return append(dst, msg[len(msgPrefix):]...)
}

// appendHistOK appends the end of a history answer:
// {"type":"ok","id":…,"conv":…,"last":…,"first":…,"more":…}.
func appendHistOK(dst []byte, id, conv string, last, first uint64, more bool) []byte {
	dst = append(dst, `{"type":"ok","id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"conv":`...)
	dst = appendString(dst, conv)
	dst = append(dst, `,"last":`...)
	dst = strconv.AppendUint(dst, last, 10)
	dst = append(dst, `,"first":`...)
	dst = strconv.AppendUint(dst, first, 10)
	dst = append(dst, `,"more":`...)
	dst = strconv.AppendBool(dst, more)
	return append(dst, '}')
}

// convSeq is one conversation's newest seq, for a seqs answer.
type convSeq struct {
	conv string
	seq  uint64
}

// appendSeqs appends {"type":"seqs","id":…,"convs":{…}} listing convs in
// their order, cut before the frame would pass maxBytes; a cut list is
// followed by "more":true.
func appendSeqs(dst []byte, id string, convs []convSeq, maxBytes int) []byte {
	dst = append(dst, `{"type":"seqs","id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"convs":{`...)
	// Room for the closing `},"more":true}`.
	const tail = len(`},"more":true}`)
	more := false
	for i, c := range convs {
		n := len(dst)
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, c.conv)
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, c.seq, 10)
		if len(dst)+tail > maxBytes {
			dst, more = dst[:n], true
			break
		}
	}
	dst = append(dst, '}')
	if more {
		dst = append(dst, `,"more":true`...)
	}
	return append(dst, '}')
}

// appendReply appends {"type":typ,"id":id}: login_ok, ok and pong.
func appendReply(dst []byte, typ, id string) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","id":`...)
	dst = appendString(dst, id)
	return append(dst, '}')
}

// appendError appends {"type":"error","id":…,"code":…,"message":…}.
func appendError(dst []byte, id, code, msg string) []byte {
	dst = append(dst, `{"type":"error","id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"code":`...)
	dst = appendString(dst, code)
	dst = append(dst, `,"message":`...)
	dst = appendString(dst, msg)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. It escapes what JSON requires,
// replaces invalid UTF-8 with U+FFFD as encoding/json does, and escapes
// U+2028 and U+2029 so the output is also valid JavaScript. It does not
// escape <, > and &: frames never end up in HTML.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
