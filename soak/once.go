package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/saturation"
)

// ErrUnknownProfile is Once's error for a profile the configuration does
// not have: the caller's mistake, not a failed run.
var ErrUnknownProfile = errors.New("no soak profile")

// FromConfig returns the RunnerOptions of the runner that cfg describes, its
// users named PREFIX-PROFILE-uN, reaching the target through conn. Its
// runs are marked in progress in store, when there is one, as they start:
// a run the process dies in is recorded as aborted at the next start,
// where without the mark it would vanish.
func FromConfig(cfg config.Config, conn engine.Connection, m *metrics.Metrics, store *history.Store, prefix string, log *slog.Logger) RunnerOptions {
	log = log.With("target", cfg.Target.Name, "source", metrics.SourceSoak)
	o := RunnerOptions{
		Connection: conn, Metrics: m, Target: cfg.Target.Name, Prefix: prefix,
		MessageSize: cfg.Population.MessageSize, Logger: log,
	}
	if store != nil {
		o.OnStart = func(r *report.Soak) {
			if err := store.BeginSoak(r); err != nil {
				log.Warn("marking the soak run in progress in the history", "run", r.ID, "err", err)
			}
		}
	}
	return o
}

// OnceCohort names the users of a one-shot soak run, under
// population.prefix, apart from every daemon's (see canary.OnceCohort).
const OnceCohort = "oneshot-soak"

// Once is imcanary soak --profile NAME: it runs the profile once against
// the target of cfg (a loaded configuration; a reference server in-process
// when it names none) and returns its report, saved in the history under
// data_dir too. When ctx ends early the report is marked aborted. progress,
// if set, is called with each sample.
func Once(ctx context.Context, cfg config.Config, profile string, log *slog.Logger, progress func(Progress)) (*report.Soak, error) {
	p, ok := cfg.Profile(profile)
	if !ok {
		var names []string
		for _, q := range cfg.Soak.Profiles {
			names = append(names, q.Name)
		}
		return nil, fmt.Errorf("%w %q (have %q)", ErrUnknownProfile, profile, names)
	}
	t, err := protocols.Open(cfg, []int{p.Users}, log)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	t.Start(log)
	cfg = t.Config
	store, err := history.Open(cfg.DataDir, history.Options{
		MaxRuns: cfg.History.MaxRuns, MaxAge: cfg.History.MaxAge, MaxCanaryRounds: cfg.History.MaxCanaryRounds,
	})
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	m := metrics.New(prometheus.NewRegistry())
	h, err := saturation.New(cfg.Saturation, m.Probe(cfg.Target.Name), log.With("target", cfg.Target.Name, "component", "saturation"))
	if err != nil {
		return nil, err
	}
	hctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Exits when stop is called, once the run is over.
	wg.Go(func() { h.Run(hctx) })
	// No Reach: a soak run that meets the server's connection limit is
	// the run's finding, in its report, not the target being unreachable.
	conn := t.Connection(h, nil)
	// The process's one connect limiter: every run of this process draws
	// from it, as the daemon's populations draw from the daemon's.
	if r := cfg.Population.MaxConnectRate; r > 0 {
		conn.Limiter = engine.NewConnectLimiter(r)
	}
	r := NewRunner(FromConfig(cfg, conn, m, store, cfg.Population.Prefix+"-"+OnceCohort, log))
	rep, err := r.Run(ctx, p, progress)
	stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	// Compared before saving, so the stored report, and the page the
	// daemon renders from it, carry the comparison too.
	if err := store.Compare(rep); err != nil {
		log.Warn("comparing the soak run with earlier runs", "err", err)
	}
	if err := store.SaveSoak(rep); err != nil {
		log.Error("saving soak report", "err", err)
	}
	return rep, nil
}
