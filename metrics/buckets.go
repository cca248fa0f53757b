package metrics

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Buckets is a reading of a histogram's cumulative bucket counts. A span's
// observations are the difference of two readings (Sub), since the series
// are shared by everything that ran before: a soak run's connects are the
// connect histograms at its end minus those at its start.
type Buckets struct {
	// Upper are the buckets' upper bounds, +Inf excluded; Cumulative[i]
	// counts the observations at most Upper[i].
	Upper      []float64
	Cumulative []uint64
	// Count and Sum are every observation's, +Inf bucket included.
	Count uint64
	Sum   float64
}

// ReadBuckets reads histogram o; a zero Buckets for anything else.
func ReadBuckets(o prometheus.Observer) Buckets {
	m, ok := o.(prometheus.Metric)
	if !ok {
		return Buckets{}
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil || d.Histogram == nil {
		return Buckets{}
	}
	h := d.Histogram
	b := Buckets{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
	for _, bk := range h.GetBucket() {
		if math.IsInf(bk.GetUpperBound(), +1) {
			continue
		}
		b.Upper = append(b.Upper, bk.GetUpperBound())
		b.Cumulative = append(b.Cumulative, bk.GetCumulativeCount())
	}
	return b
}

// Sub returns the observations of b that came after the reading a, of the
// same histogram.
func (b Buckets) Sub(a Buckets) Buckets {
	d := Buckets{Upper: b.Upper, Cumulative: make([]uint64, len(b.Cumulative)), Count: b.Count - a.Count, Sum: b.Sum - a.Sum}
	for i, n := range b.Cumulative {
		if i < len(a.Cumulative) {
			n -= a.Cumulative[i]
		}
		d.Cumulative[i] = n
	}
	return d
}

// Quantile estimates the q-quantile (0 ≤ q ≤ 1) in the histogram's unit as
// Prometheus's histogram_quantile does: linear within the bucket that
// holds it, from 0 in the first, and the highest finite bound when it falls
// in +Inf. NaN when there were no observations.
func (b Buckets) Quantile(q float64) float64 {
	if b.Count == 0 || len(b.Upper) == 0 {
		return math.NaN()
	}
	rank := q * float64(b.Count)
	lower, below := 0.0, 0.0
	for i, bound := range b.Upper {
		n := float64(b.Cumulative[i])
		if n >= rank {
			if in := n - below; in > 0 {
				return lower + (bound-lower)*(rank-below)/in
			}
			return bound
		}
		lower, below = bound, n
	}
	return b.Upper[len(b.Upper)-1]
}
