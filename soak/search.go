package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/search"
)

// Search runs the search for the server's limit that profile p describes
// (p.Search): a run of the profile per step, with the varied value set to
// the step's, each judged by the profile's thresholds as a soak run is.
// step, if set, is told each step as it ends. A step during which
// imcanary was saturated ends the search as inconclusive, naming why.
func (r *Runner) Search(ctx context.Context, p config.Profile, progress func(Progress), step func(report.SearchStep)) (*report.Search, error) {
	r.busy.Lock()
	defer r.busy.Unlock()
	return r.search(ctx, p, progress, step)
}

// TrySearch is Search unless a soak run or search is in progress, as
// TryRun: the daemon's scheduled searches skip rather than queue.
func (r *Runner) TrySearch(ctx context.Context, p config.Profile) (*report.Search, error) {
	if !r.busy.TryLock() {
		r.o.Metrics.SoakSkipped.WithLabelValues(r.o.Target, p.Name).Inc()
		return nil, ErrBusy
	}
	defer r.busy.Unlock()
	return r.search(ctx, p, nil, nil)
}

// RecordSearch exports how s ended: its result, its knee when it found
// one (search.max when no limit was within reach), and the knee of
// the baseline it was compared with. Called once the search has been
// compared with the history.
func (r *Runner) RecordSearch(s *report.Search) {
	m, target := r.o.Metrics, r.o.Target
	m.SearchRuns.WithLabelValues(target, s.Profile, s.Result).Inc()
	if s.Result == report.SearchFound || s.Result == report.SearchNoLimit {
		m.SearchKnee.WithLabelValues(target, s.Profile).Set(s.Knee)
	}
	for _, c := range s.Comparisons {
		if c.Against == report.AgainstBaseline && c.Missing == "" {
			for _, d := range c.Deltas {
				if d.Name == "knee" {
					m.SearchBaselineKnee.WithLabelValues(target, s.Profile).Set(d.Was)
				}
			}
		}
	}
}

// search runs the search with r held.
func (r *Runner) search(ctx context.Context, p config.Profile, progress func(Progress), step func(report.SearchStep)) (*report.Search, error) {
	plan := search.Plan{Start: p.SearchStart(), Max: p.Search.Max, Factor: p.Search.Factor, Precision: p.Search.Precision,
		Whole: p.Search.Vary != config.SearchRate}
	s, err := search.New(plan)
	if err != nil {
		return nil, fmt.Errorf("profile %s: search: %w", p.Name, err)
	}
	rep := &report.Search{
		ID: report.NewRunID(time.Now()), Kind: "search", Target: r.o.Target, Profile: p.Name, Vary: p.Search.Vary,
		Start: plan.Start, Max: plan.Max, Factor: plan.Factor, Precision: plan.Precision, StartTime: time.Now(),
		Settings: profileOf(p), CatchUp: config.CatchUpOff,
	}
	if r.o.Connection.CatchUp {
		rep.CatchUp = config.CatchUpOn
	}
	for v, ok := s.Next(); ok; v, ok = s.Next() {
		run, err := r.run(ctx, p.AtStep(v), progress, true)
		if err != nil {
			return nil, fmt.Errorf("search step %v: %w", v, err)
		}
		st := report.StepOf(v, run)
		rep.Steps = append(rep.Steps, st)
		if step != nil {
			step(st)
		}
		var verdict search.Verdict
		switch run.Result {
		case metrics.ResultPass:
			verdict = search.Pass
		case metrics.ResultFail:
			verdict = search.Fail
		case metrics.ResultInconclusive:
			verdict = search.Inconclusive
		default:
			rep.Result, rep.EndTime = report.SearchAborted, time.Now()
			rep.Knee, rep.FirstFail = s.Knee()
			return rep, nil
		}
		if err := s.Record(v, verdict); err != nil {
			return nil, err
		}
	}
	rep.EndTime = time.Now()
	rep.Knee, rep.FirstFail = s.Knee()
	switch s.End() {
	case search.Found:
		rep.Result = report.SearchFound
	case search.NoLimit:
		rep.Result = report.SearchNoLimit
	case search.BelowStart:
		rep.Result = report.SearchBelowStart
	default:
		rep.Result = report.SearchInconclusive
	}
	for _, st := range rep.Steps {
		if st.Value == rep.FirstFail && st.Result == metrics.ResultFail {
			rep.Broke = st.Failed
		}
	}
	judged := fmt.Sprintf("%s of sending judged by the profile's thresholds", p.Duration)
	if p.Settle > 0 {
		judged = fmt.Sprintf("%s of sending of which the first %s settles and the rest is judged on latency by the profile's thresholds", p.Duration, p.Settle)
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("Each step is a run of profile %s with its %s set to the step's value: a ramp of %s, %s, and a drain of %s. The knee is the largest value that passed; the search ends once the first that failed is within %s of it.",
		p.Name, p.Search.Vary, p.Ramp, judged, p.Drain, fmt.Sprintf("%.3g%%", 100*p.Search.Precision)),
		"delivered/s counts the deliveries pushed while a step sent, not those of its drain. A server that falls behind pushes late, "+
			"and with catch-up on the prober fetches what it has not been pushed: those deliveries count in real-time (the share pushed "+
			"within the deadline) as not in time, and their latency is not in p99 delivery, which then covers the pushes alone. "+
			"A step whose real-time completeness drops is past the knee whatever its p99 says; min_realtime_completeness judges it.")
	return rep, nil
}
