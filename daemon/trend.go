package daemon

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// trend keeps the last hour of the SLI counters for the status page: one
// reading every trendEvery of the very series /metrics exports, so that
// the page and Prometheus cannot disagree. It covers the sources the SLO
// rules cover (background and canary; a soak run has its own report) and
// the normal cohort only (a slow-reader drill's losses are its subject).
// Memory is fixed: trendSpan/trendEvery readings of a few hundred bytes.
type trend struct {
	sets []*metrics.Set // by source: trendSources
	now  func() time.Time
	// every is the reading interval: trendEvery but in tests.
	every time.Duration

	mu   sync.Mutex
	ring []trendPoint // oldest first once full; next is the write index
	next int
	full bool
}

const (
	// trendEvery is the reading interval, trendSpan how far back the
	// readings go: the page's charts show the last hour by the minute.
	trendEvery = 10 * time.Second
	trendSpan  = time.Hour
	// recentWindow is the window of the page's recent SLIs: the shortest
	// of the burn-rate alerts' windows.
	recentWindow = 5 * time.Minute
)

// trendSources are the sources the SLO rules judge.
var trendSources = [...]string{metrics.SourceBackground, metrics.SourceCanary}

// trendPoint is one reading: cumulative counts, as the counters hold them.
type trendPoint struct {
	at   time.Time
	kind [len(trendSources)][len(metrics.Kinds)]trendCounts // by source, then kind
	// Connect attempts of those sources: successes, and failures by
	// reason, in the order of metrics.ConnectFailReasons.
	ok   float64
	fail []float64
}

// trendCounts are the normal cohort's delivery counters of one source and
// kind, and its latency histogram's cumulative buckets (the last is +Inf:
// the count).
type trendCounts struct {
	expected, delivered, recovered, lost, late, duplicate, reordered float64
	le                                                               []float64
}

func newTrend(m *metrics.Metrics, target string) *trend {
	t := &trend{now: time.Now, every: trendEvery, ring: make([]trendPoint, int(trendSpan/trendEvery)+1)}
	for _, src := range trendSources {
		t.sets = append(t.sets, m.For(target, src))
	}
	return t
}

// run takes a reading every t.every until ctx ends.
func (t *trend) run(ctx context.Context) {
	t.record()
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.record()
		}
	}
}

// record appends a reading to the ring.
func (t *trend) record() {
	p := t.read()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ring[t.next] = p
	t.next = (t.next + 1) % len(t.ring)
	t.full = t.full || t.next == 0
}

// read takes a reading of the counters now.
func (t *trend) read() trendPoint {
	p := trendPoint{at: t.now(), fail: make([]float64, len(metrics.ConnectFailReasons))}
	for s, set := range t.sets {
		for k := range set.Kind {
			r := set.Kind[k].Cohort[metrics.Normal]
			c := &p.kind[s][k]
			c.expected, c.delivered = metrics.Value(r.Expected), metrics.Value(r.Delivered)
			c.lost, c.late = metrics.Value(r.Lost), metrics.Value(r.Late)
			c.recovered = metrics.Value(r.Recovered)
			c.duplicate, c.reordered = metrics.Value(r.Duplicate), metrics.Value(r.Reordered)
			c.le = metrics.Cumulative(r.DeliveryLatency)
		}
		p.ok += metrics.Value(set.ConnectOK)
		for i, reason := range metrics.ConnectFailReasons {
			p.fail[i] += metrics.Value(set.ConnectFailures[reason])
		}
	}
	return p
}

// points returns the readings oldest first, and a reading taken now last.
func (t *trend) points() []trendPoint {
	now := t.read()
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []trendPoint
	if t.full {
		out = append(out, t.ring[t.next:]...)
	}
	out = append(out, t.ring[:t.next]...)
	return append(out, now)
}

// since returns the last reading at or before at among ps (oldest first),
// or the oldest when none is that old; ok is false for no readings.
func since(ps []trendPoint, at time.Time) (trendPoint, bool) {
	if len(ps) == 0 {
		return trendPoint{}, false
	}
	best := ps[0]
	for _, p := range ps {
		if p.at.After(at) {
			break
		}
		best = p
	}
	return best, true
}

// minus is what happened between two readings of one source and kind,
// o the earlier.
func (c trendCounts) minus(o trendCounts) trendCounts { return c.add(o, -1) }

// plus sums two sources' or kinds' counts.
func (c trendCounts) plus(o trendCounts) trendCounts { return c.add(o, 1) }

func (c trendCounts) add(o trendCounts, sign float64) trendCounts {
	d := trendCounts{
		expected: c.expected + sign*o.expected, delivered: c.delivered + sign*o.delivered,
		recovered: c.recovered + sign*o.recovered,
		lost:      c.lost + sign*o.lost, late: c.late + sign*o.late,
		duplicate: c.duplicate + sign*o.duplicate, reordered: c.reordered + sign*o.reordered,
		le: make([]float64, max(len(c.le), len(o.le))),
	}
	for i := range d.le {
		if i < len(c.le) {
			d.le[i] = c.le[i]
		}
		if i < len(o.le) {
			d.le[i] += sign * o.le[i]
		}
	}
	return d
}

// quantile estimates the q-quantile of the latency histogram c, as
// Prometheus's histogram_quantile does (metrics.Buckets.Quantile). NaN
// when there were no observations.
func (c trendCounts) quantile(q float64) float64 {
	if len(c.le) != len(metrics.LatencyBuckets)+1 || !(c.le[len(c.le)-1] > 0) {
		return math.NaN()
	}
	b := metrics.Buckets{Upper: metrics.LatencyBuckets, Cumulative: make([]uint64, len(metrics.LatencyBuckets)), Count: uint64(c.le[len(c.le)-1])}
	for i := range b.Cumulative {
		b.Cumulative[i] = uint64(max(0, c.le[i]))
	}
	return b.Quantile(q)
}

// within returns how many observations were at most le seconds; le must be
// a bucket bound.
func (c trendCounts) within(le float64) float64 {
	for i, b := range metrics.LatencyBuckets {
		if b == le && i < len(c.le) {
			return c.le[i]
		}
	}
	return math.NaN()
}
