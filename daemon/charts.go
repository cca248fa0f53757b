package daemon

import (
	"html/template"
	"math"
	"strconv"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// chartStep is the width of one point of the status page's charts: the
// last hour by the minute. Until the readings span chartFine, the charts
// show that span instead, with a point per reading.
const (
	chartStep = time.Minute
	chartFine = 10 * time.Minute
)

// statusCharts draws the last hour of st's readings: completeness (the
// share of deliveries owed that were lost or late, per kind) and delivery
// latency (p50 and p99), one point per chartStep, over the sources the SLO
// rules judge.
func statusCharts(st Status, now time.Time) ([]template.HTML, error) {
	ps := st.trend
	if len(ps) == 0 {
		return nil, nil
	}
	// One reading per minute back from the newest, oldest first; the
	// same reading is never used twice (just after the start, there are
	// fewer than the hour holds).
	var picked []trendPoint
	last := ps[len(ps)-1]
	if last.at.Sub(ps[0].at) < chartFine {
		// Until the readings cover chartFine, every reading is a point:
		// a daemon started a few minutes ago still gets a line.
		picked = ps
	} else {
		for k := int(trendSpan / chartStep); k >= 0; k-- {
			p, _ := since(ps, last.at.Add(-time.Duration(k)*chartStep))
			if n := len(picked); n > 0 && !p.at.After(picked[n-1].at) {
				continue
			}
			picked = append(picked, p)
		}
	}
	n := len(picked) - 1
	x := make([]float64, max(n, 0))
	bad := [2][]float64{make([]float64, len(x)), make([]float64, len(x))}
	p50, p99 := make([]float64, len(x)), make([]float64, len(x))
	for i := range n {
		from, to := picked[i], picked[i+1]
		x[i] = to.at.Sub(now).Seconds()
		var all trendCounts
		for k := range metrics.Kinds {
			var d trendCounts
			for s := range trendSources {
				d = d.plus(to.kind[s][k].minus(from.kind[s][k]))
			}
			bad[k][i] = math.NaN()
			if d.expected > 0 {
				bad[k][i] = 100 * max(0, d.lost+d.late) / d.expected
			}
			all = all.plus(d)
		}
		p50[i], p99[i] = all.quantile(0.5), all.quantile(0.99)
	}
	allowance := 100 * (1 - st.Recent.Objective)
	pct := func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) + "%" }
	completeness, err := report.RenderChart(report.Chart{
		ID: "chart-completeness", Title: "Completeness, last hour",
		Desc:   "Deliveries lost or late per delivery owed, in percent, per minute, for direct and group messages of the background population and the canary; the dashed line is what the objective allows.",
		XLabel: "seconds from now", YLabel: "lost or late, % of owed", X: x, YFormat: pct,
		Series: []report.ChartSeries{
			{Name: "direct", Color: report.ColorBlue, Values: bad[0]},
			{Name: "group", Color: report.ColorOrange, Dash: "5 3", Values: bad[1]},
		},
		Refs: []report.ChartRef{{Label: "objective allows " + pct(allowance), Color: report.ColorRed, Value: allowance}},
	})
	if err != nil {
		return nil, err
	}
	latency, err := report.RenderChart(report.Chart{
		ID: "chart-latency", Title: "Delivery latency, last hour",
		Desc:   "Delivery latency per minute, p50 and p99, estimated from the histogram's buckets as Prometheus does, on a logarithmic axis; the dashed line is the latency SLI's 1s threshold.",
		XLabel: "seconds from now", YLabel: "delivery latency (log)", X: x, Log: true, YFormat: report.FormatLatencyTick,
		Series: []report.ChartSeries{
			{Name: "p50", Color: report.ColorBlue, Values: p50},
			{Name: "p99", Color: report.ColorOrange, Values: p99},
		},
		Refs: []report.ChartRef{{Label: "SLI threshold 1s", Color: report.ColorRed, Value: 1}},
	})
	if err != nil {
		return nil, err
	}
	return []template.HTML{completeness, latency}, nil
}
