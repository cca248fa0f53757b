package reference_test

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
)

// delivered records every first delivery's message and latency, one per
// recipient device.
type delivered struct {
	mu  sync.Mutex
	lat map[msgID][]time.Duration // recipient left empty
}

func (d *delivered) Login(int, time.Duration, error) {}
func (d *delivered) Disconnect(int, string, error)   {}
func (d *delivered) Ack(uint64, bool, time.Duration) {}
func (d *delivered) Unacked(uint64, string, string)  {}
func (d *delivered) Received(_ int, h *probe.Header, lat time.Duration, o engine.Outcome) {
	if o != engine.Delivered {
		return
	}
	d.mu.Lock()
	id := msgID{sender: string(h.Sender), stream: string(h.Stream), seq: h.Seq}
	d.lat[id] = append(d.lat[id], lat)
	d.mu.Unlock()
}

// latencyExemplars returns the exemplars of both kinds' delivery latency
// histograms (normal cohort).
func latencyExemplars(t *testing.T, set *metrics.Set) []*dto.Exemplar {
	t.Helper()
	var out []*dto.Exemplar
	for _, k := range set.Kind {
		var m dto.Metric
		if err := k.Cohort[metrics.Normal].DeliveryLatency.(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		for _, b := range m.Histogram.GetBucket() {
			if e := b.GetExemplar(); e != nil {
				out = append(out, e)
			}
		}
	}
	return out
}

// TestLatencyExemplarsNameSlowMessages: against a fast target the latency
// histogram carries no exemplar; once the target delays every delivery by
// 1.2 s, its exemplars name messages that were delivered that slowly, by
// sender, stream and seq, with their latency.
func TestLatencyExemplarsNameSlowMessages(t *testing.T) {
	rec := &delivered{lat: map[msgID][]time.Duration{}}
	pc := base
	pc.observer = rec
	fx := newFixture(t, refserver.Faults{}, pc)
	fx.soakStep(time.Second)
	for _, e := range latencyExemplars(t, fx.set) {
		// A loaded machine may make one delivery slow by itself; it
		// is then named, rightly. None may be fast.
		if e.GetValue() <= 1 {
			t.Errorf("exemplar %v on a fast delivery", e)
		}
	}
	fx.srv.SetFaults(refserver.Faults{Delay: 1200 * time.Millisecond})
	var ex []*dto.Exemplar
	testwait.For(t, 10*time.Second, "an exemplar of a delayed delivery", func() bool {
		ex = ex[:0]
		for _, e := range latencyExemplars(t, fx.set) {
			if e.GetValue() >= 1.2 {
				ex = append(ex, e)
			}
		}
		return len(ex) > 0
	})
	// The metric and the test's observer are told of a delivery one
	// after the other: give the observer a moment to catch up.
	named := func(e *dto.Exemplar) (msgID, []time.Duration, bool) {
		var id msgID
		for _, l := range e.GetLabel() {
			switch l.GetName() {
			case "sender":
				id.sender = l.GetValue()
			case "stream":
				id.stream = l.GetValue()
			case "seq":
				id.seq, _ = strconv.ParseUint(l.GetValue(), 10, 64)
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		lats := slices.Clone(rec.lat[id])
		for _, lat := range lats {
			if math.Abs(lat.Seconds()-e.GetValue()) < 1e-6 {
				return id, lats, true
			}
		}
		return id, lats, false
	}
	for _, e := range ex {
		var found bool
		for end := time.Now().Add(2 * time.Second); !found && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			_, _, found = named(e)
		}
		if id, lats, ok := named(e); !ok {
			t.Errorf("exemplar %+v (%v s) names no message delivered with that latency (observed: %v)", id, e.GetValue(), lats)
		}
	}
	t.Logf("%d exemplars of delayed deliveries, e.g. %v", len(ex), ex[0])
}
