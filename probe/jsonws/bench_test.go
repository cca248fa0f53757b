package jsonws

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// inboxHandler is a session's handler that records deliveries in a
// ledger's inbox, as a device does.
type inboxHandler struct{ in *engine.Inbox }

func (h inboxHandler) OnAck(uint64, probe.Ack) {}
func (h inboxHandler) OnReject(uint64, string) {}
func (h inboxHandler) OnDelivery(d *probe.Delivery) {
	h.in.Receive(d.Body, d.At)
}

// frameSession returns a session of the shipped reference mapping that is
// handed frames directly, as its connection's read loop hands them.
func frameSession(tb testing.TB, h probe.Handler) *session {
	tb.Helper()
	d, err := New(loadSection(tb, "../../configs/jsonws-reference.yaml"), Options{URL: "ws://127.0.0.1:1/ws", Secret: []byte("s")})
	if err != nil {
		tb.Fatal(err)
	}
	s := &session{d: d, user: "imcanary-u18", msg: d.m.dec.newMsg(), h: h}
	s.handle = s.handleMsg
	return s
}

// appendFrame appends the reference protocol's frame of a group delivery
// of seq at intended.
func appendFrame(dst []byte, body *[]byte, seq uint64, intended int64) []byte {
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3"), Seq: seq, Intended: intended}
	*body = probe.AppendBody((*body)[:0], &h, 0)
	dst = append(dst, `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"123456","seq":77,"body":`...)
	dst = jsonscan.AppendString(dst, *body)
	return append(dst, '}')
}

// BenchmarkFrameToLedger measures a delivery from its frame's bytes to the
// ledger's counters through the shipped mapping of the reference protocol
// ("mapped"), beside the native reference adapter reading the same frames
// (conformance.BenchmarkFrames): compare the two.
func BenchmarkFrameToLedger(b *testing.B) { conformance.BenchmarkFrames(b, benchFrames()) }

// TestBenchFrames: the benchmark's frames are ones the mapping delivers.
func TestBenchFrames(t *testing.T) { conformance.CheckFrames(t, benchFrames()) }

// benchFrames is the reference protocol's delivery frame read through the
// mapping.
func benchFrames() conformance.Frames {
	return conformance.Frames{
		Name: "mapped",
		Build: func(dst, body []byte, _ uint64) []byte {
			dst = append(dst, `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"123456","seq":77,"body":`...)
			dst = jsonscan.AppendString(dst, body)
			return append(dst, '}')
		},
		Decoder: func(tb testing.TB, h probe.Handler) func([]byte, int64) error { return frameSession(tb, h).Frame },
	}
}

// TestMappedDeliveryDoesNotAllocate guards the mapped delivery path's
// budget: once a stream exists, a delivery frame costs no allocation.
func TestMappedDeliveryDoesNotAllocate(t *testing.T) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	start := time.Now().UnixNano()
	in := engine.NewLedger(set, "run1", time.Unix(0, start), 10*time.Second, 30*time.Second).NewInbox()
	s := frameSession(t, inboxHandler{in})
	var buf, body []byte
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		buf = appendFrame(buf[:0], &body, uint64(i), start+int64(i))
		if err := s.Frame(buf, start+int64(i)+1e6); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a mapped delivery allocates %v times, want 0", allocs)
	}
	if got := metrics.Value(set.Kind[metrics.Group].Cohort[metrics.Normal].Delivered); got < 1000 {
		t.Errorf("%v deliveries counted, want every frame's", got)
	}
}

// TestServerGapsWaitForStragglers: a seq seen out of order, as the ack of
// the session's own message after the next delivery, is no gap in the
// server's numbering; one never seen is, once holeGrace has passed.
func TestServerGapsWaitForStragglers(t *testing.T) {
	s := frameSession(t, inboxHandler{engine.NewLedger(metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground),
		"run1", time.Now(), time.Second, 2*time.Second).NewInbox()})
	s.lastSeq = map[string]uint64{}
	s.pending = map[uint64]uint64{9: 1}
	at := time.Now().UnixNano()
	msg := func(seq int) []byte {
		return []byte(`{"type":"msg","from":"u2","conv":"g:g1","seq":` + strconv.Itoa(seq) + `,"body":"x"}`)
	}
	for _, f := range [][]byte{
		msg(1), msg(3), // 2 is the session's own, acked late
		[]byte(`{"type":"ack","id":"9","conv":"g:g1","seq":2}`),
		msg(4), msg(6), // 5 never comes
	} {
		if err := s.Frame(f, at); err != nil {
			t.Fatal(err)
		}
	}
	if g, _ := s.d.ServerGaps(); g != 0 {
		t.Fatalf("gaps = %d within the grace, want 0", g)
	}
	if err := s.Frame(msg(7), at+holeGrace); err != nil {
		t.Fatal(err)
	}
	if g, m := s.d.ServerGaps(); g != 1 || m != 1 {
		t.Errorf("gaps, missed = %d, %d after the grace, want 1, 1: seq 5 only", g, m)
	}
}
