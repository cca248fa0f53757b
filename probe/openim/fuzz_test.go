package openim

import (
	"math"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/fuzzcorpus"
)

// recorder is a probe.Handler that keeps what it is given.
type recorder struct {
	acks       []uint64
	rejects    []uint64
	deliveries []probe.Delivery
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) { r.acks = append(r.acks, ref) }
func (r *recorder) OnReject(ref uint64, _ string) { r.rejects = append(r.rejects, ref) }
func (r *recorder) OnDelivery(d *probe.Delivery) {
	c := *d
	c.Body = append([]byte(nil), d.Body...)
	r.deliveries = append(r.deliveries, c)
}
func (r *recorder) count() int { return len(r.acks) + len(r.rejects) }

// fuzzSession returns a session with no connection, awaiting two sends, a
// newest seq and a pull, whose Catchup is never due: Frame reads but never
// writes.
func fuzzSession(t testing.TB) (*session, *recorder) {
	d, err := New(Config{APIURL: "http://127.0.0.1:1"}, Options{URL: "ws://127.0.0.1:1", Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{d: d, user: "alice", id: "alice", platform: 5, st: &devState{seqs: map[string]uint64{}, placed: map[string]bool{}}, cu: probe.NewCatchup(time.Second),
		acks: map[string]uint64{"1": 10, "2": 20}, pulls: map[string][]probe.Fetch{"3": {{Conv: "si_alice_bob", After: 0, N: 5}}},
		syncs: map[string]bool{"4": true}, dueAt: math.MaxInt64}
	r := &recorder{}
	s.h = r
	return s, r
}

// FuzzFrame hands arbitrary bytes to a session as frames from the gateway:
// whatever they are, reading never panics, each send awaited is acked or
// rejected at most once, and a delivery is only ever the text of a chat
// message. Seeds are frames captured from the real OpenIM v3.8.3 gateway
// (testdata; see the README there) and frames the tests' gateway builds
// from OpenIM's protobuf types.
func FuzzFrame(f *testing.F) {
	for _, s := range fuzzcorpus.Bytes(f, "testdata/fuzz/FuzzFrame") {
		f.Add(s)
	}
	f.Add([]byte(`{"type":"pong"}`))
	f.Add([]byte(`{"reqIdentifier":1003,"msgIncr":"1","errCode":0,"data":"CgNzaWQSA2NpZBgB"}`))
	f.Add([]byte(`{"reqIdentifier":2001,"data":"////"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, r := fuzzSession(t)
		for range 2 {
			if err := s.Frame(data, 1); err != nil {
				break
			}
		}
		if r.count() > 2 {
			t.Fatalf("%d acks and rejects for 2 sends", r.count())
		}
		for _, d := range r.deliveries {
			if len(d.From) == 0 {
				t.Fatalf("delivery from nobody: %+v", d)
			}
		}
	})
}
