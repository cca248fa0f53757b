package centrifugo

import (
	"testing"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
)

// BenchmarkFrameToLedger measures a group delivery from a publication
// push's bytes to the ledger's counters through this adapter (the push's
// JSON scanned in place, the channel's position), beside the native
// reference adapter (conformance.BenchmarkFrames).
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// TestBenchFrames: the benchmark's frames are ones the adapter delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

// benchFrames is a publication push of a group message and a session's
// frame handling, its position in the group's channel known.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name:  "centrifugo",
		Build: func(dst, body []byte, seq uint64) []byte { return pushFrame(dst, body, seq) },
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error {
			d, err := New(Config{}, Options{URL: "ws://x", Secret: testSecret})
			if err != nil {
				tb.Fatal(err)
			}
			st := &devState{pos: map[string]*position{"chat:imcanary-g3": {epoch: "EP", known: true}}}
			s := &session{d: d, user: "imcanary-u1", userB: []byte("imcanary-u1"), st: st, acks: map[uint32]uint64{}}
			return func(frame []byte, at int64) error {
				s.delivery.At = at
				return s.handleFrame(frame, h)
			}
		},
	}
}
