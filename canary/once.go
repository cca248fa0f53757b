package canary

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/saturation"
)

// FromConfig returns the Options of the canary that cfg describes, its
// users named PREFIX-uN, reaching the target through conn.
func FromConfig(cfg config.Config, conn engine.Connection, m *metrics.Metrics, prefix string, log *slog.Logger) Options {
	c := cfg.Canary
	return Options{
		Connection: conn, Metrics: m, Target: cfg.Target.Name, Prefix: prefix,
		Users: c.Users, Messages: c.Messages, Deadline: c.Deadline,
		MaxClockUncertainty: c.MaxClockUncertainty,
		Logger:              log.With("target", cfg.Target.Name, "source", metrics.SourceCanary),
	}
}

// OnceCohort names the users of a one-shot canary, under
// population.prefix: apart from every daemon's, so that a pipeline's round
// beside a running daemon never logs in as its users (a second login kicks
// the first session on most servers).
const OnceCohort = "oneshot-canary"

// Once is imcanary canary --once: it brings the canary users online against
// the target of cfg (a loaded configuration; a reference server in-process
// when it names none), runs one round and logs them out. A canary that
// cannot get every user online within readyTimeout fails its round with
// session_down and its cause: that is an answer, not an error. The error is
// ctx's when it ends first, or what kept the target from being reached.
func Once(ctx context.Context, cfg config.Config, log *slog.Logger, readyTimeout time.Duration) (*report.Round, error) {
	t, err := protocols.Open(cfg, []int{cfg.Canary.Users}, log)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	t.Start(log)
	cfg = t.Config
	m := metrics.New(prometheus.NewRegistry())
	h, err := saturation.New(cfg.Saturation, m.Probe(cfg.Target.Name), log.With("target", cfg.Target.Name, "component", "saturation"))
	if err != nil {
		return nil, err
	}
	conn := t.Connection(h, nil)
	// The process's one connect limiter, made here as the daemon makes
	// its own: the round is the only population of this process.
	if r := cfg.Population.MaxConnectRate; r > 0 {
		conn.Limiter = engine.NewConnectLimiter(r)
	}
	c, err := New(FromConfig(cfg, conn, m, cfg.Population.Prefix+"-"+OnceCohort, log))
	if err != nil {
		return nil, err
	}
	popCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Both exit when stop is called.
	wg.Go(func() { _ = c.Run(popCtx) })
	wg.Go(func() { h.Run(popCtx) })
	defer func() { stop(); wg.Wait() }()
	wait, cancel := context.WithTimeout(ctx, readyTimeout)
	c.WaitReady(wait)
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r := c.Round(ctx)
	if r.Result == metrics.ResultAborted {
		return nil, ctx.Err()
	}
	return r, nil
}
