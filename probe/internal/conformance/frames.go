package conformance

import (
	"cmp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/reference"
)

// Frames is an adapter's delivery frame and what reads it, for
// BenchmarkFrames.
type Frames struct {
	// Name names the adapter's sub-benchmark ("mqtt5").
	Name string
	// Sender and Group are the user and the group the frames carry
	// (default imcanary-u17 and imcanary-g3); the bodies name them too.
	Sender, Group string
	// Build appends the frame by which the server delivers body, the
	// group message seq of Group from Sender, as a server sends it.
	Build func(dst, body []byte, seq uint64) []byte
	// Decoder returns what reads one such frame, read off the socket at
	// at (Unix ns), into h, as the session's read loop does. It may keep
	// state from frame to frame, as a session does.
	Decoder func(tb testing.TB, h probe.Handler) func(frame []byte, at int64) error
}

// BenchmarkFrames measures one group delivery from its frame's bytes to
// the ledger's counters through each adapter of fs, and through the
// reference adapter ("reference"), in one run: compare them. "build" is
// the construction of fs[0]'s frame, which each adapter's figure
// includes; the reference frame's is small. Each fails unless every frame
// it read was counted a delivery.
func BenchmarkFrames(b *testing.B, fs ...Frames) {
	sender, group := cmp.Or(fs[0].Sender, "imcanary-u17"), cmp.Or(fs[0].Group, "imcanary-g3")
	runs := []struct {
		name  string
		build func(dst, body []byte, seq uint64) []byte
		dec   func(testing.TB, probe.Handler) func([]byte, int64) error
	}{
		{"build", fs[0].Build, nil},
		{"reference", func(dst, body []byte, _ uint64) []byte { return appendReference(dst, body, sender, group) },
			func(_ testing.TB, h probe.Handler) func([]byte, int64) error { return reference.NewDecoder(h).Frame }},
	}
	for _, f := range fs {
		runs = append(runs, struct {
			name  string
			build func(dst, body []byte, seq uint64) []byte
			dec   func(testing.TB, probe.Handler) func([]byte, int64) error
		}{f.Name, f.Build, f.Decoder})
	}
	for _, r := range runs {
		b.Run(r.name, func(b *testing.B) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
			start := time.Now().UnixNano()
			in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
			var read func([]byte, int64) error
			if r.dec != nil {
				read = r.dec(b, probetest.InboxHandler{In: in})
			}
			var buf, body []byte
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				h := probe.Header{Run: []byte("run1"), Sender: []byte(sender), Stream: []byte("g." + group), Seq: uint64(i + 1), Intended: start + int64(i)}
				body = probe.AppendBody(body[:0], &h, 0)
				buf = r.build(buf[:0], body, uint64(i+1))
				if read == nil {
					continue
				}
				if err := read(buf, start+int64(i)+1e6); err != nil {
					b.Fatal(err)
				}
			}
			if read != nil && metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered) < float64(b.N) {
				b.Fatalf("%v deliveries counted of %d frames", metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered), b.N)
			}
		})
	}
}

// appendReference appends the reference protocol's frame of the same
// delivery.
func appendReference(dst, body []byte, sender, group string) []byte {
	dst = append(dst, `{"type":"msg","from":"`...)
	dst = append(dst, sender...)
	dst = append(dst, `","group":"`...)
	dst = append(dst, group...)
	dst = append(dst, `","conv":"g:`...)
	dst = append(dst, group...)
	dst = append(dst, `","msg_id":"123456","seq":77,"body":`...)
	dst = jsonscan.AppendString(dst, body)
	return append(dst, '}')
}

// CheckFrames reads 100 frames of each adapter of fs, and of the
// reference adapter, and fails unless each was counted a delivery: the
// benchmark's frames stay ones the adapters deliver, checked without
// running benchmarks.
func CheckFrames(t *testing.T, fs ...Frames) {
	sender, group := cmp.Or(fs[0].Sender, "imcanary-u17"), cmp.Or(fs[0].Group, "imcanary-g3")
	fs = append(fs, Frames{Name: "reference",
		Build: func(dst, body []byte, _ uint64) []byte { return appendReference(dst, body, sender, group) },
		Decoder: func(_ testing.TB, h probe.Handler) func([]byte, int64) error {
			return reference.NewDecoder(h).Frame
		}})
	const n = 100
	for _, f := range fs {
		t.Run(f.Name, func(t *testing.T) {
			set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
			start := time.Now().UnixNano()
			read := f.Decoder(t, probetest.InboxHandler{In: engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()})
			for i := range n {
				h := probe.Header{Run: []byte("run1"), Sender: []byte(sender), Stream: []byte("g." + group), Seq: uint64(i + 1), Intended: start + int64(i)}
				if err := read(f.Build(nil, probe.AppendBody(nil, &h, 0), uint64(i+1)), start+int64(i)+1e6); err != nil {
					t.Fatalf("frame %d: %v", i+1, err)
				}
			}
			if got := metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered); got != n {
				t.Errorf("%v deliveries counted of %d frames", got, n)
			}
		})
	}
}
