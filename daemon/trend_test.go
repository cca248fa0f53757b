package daemon

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
)

// TestTrendWindow records real series, then checks what the recent window
// makes of two readings: the deltas, the SLIs judged as the rules judge,
// and a p99 interpolated within its bucket as histogram_quantile does.
func TestTrendWindow(t *testing.T) {
	m := metrics.New(prometheus.NewPedanticRegistry())
	tr := newTrend(m, "staging")
	clock := statusEpoch
	tr.now = func() time.Time { return clock }
	set := m.For("staging", metrics.SourceBackground)
	r := set.Kind[metrics.Group].Cohort[metrics.Normal]
	r.Expected.Add(50)
	r.Delivered.Add(50)
	tr.record()

	clock = clock.Add(time.Minute)
	r.Expected.Add(1000)
	r.Delivered.Add(990)
	r.Lost.Add(6)
	r.Late.Add(4)
	r.Duplicate.Add(2)
	// 980 deliveries at 5ms, 10 at 1.5s: p99 at rank 990 of 990 falls in
	// the bucket (1, 2], at its top.
	for range 980 {
		r.DeliveryLatency.Observe(0.005)
	}
	for range 10 {
		r.DeliveryLatency.Observe(1.5)
	}
	// The slow cohort is not the service's: it must not count.
	set.Kind[metrics.Group].Cohort[metrics.SlowReader].Lost.Add(500)
	ps := tr.points()
	if len(ps) != 2 {
		t.Fatalf("points() = %d readings, want the recorded one and one taken now", len(ps))
	}
	first, _ := since(ps, clock.Add(-recentWindow))
	w := windowSLIs(first, ps[len(ps)-1])
	var g WindowSLI
	for _, x := range w {
		if x.Source == metrics.SourceBackground && x.Kind == metrics.KindGroup {
			g = x
		}
	}
	if g.Expected != 1000 || g.Delivered != 990 || g.Lost != 6 || g.Late != 4 || g.Duplicate != 2 {
		t.Errorf("window = %+v, want the deltas since the first reading", g)
	}
	if g.Completeness == nil || math.Abs(*g.Completeness-0.99) > 1e-12 {
		t.Errorf("completeness = %v, want 1 - (6+4)/1000 = 0.99", g.Completeness)
	}
	if g.Latency == nil || math.Abs(*g.Latency-980.0/990) > 1e-12 {
		t.Errorf("latency = %v, want 980/990 within 1s", g.Latency)
	}
	if g.P99 == nil || math.Abs(*g.P99-(1+(2-1)*(980.1-980)/10)) > 1e-9 {
		t.Errorf("p99 = %v, want %v, interpolated within (1s, 2s]", g.P99, 1+(2-1)*(980.1-980)/10)
	}
	for _, x := range w {
		if x.Kind == metrics.KindDirect && x.Completeness != nil {
			t.Errorf("%s direct completeness = %v with nothing owed, want null", x.Source, *x.Completeness)
		}
	}
}
