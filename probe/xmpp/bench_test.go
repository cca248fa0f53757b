package xmpp

import (
	"strconv"
	"testing"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
)

// BenchmarkFrameToLedger measures a group delivery from a groupchat
// message's bytes to the ledger's counters through this adapter (the XML
// tokenizer, the stanza's children, the room's occupant), beside the
// native reference adapter (conformance.BenchmarkFrames).
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

// benchFrames is a room's groupchat message from another occupant, as
// Prosody sends it, and a session's stanza handling.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name: "xmpp",
		Build: func(dst, body []byte, seq uint64) []byte {
			dst = append(dst, `<message xmlns='jabber:client' type='groupchat' from='imcanary-g3@conference.localhost/imcanary-u17' id='`...)
			dst = strconv.AppendUint(dst, seq, 10)
			dst = append(dst, `'><body>`...)
			dst = append(dst, body...) // a probe body needs no escaping
			return append(dst, `</body><stanza-id xmlns='urn:xmpp:sid:0' by='imcanary-g3@conference.localhost' id='r1'/></message>`...)
		},
		Decoder: func(_ testing.TB, h probe.Handler) func([]byte, int64) error {
			s := &session{h: h, nick: "imcanary-u1"}
			return func(frame []byte, at int64) error {
				s.delivery.At = at
				st := stanzaPool.Get().(*stanza)
				err := parseFrame(frame, st, s.handleStanza)
				stanzaPool.Put(st)
				return err
			}
		},
	}
}
