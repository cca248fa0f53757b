package reference

import (
	"testing"

	"github.com/imcanary/imcanary/probe"
)

// nopHandler counts deliveries and keeps nothing.
type nopHandler struct{ n int }

func (*nopHandler) OnAck(uint64, probe.Ack)        {}
func (*nopHandler) OnReject(uint64, string)        {}
func (h *nopHandler) OnDelivery(d *probe.Delivery) { h.n++ }

// BenchmarkSessionFrame is a push through the session's frame handling,
// parse and scratch included, with no ledger: what the adapter adds to
// BenchmarkDeliveryPath's parser.
func BenchmarkSessionFrame(b *testing.B) {
	d, err := New(Options{URL: "ws://127.0.0.1:1/ws"})
	if err != nil {
		b.Fatal(err)
	}
	h := &nopHandler{}
	s := &session{d: d, h: h}
	frame := []byte(`{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"123456","seq":77,"body":"imcanary1 run1 imcanary-u17 g.imcanary-g3 1 1733300000000000000 pad"}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Frame(frame, 1); err != nil {
			b.Fatal(err)
		}
	}
	if h.n == 0 {
		b.Fatal("no delivery reached the handler")
	}
}
