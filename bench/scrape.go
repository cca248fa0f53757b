package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The series of a prober the bench reads. They are imcanary's public metric
// names (docs/metrics.md), so the bench reads them as an operator's
// Prometheus would, not through any internal API.
const (
	mOnline       = "imcanary_sessions_online"
	mConnects     = "imcanary_session_connects_total"
	mDeliveries   = "imcanary_deliveries_total"
	mLost         = "imcanary_deliveries_lost_total"
	mIgnored      = "imcanary_deliveries_ignored_total"
	mReceiveLag   = "imcanary_probe_receive_lag_seconds"
	mSendLag      = "imcanary_probe_send_lag_seconds"
	mSaturated    = "imcanary_probe_saturated"
	mCause        = "imcanary_probe_saturation_cause"
	mHeapInuse    = "go_memstats_heap_inuse_bytes"
	mStackInuse   = "go_memstats_stack_inuse_bytes"
	mGCDuration   = "go_gc_duration_seconds" // a summary: its count is the collections
	mGCCPU        = "go_cpu_classes_gc_total_cpu_seconds_total"
	mGoroutines   = "go_goroutines"
	noiseLimitSec = 0.002 // the self-noise goal: receive lag p99 under 2 ms
)

// scrape is one /metrics page, by family name.
type scrape map[string]*dto.MetricFamily

// parseMetrics parses the Prometheus text format.
func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	return fams, nil
}

// metricsClient scrapes the workers. No proxy: every worker is on loopback,
// and an HTTP_PROXY meant for the outside must not see these requests.
var metricsClient = &http.Client{
	Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2},
	Timeout:   10 * time.Second,
}

// fetchMetrics scrapes http://addr/metrics.
func fetchMetrics(ctx context.Context, addr string) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// matches reports whether m carries every name/value pair of kv.
func matches(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		if labelOf(m, kv[i]) != kv[i+1] {
			return false
		}
	}
	return true
}

// sum adds the counters, gauges or untyped values of family name whose
// labels match the name/value pairs kv, over every other label: a prober
// has one series per source, kind and cohort, and the bench wants them all.
func (s scrape) sum(name string, kv ...string) float64 {
	var v float64
	for _, m := range s[name].GetMetric() {
		if !matches(m, kv) {
			continue
		}
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		case m.Summary != nil:
			// A summary's count: go_gc_duration_seconds counts
			// collections.
			v += float64(m.Summary.GetSampleCount())
		}
	}
	return v
}

// has reports whether the page has family name at all.
func (s scrape) has(name string) bool { return len(s[name].GetMetric()) > 0 }

// causes returns the saturation causes set to 1, sorted.
func (s scrape) causes() []string {
	var c []string
	for _, m := range s[mCause].GetMetric() {
		if m.GetGauge().GetValue() == 1 {
			c = append(c, labelOf(m, "cause"))
		}
	}
	slices.Sort(c)
	return c
}

// hist is a cumulative histogram summed over its series: bounds ascending,
// counts[i] the observations at most bounds[i], total every observation
// (the +Inf bucket).
type hist struct {
	bounds []float64
	counts []float64
	total  float64
}

// histogram sums the series of histogram family name. Series with other
// bucket bounds than the first are skipped: imcanary's lag histograms all
// share one layout.
func (s scrape) histogram(name string) hist {
	var h hist
	for _, m := range s[name].GetMetric() {
		dh := m.GetHistogram()
		if dh == nil {
			continue
		}
		var bounds, counts []float64
		for _, b := range dh.GetBucket() {
			if math.IsInf(b.GetUpperBound(), +1) {
				continue
			}
			bounds = append(bounds, b.GetUpperBound())
			counts = append(counts, float64(b.GetCumulativeCount()))
		}
		if h.bounds == nil {
			h.bounds, h.counts = bounds, make([]float64, len(bounds))
		}
		if !slices.Equal(h.bounds, bounds) {
			continue
		}
		for i := range counts {
			h.counts[i] += counts[i]
		}
		h.total += float64(dh.GetSampleCount())
	}
	return h
}

// sub returns the observations of h made since prev, an earlier reading of
// the same histogram.
func (h hist) sub(prev hist) hist {
	d := hist{bounds: h.bounds, counts: slices.Clone(h.counts), total: h.total - prev.total}
	if slices.Equal(h.bounds, prev.bounds) {
		for i := range d.counts {
			d.counts[i] -= prev.counts[i]
		}
	}
	return d
}

// add returns the sum of two readings of histograms with the same layout:
// several probers' window deltas.
func (h hist) add(o hist) hist {
	if h.bounds == nil {
		return hist{bounds: o.bounds, counts: slices.Clone(o.counts), total: o.total}
	}
	d := hist{bounds: h.bounds, counts: slices.Clone(h.counts), total: h.total + o.total}
	if slices.Equal(h.bounds, o.bounds) {
		for i := range d.counts {
			d.counts[i] += o.counts[i]
		}
	}
	return d
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linearly within the bucket that holds it, from 0 for the first
// bucket; a quantile in the +Inf bucket is the highest finite bound. It
// returns NaN for an empty histogram.
func (h hist) quantile(q float64) float64 {
	if h.total <= 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.total
	lo, below := 0.0, 0.0
	for i, b := range h.bounds {
		if h.counts[i] >= rank {
			in := h.counts[i] - below
			if in <= 0 {
				return b
			}
			return lo + (b-lo)*(rank-below)/in
		}
		lo, below = b, h.counts[i]
	}
	return h.bounds[len(h.bounds)-1]
}

// over returns the fraction of observations above le, exactly when le is a
// bucket bound (the self-noise limit, 2 ms, is one of imcanary's lag
// buckets), and NaN for an empty histogram or a bound it does not have.
func (h hist) over(le float64) float64 {
	if h.total <= 0 {
		return math.NaN()
	}
	i := slices.Index(h.bounds, le)
	if i < 0 {
		return math.NaN()
	}
	return (h.total - h.counts[i]) / h.total
}
