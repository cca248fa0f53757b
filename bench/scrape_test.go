package bench

import (
	"math"
	"strings"
	"testing"
)

// page is a prober's /metrics, cut to what the bench reads.
const page = `# TYPE imcanary_sessions_online gauge
imcanary_sessions_online{shard="0",source="background",target="reference"} 998
imcanary_sessions_online{shard="0",source="canary",target="reference"} 4
# TYPE imcanary_session_connects_total counter
imcanary_session_connects_total{result="success",shard="0",source="background",target="reference"} 1003
imcanary_session_connects_total{result="failure",shard="0",source="background",target="reference"} 7
# TYPE imcanary_deliveries_total counter
imcanary_deliveries_total{cohort="normal",kind="direct",shard="0",source="background",target="reference"} 100
imcanary_deliveries_total{cohort="normal",kind="group",shard="0",source="background",target="reference"} 400
# TYPE imcanary_probe_saturated gauge
imcanary_probe_saturated{shard="0",target="reference"} 1
# TYPE imcanary_probe_saturation_cause gauge
imcanary_probe_saturation_cause{cause="cpu",shard="0",target="reference"} 1
imcanary_probe_saturation_cause{cause="fds",shard="0",target="reference"} 0
imcanary_probe_saturation_cause{cause="ports",shard="0",target="reference"} 1
# TYPE imcanary_probe_receive_lag_seconds histogram
imcanary_probe_receive_lag_seconds_bucket{shard="0",target="reference",le="0.0001"} 50
imcanary_probe_receive_lag_seconds_bucket{shard="0",target="reference",le="0.0002"} 80
imcanary_probe_receive_lag_seconds_bucket{shard="0",target="reference",le="0.001"} 95
imcanary_probe_receive_lag_seconds_bucket{shard="0",target="reference",le="0.002"} 99
imcanary_probe_receive_lag_seconds_bucket{shard="0",target="reference",le="+Inf"} 100
imcanary_probe_receive_lag_seconds_sum{shard="0",target="reference"} 0.05
imcanary_probe_receive_lag_seconds_count{shard="0",target="reference"} 100
`

func TestScrape(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kv   []string
		want float64
	}{
		{mOnline, nil, 1002},
		{mOnline, []string{"source", "background"}, 998},
		{mConnects, []string{"result", "success"}, 1003},
		{mDeliveries, nil, 500},
		{mDeliveries, []string{"kind", "group"}, 400},
		{mSaturated, nil, 1},
		{"imcanary_not_there", nil, 0},
	} {
		if got := s.sum(tc.name, tc.kv...); got != tc.want {
			t.Errorf("sum(%q, %q) = %v, want %v", tc.name, tc.kv, got, tc.want)
		}
	}
	if got := strings.Join(s.causes(), ","); got != "cpu,ports" {
		t.Errorf("causes() = %q, want cpu,ports", got)
	}
	h := s.histogram(mReceiveLag)
	if h.total != 100 || len(h.bounds) != 4 {
		t.Fatalf("histogram = %+v, want 100 observations in 4 finite buckets", h)
	}
	if got := h.over(0.002); got != 0.01 {
		t.Errorf("over(2ms) = %v, want 0.01", got)
	}
	if got := h.over(0.003); !math.IsNaN(got) {
		t.Errorf("over(3ms), not a bound, = %v, want NaN", got)
	}
}

func TestQuantile(t *testing.T) {
	h := hist{bounds: []float64{1, 2, 5}, counts: []float64{10, 60, 90}, total: 100}
	for _, tc := range []struct {
		q, want float64
	}{
		{0.05, 0.5},   // within the first bucket, from 0
		{0.1, 1},      // its top
		{0.35, 1.5},   // halfway through (1, 2]
		{0.9, 5},      // top of the last finite bucket
		{0.99, 5},     // in +Inf: the highest finite bound
		{0.75, 3.5},   // 15 of 30 into (2, 5]
		{0.6, 2},      // exactly a bucket's top
		{0.0, 0},      // nothing below
		{0.65, 2.5},   // 5 of 30 into (2, 5]
		{0.675, 2.75}, // 7.5 of 30
	} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := (hist{}).quantile(0.99); !math.IsNaN(got) {
		t.Errorf("quantile of an empty histogram = %v, want NaN", got)
	}
}

func TestHistArithmetic(t *testing.T) {
	a := hist{bounds: []float64{1, 2}, counts: []float64{10, 20}, total: 25}
	b := hist{bounds: []float64{1, 2}, counts: []float64{4, 5}, total: 6}
	d := a.sub(b)
	if d.total != 19 || d.counts[0] != 6 || d.counts[1] != 15 {
		t.Errorf("sub = %+v, want total 19, counts [6 15]", d)
	}
	if a.counts[0] != 10 {
		t.Errorf("sub changed its receiver: %+v", a)
	}
	sum := hist{}.add(a).add(b)
	if sum.total != 31 || sum.counts[0] != 14 || sum.counts[1] != 25 {
		t.Errorf("add = %+v, want total 31, counts [14 25]", sum)
	}
}
