package soak

import (
	"math"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// connectReading is a reading of a Set's connect histograms, by phase in
// the order of metrics.ConnectPhases: the connects of a span are the
// difference of two, as a run's counts are.
type connectReading [len(metrics.ConnectPhases)]metrics.Buckets

func readConnect(set *metrics.Set) connectReading {
	var c connectReading
	for i, o := range set.Connect.Phase {
		c[i] = metrics.ReadBuckets(o)
	}
	return c
}

// connectPath is the connect path of the connects between the readings
// from and to; total is the same connects' whole duration, as the
// observer measured it.
func connectPath(from, to connectReading, total report.Percentiles) *report.ConnectPath {
	c := &report.ConnectPath{Total: total}
	for i, name := range metrics.ConnectPhases {
		b := to[i].Sub(from[i])
		p := report.ConnectPhase{Phase: name, Count: int64(b.Count)}
		if b.Count > 0 {
			p.P50, p.P99 = seconds(b.Quantile(0.5)), seconds(b.Quantile(0.99))
			p.Mean = seconds(b.Sum / float64(b.Count))
		}
		c.Phases = append(c.Phases, p)
	}
	return c
}

// seconds is s seconds as a duration, 0 for NaN.
func seconds(s float64) time.Duration {
	if math.IsNaN(s) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
