package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/soak"
)

// ErrUsage marks errors in what the caller asked for (an unknown profile),
// as opposed to failures of the run.
var ErrUsage = errors.New("usage")

// CanaryOnce brings the canary users online against the configured target
// (an embedded one in-process when none is configured), runs one round and
// logs them out. A canary that cannot get every user online within
// readyTimeout fails its round with session_down: that is an answer, not an
// error.
func CanaryOnce(ctx context.Context, cfg config.Config, log *slog.Logger, readyTimeout time.Duration) (*report.Round, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e, err := newEnv(cfg, []int{cfg.Canary.Users}, log)
	if err != nil {
		return nil, err
	}
	defer e.close()
	e.startTarget(log)
	m := metrics.New(prometheus.NewRegistry())
	h, err := newMonitor(e.cfg, m, log)
	if err != nil {
		return nil, err
	}
	// A one-shot canary is no shard's: it runs beside the daemons.
	c, err := newCanary(e.cfg, config.Shard{Count: 1}, e, m, h, newReach(m, e.cfg.Target.Name), log, cohortOneshotCanary)
	if err != nil {
		return nil, err
	}
	popCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Both exit when stop is called.
	wg.Go(func() { _ = c.Run(popCtx) })
	wg.Go(func() { h.Run(popCtx) })
	defer func() { stop(); wg.Wait() }()
	for end := time.Now().Add(readyTimeout); !c.Ready() && time.Now().Before(end); {
		if !probe.Sleep(ctx, 20*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	r := c.Round(ctx)
	if r.Result == metrics.ResultAborted {
		return nil, ctx.Err()
	}
	return r, nil
}

// SoakOnce runs the named profile once against the configured target and
// returns its report; when ctx ends early the report is marked aborted.
// The report is also saved in the history under data_dir.
func SoakOnce(ctx context.Context, cfg config.Config, profile string, log *slog.Logger, progress func(soak.Progress)) (*report.Soak, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, ok := cfg.Profile(profile)
	if !ok {
		var names []string
		for _, q := range cfg.Soak.Profiles {
			names = append(names, q.Name)
		}
		return nil, fmt.Errorf("%w: no soak profile %q (have %q)", ErrUsage, profile, names)
	}
	e, err := newEnv(cfg, []int{p.Users}, log)
	if err != nil {
		return nil, err
	}
	defer e.close()
	e.startTarget(log)
	store, err := history.Open(cfg.DataDir, history.Options{
		MaxRuns: cfg.History.MaxRuns, MaxAge: cfg.History.MaxAge, MaxCanaryRounds: cfg.History.MaxCanaryRounds,
	})
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	m := metrics.New(prometheus.NewRegistry())
	h, err := newMonitor(e.cfg, m, log)
	if err != nil {
		return nil, err
	}
	hctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Exits when stop is called, once the run is over.
	wg.Go(func() { h.Run(hctx) })
	r := newSoakRunner(e.cfg, config.Shard{Count: 1}, e, m, h, store, log, cohortOneshotSoak)
	rep, err := r.Run(ctx, p, progress)
	stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := store.SaveSoak(rep); err != nil {
		log.Error("saving soak report", "err", err)
	}
	return rep, nil
}
