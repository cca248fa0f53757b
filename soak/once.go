package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	p, err := namedProfile(cfg, profile)
	if err != nil {
		return nil, err
	}
	var rep *report.Soak
	err = oneShot(cfg, p.Users, true, log, func(r *Runner, store *history.Store) error {
		var err error
		if rep, err = r.Run(ctx, p, progress); err != nil {
			return err
		}
		// Compared before saving, so the stored report, and the page
		// the daemon renders from it, carry the comparison too.
		if err := store.Compare(rep); err != nil {
			log.Warn("comparing the soak run with earlier runs", "err", err)
		}
		if err := store.SaveSoak(rep); err != nil {
			log.Error("saving soak report", "err", err)
		}
		return nil
	})
	return rep, err
}

// SearchOnce is imcanary soak --profile NAME for a profile with a search:
// the search for the server's limit against the target of cfg, as Once
// runs a profile. The search is kept in the history, compared with the
// previous search of the profile and its pinned baseline; its steps are
// not, where they would stand as runs of the profile and be compared with
// each other. step, if set, is told each step as it ends.
func SearchOnce(ctx context.Context, cfg config.Config, profile string, log *slog.Logger, progress func(Progress), step func(report.SearchStep)) (*report.Search, error) {
	p, err := namedProfile(cfg, profile)
	if err != nil {
		return nil, err
	}
	if p.Search.Vary == "" {
		return nil, fmt.Errorf("profile %s has no search (search.vary)", profile)
	}
	if cfg.Shard != "" {
		return nil, fmt.Errorf("profile %s: a search runs in one process, not as shards (shard %q)", profile, cfg.Shard)
	}
	users := p.Users
	if p.Search.Vary == config.SearchUsers {
		users = int(p.Search.Max)
	}
	var rep *report.Search
	err = oneShot(cfg, users, false, log, func(r *Runner, store *history.Store) error {
		var err error
		if rep, err = r.Search(ctx, p, progress, step); err != nil {
			return err
		}
		if err := store.CompareSearch(rep); err != nil {
			log.Warn("comparing the search with earlier searches", "err", err)
		}
		r.RecordSearch(rep)
		if err := store.SaveSearch(rep); err != nil {
			log.Error("saving the search report", "err", err)
		}
		return nil
	})
	return rep, err
}

// namedProfile returns the profile named so in cfg.
func namedProfile(cfg config.Config, profile string) (config.Profile, error) {
	p, ok := cfg.Profile(profile)
	if !ok {
		var names []string
		for _, q := range cfg.Soak.Profiles {
			names = append(names, q.Name)
		}
		return p, fmt.Errorf("%w %q (have %q)", ErrUnknownProfile, profile, names)
	}
	return p, nil
}

// oneShot opens the target of cfg for a cohort of up to users, with the
// history of data_dir and imcanary's self-monitor, and calls run with a
// runner on them; with mark, the runner marks its runs in progress in the
// history.
func oneShot(cfg config.Config, users int, mark bool, log *slog.Logger, run func(*Runner, *history.Store) error) error {
	t, err := protocols.Open(cfg, []int{users}, log)
	if err != nil {
		return err
	}
	defer t.Close()
	t.Start(log)
	cfg = t.Config
	store, err := history.Open(cfg.DataDir, history.Options{
		MaxRuns: cfg.History.MaxRuns, MaxAge: cfg.History.MaxAge, MaxCanaryRounds: cfg.History.MaxCanaryRounds,
	})
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	m := metrics.New(prometheus.NewRegistry())
	h, err := saturation.New(cfg.Saturation, m.Probe(cfg.Target.Name), log.With("target", cfg.Target.Name, "component", "saturation"))
	if err != nil {
		return err
	}
	hctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Exits when stop is called, once the run is over.
	wg.Go(func() { h.Run(hctx) })
	defer func() {
		stop()
		wg.Wait()
	}()
	// No Reach: a soak run that meets the server's connection limit is
	// the run's finding, in its report, not the target being unreachable.
	conn := t.Connection(h, nil)
	// The process's one connect limiter: every run of this process draws
	// from it, as the daemon's populations draw from the daemon's.
	if r := cfg.Population.MaxConnectRate; r > 0 {
		conn.Limiter = engine.NewConnectLimiter(r)
	}
	marks := store
	if !mark {
		marks = nil
	}
	host, _ := os.Hostname()
	sh, err := config.ParseShard(cfg.Shard, host)
	if err != nil {
		return fmt.Errorf("shard %q: %w", cfg.Shard, err)
	}
	prefix := cfg.Population.Prefix
	if sh.Sharded() && !cfg.Population.AcrossShards {
		// As a daemon's shards: never logged in as another shard's.
		prefix = fmt.Sprintf("%s-s%d", prefix, sh.Index)
	}
	o := FromConfig(cfg, conn, m, marks, prefix+"-"+OnceCohort, log)
	if sh.Sharded() {
		o.Shard = sh.String()
		if cfg.Population.AcrossShards {
			// One population, each shard its slice, under one
			// prefix.
			o.Across = sh
		}
	}
	return run(NewRunner(o), store)
}
