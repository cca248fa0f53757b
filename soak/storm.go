package soak

// The reconnect-storm drill: a fraction of a population's sessions dropped
// at once without a clean close, as a load balancer restart drops them, and
// the report says how soon they were back, what their logins cost, how fast
// the process reconnected against population.max_connect_rate, and what
// the population lost meanwhile.

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// StormTarget is the population a reconnect-storm drill drops sessions
// of: the daemon's background population (engine.Population.Drop over its
// blocks). RunnerOptions.Storm nil drops the run's own cohort.
type StormTarget interface {
	Drop(fraction float64, obs engine.StormObserver) (online, dropped int, err error)
}

// storm records one drill: it is the probe.StormObserver of the drop.
type storm struct {
	at  time.Time
	own bool // the run's own cohort was dropped, not another population
	// lim is the process's connect limiter, whose count is the process's
	// connect attempts; nil counts the dropped sessions' own.
	lim *engine.ConnectLimiter
	// before is the dropped population's counts at the drop.
	before counts
	set    *metrics.Set

	mu sync.Mutex
	// pending counts, per user of the run's own cohort, the dropped
	// sessions whose disconnect is the drill's, not the server's.
	pending map[int]int
	dropped int
	online  int
	armed   bool // Drop has returned: dropped is final
	err     error
	// back holds each dropped session's return, from at, in the order
	// they came.
	back   []time.Duration
	login  *hdrhistogram.Histogram
	failed int64
	tried  int64 // connect attempts of the dropped sessions
	// startCount is the attempt count at the drop, endCount at the last
	// session back (or the run's end), endAt then.
	startCount, endCount int64
	endAt                time.Time
	peak                 float64
	done                 chan struct{} // closed when every dropped session is back

	// connectAt and connectEnd read the dropped population's connect
	// histograms at the drop and when the last session was back.
	connectAt, connectEnd connectReading
}

func newStorm(own bool, lim *engine.ConnectLimiter, set *metrics.Set) *storm {
	return &storm{own: own, lim: lim, set: set, pending: map[int]int{}, login: newHist(), done: make(chan struct{})}
}

// count is the connect attempts counted so far: the process's, or the
// dropped sessions' without a limiter. st.mu must be held.
func (st *storm) count() int64 {
	if st.lim != nil {
		return st.lim.Attempts()
	}
	return st.tried
}

// Dropped implements probe.StormObserver.
func (st *storm) Dropped(user, _ int) {
	st.mu.Lock()
	st.dropped++
	if st.own {
		st.pending[user]++
	}
	st.mu.Unlock()
}

// Attempt implements probe.StormObserver.
func (st *storm) Attempt(_ int, start, end time.Time, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.tried++
	if err != nil {
		st.failed++
		return
	}
	record(st.login, end.Sub(start))
	st.back = append(st.back, end.Sub(st.at))
	st.finish(end)
}

// finish closes done once armed and every dropped session is back. st.mu
// must be held.
func (st *storm) finish(now time.Time) {
	if st.armed && len(st.back) >= st.dropped && st.endAt.IsZero() {
		st.endAt, st.endCount = now, st.count()
		// The last session's phases were observed before its attempt
		// was reported.
		st.connectEnd = readConnect(st.set)
		close(st.done)
	}
}

// take reports whether user's disconnect is one the drill caused, and
// counts it off.
func (st *storm) take(user int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.pending[user] > 0 {
		st.pending[user]--
		return true
	}
	return false
}

// recovering reports whether dropped sessions are still away.
func (st *storm) recovering() bool {
	select {
	case <-st.done:
		return false
	default:
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.err == nil
	}
}

// drop drops fraction of target's sessions now.
func (st *storm) drop(target StormTarget, fraction float64) {
	st.mu.Lock()
	st.at = time.Now()
	st.startCount = st.count()
	st.connectAt = readConnect(st.set)
	st.mu.Unlock()
	online, dropped, err := target.Drop(fraction, st)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.online, st.armed, st.err = online, true, err
	if err == nil && dropped != st.dropped {
		st.err = fmt.Errorf("dropped %d sessions, heard of %d", dropped, st.dropped)
	}
	if st.err == nil {
		st.finish(time.Now())
	}
}

// stormTick is how often the attempt count is sampled for the peak second:
// a tenth of the second it is measured over.
const stormTick = 100 * time.Millisecond

// sample measures the most connect attempts in any one second until every
// dropped session is back or ctx ends. It keeps only the last second of
// samples, whatever the storm's length.
func (st *storm) sample(ctx context.Context) {
	type point struct {
		t time.Time
		n int64
	}
	t := time.NewTicker(stormTick)
	defer t.Stop()
	st.mu.Lock()
	ring := []point{{st.at, st.startCount}}
	st.mu.Unlock()
	for {
		var now time.Time
		last := false
		select {
		case <-ctx.Done():
			return
		case <-st.done:
			last = true
		case now = <-t.C:
		}
		st.mu.Lock()
		p := point{now, st.count()}
		if last {
			// The last point is the last session back.
			p = point{st.endAt, st.endCount}
		}
		// Drop the points a second older than the one before the
		// newest: the oldest left spans at least a second once the
		// storm is a second old.
		for len(ring) > 1 && p.t.Sub(ring[1].t) >= time.Second {
			ring = ring[1:]
		}
		// Attempts in a span under a second are attempts in some one
		// second: a storm shorter than that has its count as its peak.
		old := ring[0]
		st.peak = max(st.peak, float64(p.n-old.n)/max(p.t.Sub(old.t), time.Second).Seconds())
		ring = append(ring, p)
		st.mu.Unlock()
		if last {
			return
		}
	}
}

// report is the drill's section, at the run's end: d is the dropped
// population's counts then.
func (st *storm) report(p config.Profile, end time.Time, d counts) *report.Storm {
	st.mu.Lock()
	defer st.mu.Unlock()
	pop := metrics.SourceBackground
	if st.own {
		pop = metrics.SourceSoak
	}
	s := &report.Storm{
		Population: pop, Fraction: p.Storm.Fraction, At: st.at, Online: st.online, Dropped: st.dropped,
		Back: len(st.back), Login: percentiles(st.login), FailedAttempts: st.failed, PeakPerSec: st.peak,
		Window: end.Sub(st.at), AttemptsOf: "dropped sessions",
	}
	if st.lim != nil {
		s.AttemptsOf, s.MaxConnectRate, s.Burst = "process", st.lim.Limit(), st.lim.Burst()
	}
	endAt, endCount, connectEnd := st.endAt, st.endCount, st.connectEnd
	if endAt.IsZero() {
		endAt, endCount, connectEnd = end, st.count(), readConnect(st.set)
		s.ConnectUntilEnd = true
	}
	s.ConnectPath = connectPath(st.connectAt, connectEnd, s.Login)
	s.Attempts, s.AttemptsSpan = endCount-st.startCount, endAt.Sub(st.at)
	if s.AttemptsSpan > 0 {
		s.AttemptsPerSec = float64(s.Attempts) / s.AttemptsSpan.Seconds()
	}
	back := slices.Clone(st.back)
	slices.Sort(back)
	if n := int(math.Ceil(0.99 * float64(st.dropped))); st.dropped > 0 && len(back) >= n {
		s.Recovery99, s.Reached99 = back[n-1], true
	}
	if st.dropped > 0 && len(back) >= st.dropped {
		s.Recovery100, s.Reached100 = back[st.dropped-1], true
	}
	// What was owed before the drop and not yet received at it is still
	// owed in the window, and its deliveries are counted in it: without
	// it, delivered could exceed expected.
	b := st.before.all()
	s.InFlightAtDrop = max(0, b.Expected-b.Delivered-b.Recovered-b.Lost)
	dl := d.sub(st.before).all()
	dl.Expected += s.InFlightAtDrop
	dl.Undelivered = max(0, dl.Expected-dl.Delivered-dl.Recovered-dl.Lost)
	setRatios(&dl)
	s.Deliveries = dl
	return s
}

// stormRows are the drill's thresholds; s is nil when the drop failed
// with err.
func stormRows(t config.Thresholds, s *report.Storm, err error) []report.Threshold {
	row := func(name string, limit, d time.Duration, reached bool) report.Threshold {
		th := report.Threshold{Name: name, Limit: limit.String(), LimitValue: limit.Seconds()}
		switch {
		case err != nil:
			th.Actual = "not run: " + err.Error()
		case s.Dropped == 0:
			th.Actual = "nothing dropped"
		case !reached:
			th.Actual = fmt.Sprintf("not reached: %s of %s back", report.FormatCount(int64(s.Back)), report.FormatCount(int64(s.Dropped)))
		default:
			th.Actual, th.ActualValue, th.Pass = d.Round(time.Millisecond).String(), d.Seconds(), d <= limit
		}
		return th
	}
	if s == nil {
		s = &report.Storm{}
	}
	return []report.Threshold{
		row("recovery_99", t.Recovery99, s.Recovery99, s.Reached99),
		row("recovery_100", t.Recovery100, s.Recovery100, s.Reached100),
	}
}

// stormNote says how the drill was run and measured, for the report's
// notes.
func stormNote(s *report.Storm) string {
	whose := "the daemon's background population"
	attempts := "the whole process's (every population sharing its connect limiter)"
	if s.AttemptsOf != "process" {
		attempts = "the dropped sessions' own (no connect limiter)"
	}
	after := ""
	if s.Population == metrics.SourceSoak {
		whose = "the run's own users"
		after = " The drill's own drops are not counted in disconnects or max_disconnects, and min_online_ratio is not sampled until every dropped session is back."
	}
	return fmt.Sprintf("Reconnect-storm drill: %s of the sessions of %s online at the drop were aborted at once, their connections closed with no close frame, as a load balancer restart does. "+
		"A session is back when its connect attempt (dial and login) succeeds; the recovery times run from the drop to the login that brought 99%% (rounded up) and all of them back, and login latency is those attempts' own duration. "+
		"Connect attempts are %s, counted as each one's turn under the connect limit comes, from the drop until the last session was back; the peak second is sampled every %s. "+
		"Deliveries are the dropped population's, from the drop to the end of the run; expected includes what was owed before the drop and still in flight at it.%s",
		report.FormatPercent(s.Fraction), whose, attempts, stormTick, after)
}

// drop makes the drill's drop of p now: the storm target's sessions, or
// the run's own (pop's, whose observer obs and sampler s then leave the
// drill's disconnects and recovery out of theirs).
func (r *Runner) drop(p config.Profile, pop *engine.Population, obs *observer, s *sampler) *storm {
	o := r.o
	var target StormTarget = pop
	source := metrics.SourceSoak
	if o.Storm != nil {
		target, source = o.Storm, o.StormSource
	}
	st := newStorm(o.Storm == nil, o.Limiter, o.Metrics.For(o.Target, source))
	st.before = snapshot(st.set)
	if st.own {
		obs.mu.Lock()
		obs.storm = st
		obs.mu.Unlock()
		s.mu.Lock()
		s.storm = st
		s.mu.Unlock()
	}
	st.drop(target, p.Storm.Fraction)
	st.mu.Lock()
	online, dropped, err := st.online, st.dropped, st.err
	st.mu.Unlock()
	log := o.Logger.With("profile", p.Name)
	if err != nil {
		log.Error("reconnect storm: the drop failed", "err", err)
	} else {
		log.Info("reconnect storm: sessions dropped", "source", source, "online", online, "dropped", dropped)
	}
	return st
}

// fillStorm adds the drill's section, thresholds and note to rep, before
// the verdict.
func (r *Runner) fillStorm(rep *report.Soak, p config.Profile, st *storm) {
	st.mu.Lock()
	err := st.err
	st.mu.Unlock()
	var s *report.Storm
	if err == nil {
		s = st.report(p, rep.End, snapshot(st.set))
		rep.Storm = s
		rep.Notes = append(rep.Notes, stormNote(s))
	} else {
		rep.Notes = append(rep.Notes, "Reconnect-storm drill: the drop failed ("+err.Error()+"): the drill was not run.")
	}
	rep.Thresholds = append(rep.Thresholds, stormRows(p.Thresholds, s, err)...)
}
