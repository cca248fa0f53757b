// Package daemon wires imcanary together: it picks the protocol driver named
// in the configuration, starts the reference server when asked to, runs the
// background population, the canary and scheduled soak runs, keeps their
// history, and serves /metrics, /healthz, /readyz, the status page and the
// API. It knows no adapter: protocols.Open makes the driver the
// configuration names.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/robfig/cron/v3"

	"github.com/imcanary/imcanary/canary"
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/saturation"
	"github.com/imcanary/imcanary/soak"
)

// ShutdownTimeout bounds the whole shutdown: closing every session with a
// close frame, the HTTP server and the reference server.
const ShutdownTimeout = 5 * time.Second

// Daemon is one running imcanary.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics.Metrics
	target  *protocols.Target
	bg      *background
	shard   config.Shard
	canary  *canary.Canary // nil when canary.schedule is empty
	soak    *soak.Runner
	// retry brings a round forward after a failed one
	// (canary.retry_after); nil with the canary.
	retry *retrier
	// health is the prober's self-monitor, shared by every population.
	health *saturation.Monitor
	// reach is whether the target takes logins, from every population's
	// connect attempts.
	reach *engine.Reach
	// connects is the process's one connect limiter (nil: no limit),
	// shared by the background population, the canary and every soak run,
	// so that population.max_connect_rate holds for the daemon.
	connects *engine.ConnectLimiter
	// trend keeps the last hour of SLI readings for the status page.
	trend *trend
	// lastRound is the last canary round that ran, for the verdict.
	lastRound atomic.Pointer[report.Round]
	store     *history.Store
	// lock keeps data_dir this daemon's from New until Run returns.
	lock    *history.Lock
	started time.Time

	httpLn net.Listener
	// webConfig is the --web.config.file; "" serves plain HTTP.
	webConfig string

	// load reads the configuration again for Reload; nil: no reload.
	load             func() (config.Config, error)
	noReloadEndpoint bool
	// reloadMu serialises reloads, and a reload with shutdown.
	reloadMu sync.Mutex
	// curMu guards cur, the configuration in force (cfg is the one the
	// daemon started with: its fixed keys never change), and the jobs'
	// context and scheduler, which a reload replaces.
	curMu sync.RWMutex
	cur   config.Config
	jobs  context.Context
	sched *cron.Cron
}

// current returns the configuration in force.
func (d *Daemon) current() config.Config {
	d.curMu.RLock()
	defer d.curMu.RUnlock()
	return d.cur
}

// Option changes how New builds a Daemon.
type Option func(*Daemon)

// WithWebConfig serves the HTTP endpoints with the TLS and basic
// authentication of an exporter-toolkit web configuration file, the
// Prometheus ecosystem's --web.config.file. Its certificates are read again
// for each new connection, so that they can be renewed in place.
func WithWebConfig(path string) Option { return func(d *Daemon) { d.webConfig = path } }

// Ready reports whether the background population is online.
func (d *Daemon) Ready() bool { return d.bg.Ready() }

// New checks cfg as Preflight does (its rules, the files, ports and secret
// it needs) and prepares everything Run starts. It opens the HTTP listener (and the
// reference server's, when it runs in-process) so that a port conflict is
// reported before anything runs.
func New(cfg config.Config, log *slog.Logger, reg *prometheus.Registry, opts ...Option) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: log, reg: reg}
	for _, o := range opts {
		o(d)
	}
	if d.webConfig != "" {
		// The same check the server makes when it starts, made before
		// anything runs: a bad file is a bad configuration.
		if err := web.Validate(d.webConfig); err != nil {
			return nil, fmt.Errorf("--web.config.file %s: %w", d.webConfig, err)
		}
	}
	// data_dir first: opening the target may write to it (a kept
	// secret, what a driver learnt of the server).
	lock, err := history.Acquire(cfg.DataDir, "imcanary run")
	if err != nil {
		return nil, err
	}
	// The populations that may run at once.
	pops := populations(cfg)
	e, err := protocols.Open(cfg, pops, log)
	if err != nil {
		lock.Release()
		return nil, err
	}
	d.lock = lock
	d.target = e
	d.cfg = e.Config
	ok := false
	defer func() {
		if !ok {
			e.Close()
			if d.httpLn != nil {
				d.httpLn.Close()
			}
			d.lock.Release()
		}
	}()
	d.store, err = history.Open(cfg.DataDir, history.Options{
		MaxRuns: cfg.History.MaxRuns, MaxAge: cfg.History.MaxAge, MaxCanaryRounds: cfg.History.MaxCanaryRounds,
	})
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	host, _ := os.Hostname()
	if d.shard, err = config.ParseShard(cfg.Shard, host); err != nil {
		return nil, fmt.Errorf("shard %q: %w", cfg.Shard, err)
	}
	// Every series carries the shard, so that Prometheus can sum the
	// shards and tell them apart; unsharded, it is "0".
	d.metrics = metrics.New(prometheus.WrapRegistererWith(prometheus.Labels{"shard": d.shard.Label()}, reg))
	// The configuration was loaded and validated before New: it is the
	// first one applied. Reload sets these again.
	d.metrics.ConfigLastReloadOK.Set(1)
	if fc, ok := e.Driver.(probe.FrameCounter); ok {
		metrics.RegisterFrameCounts(prometheus.WrapRegistererWith(prometheus.Labels{"shard": d.shard.Label()}, reg),
			d.cfg.Target.Name, metrics.FrameCounts{Unmatched: fc.FramesUnmatched, Gaps: fc.ServerGaps})
	}
	if r, ok := e.Driver.(probe.Retrier); ok {
		metrics.RegisterRetries(prometheus.WrapRegistererWith(prometheus.Labels{"shard": d.shard.Label()}, reg), d.cfg.Target.Name, r.Retries)
	}
	d.metrics.ConfigLastReloadSuccess.SetToCurrentTime()
	if d.health, err = newMonitor(d.cfg, d.metrics, log); err != nil {
		return nil, err
	}
	d.reach = newReach(d.metrics, d.cfg.Target.Name)
	if r := d.cfg.Population.MaxConnectRate; r > 0 {
		d.connects = engine.NewConnectLimiter(r)
	}
	d.trend = newTrend(d.metrics, d.cfg.Target.Name)
	if d.cfg.Canary.Schedule != "" {
		if d.canary, err = newCanary(d.cfg, d.shard, d.connection(d.reach), d.metrics, log, cohortCanary); err != nil {
			return nil, err
		}
		d.retry = newRetrier(
			func() time.Duration { return d.current().Canary.RetryAfter },
			func(t time.Time) time.Time { return nextDue(d.current().Canary.Schedule, t) },
			func() time.Duration { return canaryRoundSpan(d.current()) },
			func(ctx context.Context) { d.canaryRound(ctx, true) },
			func() { d.setCanaryDue(time.Now()) },
			log.With("target", d.cfg.Target.Name, "source", metrics.SourceCanary))
	}
	// After the canary: a population laid out across the shards corrects
	// other shards' latencies by the clock offsets its ring measures.
	if d.bg, err = d.newBackground(); err != nil {
		return nil, err
	}
	d.soak = newSoakRunner(d.cfg, d.shard, d.connection(nil), d.bg, d.canary, d.metrics, d.store, log, cohortSoak)
	for _, pr := range d.cfg.Soak.Profiles {
		d.registerProfile(pr)
	}
	d.cur = d.cfg
	if d.httpLn, err = net.Listen("tcp", cfg.HTTP.Listen); err != nil {
		return nil, fmt.Errorf("http.listen: %w", err)
	}
	ok = true
	return d, nil
}

// Cohorts: every population of users gets a name space of its own under
// population.prefix, so that the daemon's canary, its soak runs and a
// pipeline's one-shot commands beside it never log in as each other (a
// second login kicks the first session on most servers). The one-shot
// commands' are canary.OnceCohort and soak.OnceCohort.
const (
	cohortCanary = "canary"
	cohortSoak   = "soak"
)

// newMonitor builds the prober's self-monitor from saturation.*.
func newMonitor(cfg config.Config, m *metrics.Metrics, log *slog.Logger) (*saturation.Monitor, error) {
	return saturation.New(cfg.Saturation, m.Probe(cfg.Target.Name), log.With("target", cfg.Target.Name, "component", "saturation"))
}

// shardPrefix starts the names of shard i's users: population.prefix, and
// the shard's index when there are several, so that shards never log in as
// each other.
func shardPrefix(cfg config.Config, i int, sh config.Shard) string {
	if !sh.Sharded() {
		return cfg.Population.Prefix
	}
	return fmt.Sprintf("%s-s%d", cfg.Population.Prefix, i)
}

// sharedPrefix starts the names of the users of a population laid out
// across shards (population.across_shards): the same in every shard,
// which logs in its slice of them. Without it, as shardPrefix.
func sharedPrefix(cfg config.Config, sh config.Shard) string {
	if !cfg.Population.AcrossShards {
		return shardPrefix(cfg, sh.Index, sh)
	}
	return cfg.Population.Prefix
}

// across is the sharding a population laid out across shards follows:
// sh with population.across_shards, none (the zero Shard) without.
func across(cfg config.Config, sh config.Shard) config.Shard {
	if !cfg.Population.AcrossShards {
		return config.Shard{}
	}
	return sh
}

// newReach makes the prober's view of the target's reachability, exported
// as imcanary_target_reachable once the first attempt has ended.
func newReach(m *metrics.Metrics, target string) *engine.Reach {
	return engine.NewReach(func(ok bool) {
		v := 0.0
		if ok {
			v = 1
		}
		m.TargetReachable.WithLabelValues(target).Set(v)
	})
}

// connection is what every population of the daemon shares: the target's
// connection, the self-monitor, reach (nil for a soak run, whose failures
// are its own) and the process's connect limiter.
func (d *Daemon) connection(reach *engine.Reach) engine.Connection {
	c := d.target.Connection(d.health, reach)
	c.Limiter = d.connects
	return c
}

func newCanary(cfg config.Config, sh config.Shard, conn engine.Connection, m *metrics.Metrics, log *slog.Logger, cohort string) (*canary.Canary, error) {
	o := canary.FromConfig(cfg, conn, m, shardPrefix(cfg, sh.Index, sh)+"-"+cohort, log)
	if sh.Sharded() && cohort == cohortCanary {
		// The shards form a ring: user 0 of each canary messages user
		// 0 of the next shard's, and hears from the previous one's.
		o.CrossPeer = shardPrefix(cfg, sh.Next(), sh) + "-" + cohort + "-u0"
		o.CrossFrom = shardPrefix(cfg, sh.Prev(), sh) + "-" + cohort + "-u0"
		o.CrossPeerShard, o.CrossFromShard = strconv.Itoa(sh.Next()), strconv.Itoa(sh.Prev())
	}
	return canary.New(o)
}

// shardClock is the clock offsets of other shards that ring, the canary,
// measures, for the populations laid out across the shards; nil without a
// canary.
func shardClock(ring *canary.Canary) func(int, int64) (int64, bool) {
	if ring == nil {
		return nil
	}
	return ring.ShardClock
}

// A storm drill drops sessions of bg, the background population: the
// drill is of what the daemon keeps online, as a load balancer restart
// would drop them.
func newSoakRunner(cfg config.Config, sh config.Shard, conn engine.Connection, bg soak.StormTarget, ring *canary.Canary, m *metrics.Metrics, store *history.Store, log *slog.Logger, cohort string) *soak.Runner {
	// No Reach: a soak run that meets the server's connection limit is
	// the run's finding, in its report, not the target being unreachable
	// for the background population and the canary.
	o := soak.FromConfig(cfg, conn, m, store, sharedPrefix(cfg, sh)+"-"+cohort, log)
	o.Storm, o.StormSource = bg, metrics.SourceBackground
	o.Across = across(cfg, sh)
	o.ShardClock = shardClock(ring)
	if sh.Sharded() {
		o.Shard = sh.String()
	}
	return soak.NewRunner(o)
}

// newBackground makes the background population of d.cfg, as blocks that
// share the process's connect limiter (see background).
func (d *Daemon) newBackground() (*background, error) {
	p := d.cfg.Population
	name := d.cfg.Target.Name
	set := d.metrics.For(name, metrics.SourceBackground)
	log := d.log.With("target", name, "source", metrics.SourceBackground)
	// Each block is a whole layout, sliced alike in every shard.
	sh := across(d.cfg, d.shard)
	clock := shardClock(d.canary)
	var untrusted prometheus.Counter
	if clock != nil && sh.Sharded() {
		untrusted = d.metrics.Clock.Untrusted.WithLabelValues(name, metrics.SourceBackground)
	}
	return newBackground(p.Users, set, log, func(offset, groupOffset, users int) (*engine.Population, error) {
		return engine.NewPopulation(engine.Options{
			Connection:          d.connection(d.reach),
			Set:                 set,
			Logger:              log,
			Prefix:              sharedPrefix(d.cfg, d.shard),
			Users:               users,
			Slice:               engine.SliceOf(sh.Index, sh.Count, users),
			ShardClock:          clock,
			ShardClockUntrusted: untrusted,
			OwedAfterLogin:      true,
			Offset:              offset,
			GroupOffset:         groupOffset,
			Block:               true,
			Ramp:                p.Ramp,
			GroupSize:           p.GroupSize,
			Groups:              p.GroupLayout(),
			Behaviours:          p.Behaviours,
			Devices:             p.Devices,
			Rate:                p.Rate,
			Deadline:            p.Deadline,
			LostAfter:           p.LostAfter,
			MessageSize:         p.MessageSize,
			LagThreshold:        p.LagThreshold,
			SessionLifetime:     p.SessionLifetime,
			SlowReaders: engine.SlowReaders{
				Fraction: p.SlowReaders.Fraction, ReadDelay: p.SlowReaders.ReadDelay,
				Pause: p.SlowReaders.Pause, PauseEvery: p.SlowReaders.PauseEvery,
			},
		})
	})
}

// HTTPAddr is the address the HTTP server listens on.
func (d *Daemon) HTTPAddr() string { return d.httpLn.Addr().String() }

// TargetURL is the URL of the target being monitored, without anything
// secret it may carry.
func (d *Daemon) TargetURL() string { return probe.RedactURL(d.cfg.Target.URL) }

// Run serves until ctx ends, then shuts down in order within
// ShutdownTimeout: the scheduler stops starting jobs, the running ones are
// aborted (a soak run still writes its report), the populations close their
// sessions with close frames, then the HTTP server and the reference server
// stop.
func (d *Daemon) Run(ctx context.Context) error {
	log := d.log
	d.started = time.Now()
	// Last, after the reference server: nothing writes data_dir then.
	defer d.lock.Release()
	defer d.target.Close()
	d.target.Start(log)

	// Everything below stops when jobs is cancelled.
	jobs, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	sched, err := d.schedule(jobs, d.current())
	if err != nil {
		return err
	}
	d.curMu.Lock()
	d.jobs, d.sched = jobs, sched
	d.curMu.Unlock()

	errc := make(chan error, 1)
	srv := &http.Server{Handler: d.handler(), ReadHeaderTimeout: 10 * time.Second}
	var httpWG sync.WaitGroup
	// Exits when srv.Shutdown is called below.
	httpWG.Go(func() {
		if err := web.Serve(d.httpLn, srv, &web.FlagConfig{WebConfigFile: &d.webConfig}, log.With("component", "http")); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	})
	log.Info("imcanary running", "run", d.target.Run, "http", d.HTTPAddr(), "target", d.cfg.Target.Name,
		"url", d.TargetURL(), "users", d.cfg.Population.Users)

	var wg sync.WaitGroup
	// Exits when jobs ends.
	wg.Go(func() { d.health.Run(jobs) })
	// Exits when jobs ends, after closing every session.
	wg.Go(func() { d.bg.run(jobs) })
	w := newWatch(d.reach, func() (int, int, bool) { return d.bg.Online(), d.bg.Sessions(), d.bg.Ready() },
		d.cfg.Population.Backoff.Max, log.With("target", d.cfg.Target.Name))
	// Exits when jobs ends.
	wg.Go(func() { w.run(jobs) })
	// Exits when jobs ends.
	wg.Go(func() { d.trend.run(jobs) })
	if d.canary != nil {
		// Exits when jobs ends.
		wg.Go(func() { _ = d.canary.Run(jobs) })
		// Exits when jobs ends, a retry round in progress with it.
		wg.Go(func() { d.retry.run(jobs) })
	}
	sched.Start()
	d.setCanaryDue(time.Now())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	// One budget for the whole shutdown. The populations get most of it;
	// the reference server needs up to a second to close what is left.
	log.Info("shutting down")
	end := time.Now().Add(ShutdownTimeout)
	stopJobs()
	done := make(chan struct{})
	// A reload in progress finishes first; none starts after this.
	d.reloadMu.Lock()
	d.curMu.Lock()
	sched, d.sched = d.sched, nil
	d.curMu.Unlock()
	d.reloadMu.Unlock()
	go func() {
		<-sched.Stop().Done() // running jobs end: their context is jobs
		wg.Wait()
		close(done)
	}()
	popWait := time.NewTimer(time.Until(end) - 1500*time.Millisecond)
	defer popWait.Stop()
	select {
	case <-done:
	case <-popWait.C:
		log.Error("populations and jobs did not stop in time; closing anyway")
	}
	sctx, cancel := context.WithDeadline(context.Background(), end.Add(-time.Second))
	defer cancel()
	_ = srv.Shutdown(sctx)
	httpWG.Wait()
	return runErr
}

// schedule registers the canary and the scheduled soak profiles. Jobs are
// plain funcs whose context is jobs; cron.Recover keeps one panicking job
// from taking the daemon down. Overlaps are skipped and counted by the
// canary and the soak runner themselves, never stacked.
func (d *Daemon) schedule(jobs context.Context, cfg config.Config) (*cron.Cron, error) {
	c := cron.New(cron.WithChain(cron.Recover(cronLogger{d.log})))
	if d.canary != nil {
		if _, err := c.AddFunc(cfg.Canary.Schedule, func() { d.canaryJob(jobs) }); err != nil {
			return nil, fmt.Errorf("canary.schedule: %w", err)
		}
	}
	for i, p := range cfg.Soak.Profiles {
		if p.Schedule == "" {
			continue
		}
		job := func() { d.soakJob(jobs, p) }
		if p.Search.Vary != "" {
			job = func() { d.searchJob(jobs, p) }
		}
		if _, err := c.AddFunc(p.Schedule, job); err != nil {
			return nil, fmt.Errorf("soak.profiles[%d].schedule: %w", i, err)
		}
	}
	return c, nil
}

func (d *Daemon) canaryJob(ctx context.Context) {
	// Jitter the start so a fleet of daemons on the same schedule does not
	// hit the target in the same second.
	if j := d.current().Canary.Jitter; j > 0 && !probe.Sleep(ctx, rand.N(j)) {
		return
	}
	if !d.canary.Ready() && time.Since(d.started) < canaryGrace(d.cfg) {
		// Still coming online after the start: a round now would only
		// report the ramp. Past the grace period a round runs, and a
		// canary that never came online fails it with session_down
		// rather than going silent.
		return
	}
	// This round answers what a pending retry would have.
	d.retry.superseded()
	d.canaryRound(ctx, false)
}

// canaryRound runs a round, scheduled or the retry of a failed one, and
// records it. A round running already makes it skip, counted.
func (d *Daemon) canaryRound(ctx context.Context, retry bool) {
	r, err := d.canary.TryRound(ctx)
	if err != nil {
		d.log.Warn("canary round skipped", "err", err, "retry", retry)
		return
	}
	if r.Result == metrics.ResultAborted {
		return
	}
	d.lastRound.Store(r)
	due := d.retry.ended(r.End, r.Result == metrics.ResultPass)
	d.setCanaryDue(r.End)
	if err := d.store.SaveCanary(r); err != nil {
		d.log.Error("saving canary round", "err", err)
	}
	switch {
	case r.Result == metrics.ResultPass && retry:
		d.log.Info("canary retry round passed: the failure cleared; back to canary.schedule", "round", r.ID)
	case r.Result != metrics.ResultPass && !due.IsZero():
		d.log.Warn("canary round failed: "+canarySummary(r), "round", r.ID, "retry", retry, "retry_at", due)
	case r.Result != metrics.ResultPass:
		d.log.Warn("canary round failed: "+canarySummary(r), "round", r.ID, "retry", retry)
	}
}

// canaryRoundSpan is the longest a canary round takes once it starts: it
// waits up to 1.5 × canary.deadline for the last delivery (see
// canary.Canary's round).
func canaryRoundSpan(cfg config.Config) time.Duration {
	return cfg.Canary.Deadline + cfg.Canary.Deadline/2
}

// setCanaryDue sets imcanary_canary_next_round_timestamp_seconds to when
// the next round is due after t by the schedule in force: at start and
// after each round that ran, never when one is skipped, so that a canary
// whose rounds stop leaves it in the past for the alert to see.
func (d *Daemon) setCanaryDue(t time.Time) {
	if d.canary == nil {
		return
	}
	next := nextDue(d.current().Canary.Schedule, t)
	if retry := d.retry.pending(); !retry.IsZero() && (next.IsZero() || retry.Before(next)) {
		// A failed round's retry comes first.
		next = retry
	}
	if !next.IsZero() {
		d.metrics.CanaryNextRound.WithLabelValues(d.cfg.Target.Name).Set(float64(next.UnixNano()) / 1e9)
	}
}

// nextDue returns when spec next fires after t, or the zero time for an
// empty or bad spec (Validate has rejected those).
func nextDue(spec string, t time.Time) time.Time {
	if spec == "" {
		return time.Time{}
	}
	sch, err := cron.ParseStandard(spec)
	if err != nil {
		return time.Time{}
	}
	return sch.Next(t)
}

// canarySummary puts a round's checks in one readable line: "direct 3/4
// delivered (late), group 12/12 delivered; CAUSE".
func canarySummary(r *report.Round) string {
	var parts []string
	for _, ch := range r.Checks {
		p := fmt.Sprintf("%s %d/%d delivered", ch.Kind, ch.Delivered, ch.Expected)
		if ch.Recovered > 0 {
			p += fmt.Sprintf(", %d recovered", ch.Recovered)
		}
		if len(ch.Reasons) > 0 {
			p += " (" + strings.Join(ch.Reasons, ", ") + ")"
		}
		parts = append(parts, p)
	}
	s := strings.Join(parts, ", ")
	if r.Cause != "" {
		s += "; " + r.Cause
	}
	return s
}

// canaryGrace is how long after the start a canary not yet online skips
// its rounds: a deadline and a few connect attempts with backoff.
func canaryGrace(cfg config.Config) time.Duration {
	return cfg.Canary.Deadline + 4*cfg.Population.Backoff.Initial
}

func (d *Daemon) soakJob(ctx context.Context, p config.Profile) {
	rep, err := d.soak.TryRun(ctx, p, nil)
	if err != nil {
		d.log.Warn("soak run skipped", "profile", p.Name, "err", err)
		return
	}
	// As soak.Once does: compared before saving, so that the stored
	// report and its page carry the comparison.
	if err := d.store.Compare(rep); err != nil {
		d.log.Warn("comparing the soak run with earlier runs", "profile", p.Name, "err", err)
	}
	if err := d.store.SaveSoak(rep); err != nil {
		d.log.Error("saving soak report", "profile", p.Name, "err", err)
	}
}

// searchJob runs a scheduled search for the server's limit, saves it in
// the history, compared with the previous search and the pinned one, and
// exports its knee.
func (d *Daemon) searchJob(ctx context.Context, p config.Profile) {
	rep, err := d.soak.TrySearch(ctx, p)
	if err != nil {
		d.log.Warn("search skipped", "profile", p.Name, "err", err)
		return
	}
	if err := d.store.CompareSearch(rep); err != nil {
		d.log.Warn("comparing the search with earlier searches", "profile", p.Name, "err", err)
	}
	d.soak.RecordSearch(rep)
	if err := d.store.SaveSearch(rep); err != nil {
		d.log.Error("saving the search report", "profile", p.Name, "err", err)
	}
	d.log.Info("search ended", "profile", p.Name, "result", rep.Result, "verdict", rep.Verdict())
}

// cronLogger adapts slog to cron's logger, which reports recovered panics.
type cronLogger struct{ log *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) { l.log.Debug("cron: "+msg, kv...) }
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.log.Error("cron: "+msg, append(kv, "err", err)...)
}

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	// OpenMetrics, when the scraper asks for it, carries the latency
	// histograms' exemplars (the message of a slow delivery).
	mux.Handle("/metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg, EnableOpenMetrics: true}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.bg.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %d of %d sessions online\n", d.bg.Online(), d.bg.Sessions())
			return
		}
		fmt.Fprintf(w, "ready: %d of %d sessions online\n", d.bg.Online(), d.bg.Sessions())
	})
	// Prometheus's convention: POST only, and it can be turned off
	// (SIGHUP still reloads).
	mux.HandleFunc("/-/reload", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case d.noReloadEndpoint:
			http.Error(w, "reload over HTTP is disabled (--web.enable-reload=false); send SIGHUP instead", http.StatusForbidden)
		case r.Method != http.MethodPost:
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed: POST to reload", http.StatusMethodNotAllowed)
		default:
			changed, err := d.reloadChanges()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, reloadAnswer(changed))
		}
	})
	// Profiles, as Prometheus serves them: how docs/performance.md's
	// figures were taken, and how a user finds where a shard's CPU goes.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", newStatusHandler(d, d.store, d.log))
	return mux
}

// judge fills in the recent window, the reachability, the saturation and
// the verdict of st.
func (d *Daemon) judge(st *Status, cur config.Config, now time.Time) {
	st.trend = d.trend.points()
	last := st.trend[len(st.trend)-1]
	first, _ := since(st.trend, now.Add(-recentWindow))
	st.Recent = RecentStatus{
		Window: last.at.Sub(first.at), Objective: cur.SLO.Objective, LostAfter: cur.Population.LostAfter,
		SLIs: windowSLIs(first, last), Connects: last.ok - first.ok, Failures: map[string]float64{},
	}
	for i, r := range metrics.ConnectFailReasons {
		n := last.fail[i]
		if i < len(first.fail) {
			n -= first.fail[i]
		}
		st.Recent.Connects += n
		if n > 0 {
			st.Recent.Failures[r] = n
		}
	}
	reach := d.reach.State()
	st.Reachability = reachStatus(reach)
	st.Saturation = SaturationStatus{Saturated: d.health.Saturated(), Causes: nonNil(d.health.Causes())}
	if st.Saturation.Saturated {
		st.Saturation.Since = d.health.Since()
	}
	in := verdictInput{
		now: now, started: d.started, reach: reach,
		startGrace: cur.Population.Ramp + readyGraceAfterRamp,
		online:     st.Population.Online, users: st.Population.Sessions, ready: st.Population.Ready,
		saturation: st.Saturation, recent: st.Recent,
		lagging: metrics.Value(d.metrics.For(d.cfg.Target.Name, metrics.SourceBackground).SessionsLagging),
	}
	if r := d.lastRound.Load(); r != nil && d.canary != nil {
		in.lastCanary = &canaryOutcome{end: r.End, pass: r.Result == metrics.ResultPass, detail: canarySummary(r)}
		// A failed round counts until the next one should have
		// replaced it, with room for its jitter and deadline.
		in.canaryStale = 2*canaryInterval(cur.Canary.Schedule, r.End) + cur.Canary.Jitter + 2*cur.Canary.Deadline
	}
	st.Verdict = judge(in)
}

// readyGraceAfterRamp is how long after its ramp the background population
// counts as starting rather than short of sessions: the population's own
// grace before it sends anyway.
const readyGraceAfterRamp = 30 * time.Second

// canaryInterval is the gap between the rounds due after t.
func canaryInterval(spec string, t time.Time) time.Duration {
	a := nextDue(spec, t)
	if a.IsZero() {
		return 0
	}
	return nextDue(spec, a).Sub(a)
}

// Status implements statusSource: the live state for the status page. The
// handler adds the history from the store and strips the URL of anything
// secret.
func (d *Daemon) Status() Status {
	cur := d.current()
	st := Status{
		Target: d.cfg.Target.Name, Protocol: d.cfg.Target.Protocol, URL: d.cfg.Target.URL,
		Run: d.target.Run, Started: d.started,
		Population: PopulationStatus{Configured: cur.Population.Users, Sessions: d.bg.Sessions(), Online: d.bg.Online(), Ready: d.bg.Ready()},
		Canary:     CanaryStatus{Schedule: cur.Canary.Schedule, Enabled: d.canary != nil},
		Soak:       SoakStatus{Running: d.soak.Running()},
	}
	now := time.Now()
	if d.canary != nil {
		st.Canary.Next, st.Canary.Jitter = nextDue(cur.Canary.Schedule, now), cur.Canary.Jitter
		if retry := d.retry.pending(); !retry.IsZero() && retry.Before(st.Canary.Next) {
			st.Canary.Next = retry
		}
	}
	for _, p := range cur.Soak.Profiles {
		st.Soak.Profiles = append(st.Soak.Profiles, p.Name)
		st.Soak.Schedules = append(st.Soak.Schedules, ProfileSchedule{Profile: p.Name, Schedule: p.Schedule, Next: nextDue(p.Schedule, now)})
	}
	d.judge(&st, cur, now)
	for _, src := range metrics.Sources {
		set := d.metrics.For(d.cfg.Target.Name, src)
		for i, k := range metrics.Kinds {
			// The normal cohort only: a slow-reader drill's losses are
			// its subject, not the service's.
			ks := set.Kind[i].Cohort[metrics.Normal]
			fast, _ := metrics.Below(ks.DeliveryLatency, 1)
			st.SLIs = append(st.SLIs, newSLI(src, k,
				metrics.Value(ks.Expected), metrics.Value(ks.Delivered), metrics.Value(ks.Recovered), metrics.Value(ks.Lost), fast))
		}
	}
	return st
}
