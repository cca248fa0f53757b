package metrics

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestBucketsQuantile(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: ConnectBuckets})
	// Before the span: none of these may show in its quantiles.
	for range 5 {
		h.Observe(3)
	}
	before := ReadBuckets(h)
	for range 10 {
		h.Observe(0.0015) // the bucket (0.001, 0.002]
	}
	for range 10 {
		h.Observe(0.015) // the bucket (0.01, 0.02]
	}
	span := ReadBuckets(h).Sub(before)
	if span.Count != 20 || math.Abs(span.Sum-(10*0.0015+10*0.015)) > 1e-9 {
		t.Fatalf("Sub() = %d observations, sum %v, want 20 and %v", span.Count, span.Sum, 10*0.0015+10*0.015)
	}
	for _, tt := range []struct{ q, want float64 }{
		{0.25, 0.0015}, // rank 5 of the 10 in (0.001, 0.002]
		{0.5, 0.002},   // rank 10: the first bucket's top
		{0.75, 0.015},  // rank 15: halfway through (0.01, 0.02]
		{1, 0.02},
	} {
		if got := span.Quantile(tt.q); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := (Buckets{}).Quantile(0.5); !math.IsNaN(got) {
		t.Errorf("Quantile of nothing = %v, want NaN", got)
	}
	h.Observe(60) // beyond the last bound: +Inf
	if got := ReadBuckets(h).Sub(before).Quantile(1); got != 10 {
		t.Errorf("Quantile(1) with an observation in +Inf = %v, want the highest bound 10", got)
	}
}
