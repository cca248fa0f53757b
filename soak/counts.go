package soak

// Counter snapshots: a run's numbers are the difference of two, since
// the soak series are shared by every run.

import (
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// setRatios computes d's loss and late ratios from its counts.
func setRatios(d *report.Deliveries) {
	if d.Expected > 0 {
		d.LossRatio = float64(d.Lost+d.Undelivered) / float64(d.Expected)
	}
	if d.Delivered > 0 {
		d.LateRatio = float64(d.Late) / float64(d.Delivered)
	}
	if d.Expected > 0 {
		onTime := max(0, d.Delivered-d.Late)
		d.RealtimeMissRatio = max(0, float64(d.Expected-onTime)/float64(d.Expected))
	}
}

// addTo adds o's counts to d's; ratios are left for setRatios.
func addTo(d *report.Deliveries, o report.Deliveries) {
	d.Expected += o.Expected
	d.Delivered += o.Delivered
	d.Recovered += o.Recovered
	d.LatePush += o.LatePush
	d.Lost += o.Lost
	d.Undelivered += o.Undelivered
	d.Late += o.Late
	d.Duplicate += o.Duplicate
	d.Reordered += o.Reordered
}

// counts is a snapshot of a Set's counters; a run's numbers are the
// difference of two, since the soak series are shared by every run.
// Disconnects are not here: the counters do not tell slow readers apart,
// so the observer counts them.
type counts struct {
	// kind is the normal cohort's deliveries and the messages sent;
	// slow is the slow readers' deliveries, by kind.
	kind        [len(metrics.Kinds)]kindCounts
	slow        [len(metrics.Kinds)]report.Deliveries
	sendErr     map[string]int64
	connectFail int64
}

type kindCounts struct {
	report.Deliveries
	sent int64
}

func snapshot(set *metrics.Set) counts {
	c := counts{sendErr: map[string]int64{}}
	for i, ks := range set.Kind {
		c.kind[i].Deliveries = cohortCounts(ks.Cohort[metrics.Normal])
		c.slow[i] = cohortCounts(ks.Cohort[metrics.SlowReader])
		c.kind[i].sent = int64(metrics.Value(ks.Sent))
	}
	for r, m := range set.SendErrors {
		c.sendErr[r] = int64(metrics.Value(m))
	}
	c.connectFail = int64(metrics.Value(set.ConnectFail))
	return c
}

func cohortCounts(k metrics.RecvSet) report.Deliveries {
	return report.Deliveries{
		Expected:  int64(metrics.Value(k.Expected)),
		Delivered: int64(metrics.Value(k.Delivered)),
		Recovered: int64(metrics.Value(k.Recovered)),
		LatePush:  int64(metrics.Value(k.LatePush)),
		Lost:      int64(metrics.Value(k.Lost)),
		Late:      int64(metrics.Value(k.Late)),
		Duplicate: int64(metrics.Value(k.Duplicate)),
		Reordered: int64(metrics.Value(k.Reordered)),
	}
}

func (c counts) sub(b counts) counts {
	d := counts{sendErr: map[string]int64{}, connectFail: c.connectFail - b.connectFail}
	for i := range c.kind {
		d.kind[i].Deliveries = minus(c.kind[i].Deliveries, b.kind[i].Deliveries)
		d.kind[i].sent = c.kind[i].sent - b.kind[i].sent
		d.slow[i] = minus(c.slow[i], b.slow[i])
	}
	for r, n := range c.sendErr {
		d.sendErr[r] = n - b.sendErr[r]
	}
	return d
}

// minus is the difference of two snapshots' counts; ratios are left for
// setRatios.
func minus(d, b report.Deliveries) report.Deliveries {
	return report.Deliveries{
		Expected:  d.Expected - b.Expected,
		Delivered: d.Delivered - b.Delivered,
		Recovered: d.Recovered - b.Recovered,
		LatePush:  d.LatePush - b.LatePush,
		Lost:      d.Lost - b.Lost,
		Late:      d.Late - b.Late,
		Duplicate: d.Duplicate - b.Duplicate,
		Reordered: d.Reordered - b.Reordered,
	}
}

func (c counts) all() report.Deliveries {
	var a report.Deliveries
	for _, k := range c.kind {
		addTo(&a, k.Deliveries)
	}
	return a
}
