package report

import (
	"fmt"
	"strings"
	"time"
)

// ConnectPath is where the time of a population's connects went over a
// span: each phase's count and quantiles, from the buckets of the
// population's imcanary_connect_duration_seconds histograms (the
// difference of a reading at the span's start and one at its end).
type ConnectPath struct {
	// Phases are dns, tcp, tls, upgrade and login, in the order a
	// connect goes through them. A phase that did not happen (dns for an
	// IP literal, tls for ws://) has Count 0; one that failed is not
	// counted, so a connect that failed in its upgrade counts in tcp
	// only.
	Phases []ConnectPhase `json:"phases"`
	// Total is the whole of each successful connect attempt (dial and
	// login) over the same span, from an HDR histogram: what the phases
	// split. Its count is the login phase's.
	Total Percentiles `json:"total"`
}

// ConnectPhase is one phase of the connects of a span. P50 and P99 are
// interpolated within the histogram's buckets as Prometheus's
// histogram_quantile does, so they are as fine as the buckets (100 µs to
// 10 s); Mean is the exact sum over the count.
type ConnectPhase struct {
	Phase string        `json:"phase"`
	Count int64         `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Mean  time.Duration `json:"mean_ns"`
}

// renderConnectTable is the connect path as the text report's table rows,
// the header first.
func renderConnectTable(c *ConnectPath) [][]string {
	rows := [][]string{{"connect path", "count", "p50", "p99", "mean"}}
	for _, p := range c.Phases {
		if p.Count == 0 {
			rows = append(rows, []string{p.Phase, "0", "-", "-", "-"})
			continue
		}
		rows = append(rows, []string{p.Phase, renderCount(p.Count), renderLatency(p.P50), renderLatency(p.P99), renderLatency(p.Mean)})
	}
	t := c.Total
	if t.Count == 0 {
		return append(rows, []string{"total", "0", "-", "-", "-"})
	}
	return append(rows, []string{"total", renderCount(t.Count), renderLatency(t.P50), renderLatency(t.P99), "-"})
}

// renderConnectLine is the connect path in one line: each phase that
// happened, and the total.
func renderConnectLine(c *ConnectPath) string {
	var parts []string
	for _, p := range c.Phases {
		if p.Count > 0 {
			parts = append(parts, fmt.Sprintf("%s p50 %s, p99 %s (%s)", p.Phase, renderLatency(p.P50), renderLatency(p.P99), renderCount(p.Count)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// connectPathNote says how the connect path was measured, under its
// table.
const connectPathNote = "Phase percentiles are estimated from histogram buckets (imcanary_connect_duration_seconds, 100µs to 10s), interpolated as histogram_quantile does; the mean is exact. A phase that did not happen or failed is not counted. The total is each successful connect attempt's own duration, from an HDR histogram."
