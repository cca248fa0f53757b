// Package soak runs soak tests: a cohort of users ramped in on top of the
// background population, open-loop traffic for a duration, a drain, and a
// report (report.Soak) with a verdict. Keeping the report is package
// history's, showing it package report's.
package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/report"
)

// RunnerOptions configures a Runner.
type RunnerOptions struct {
	// Connection is the prober's, shared with its other populations. Its
	// Health, if set, is the prober's self-monitor: the population
	// records its own lags in it, and, as a SaturationSource, it says
	// when a run that fails was saturated, which makes the run
	// inconclusive rather than failed.
	engine.Connection
	Metrics *metrics.Metrics
	Target  string
	// Prefix names this runner's cohorts: a profile's users are
	// PREFIX-PROFILE-uN, apart from the background population, the canary
	// and any other runner.
	Prefix      string
	MessageSize int
	Logger      *slog.Logger
	// SampleEvery overrides the sample interval; by default a run takes
	// about 200 samples, one every 1 to 10 seconds.
	SampleEvery time.Duration
	// OnStart, if set, is given the report of a run as it starts (id,
	// profile, start time), before the ramp: the daemon marks the run in
	// progress in its history, so that a run the process dies in is not
	// lost (history.Store.BeginSoak).
	OnStart func(*report.Soak)
	// Storm is the population a reconnect-storm drill drops, and
	// StormSource the source label of its series (what it lost and late
	// meanwhile); nil drops the run's own cohort.
	Storm       StormTarget
	StormSource string
	// Shard is the shard of a sharded deployment this runner is on, "I/N",
	// recorded in each report so that the shards' reports of one run
	// can be merged (Merge); empty for a process of its own.
	Shard string
	// Across, when it is sharded, lays each profile's users out across
	// the shards (population.across_shards): this runner runs its slice
	// of them (engine.Options.Slice), under the same Prefix in every
	// shard, and its run's phases keep to the clock rather than to its
	// own users, so that the shards' send phases begin and end together.
	Across config.Shard
	// ShardClock, when Across is sharded, corrects the latencies of other
	// shards' senders by their clock offsets (engine.Options.ShardClock):
	// the daemon's canary ring measures them; nil corrects nothing.
	ShardClock func(shard int, now int64) (int64, bool)
}

// SaturationSource is the prober's self-monitor as a soak run uses it
// (saturation.Monitor is the real one): the population's Health, and
// why it is saturated, for the report.
type SaturationSource interface {
	engine.Health
	// Causes lists what saturates the prober now, as metrics.Cause*
	// values; empty when it is not saturated.
	Causes() []string
}

// Runner runs soak profiles against one target, one at a time.
type Runner struct {
	o RunnerOptions
	// busy holds while a run is in progress: at most one soak per target.
	busy    sync.Mutex
	running atomic.Value // profile name of the run in progress, or ""
}

// Running returns the name of the profile being run, or "".
func (r *Runner) Running() string {
	s, _ := r.running.Load().(string)
	return s
}

// NewRunner returns a runner.
func NewRunner(o RunnerOptions) *Runner {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	// The process's limiter is the daemon's or the one-shot command's;
	// without one, the runs of this runner share one of their own, which
	// also counts their attempts for a storm drill.
	if o.Limiter == nil && o.MaxConnectRate > 0 {
		o.Limiter = engine.NewConnectLimiter(o.MaxConnectRate)
	}
	return &Runner{o: o}
}

// Progress is a run's state, reported every sample interval.
type Progress struct {
	Phase   string
	Elapsed time.Duration
	// Remaining is what the profile has left from where the run is: the
	// rest of the current phase as configured, from when it actually
	// began, and the phases after it. The drain may end sooner.
	Remaining time.Duration
	// Online is the sessions online, of Users: the profile's users times
	// their devices.
	Online      int
	Users       int
	SentPerSec  float64
	DelivPerSec float64
	Lost        int64
	Late        int64
	// LostAfter is the profile's lost_after: a delivery is judged lost
	// only once it has been missing that long after its intended send
	// time, so Lost stays 0 until then whatever the server does.
	// LossJudged says that moment has come for the first messages of the
	// send phase; before it, a Lost of 0 means nothing yet.
	LostAfter  time.Duration
	LossJudged bool
}

// ErrBusy is returned by TryRun while another run is in progress.
var ErrBusy = errors.New("soak: another run is in progress on this target")

// TryRun runs profile p unless another run is in progress, which it counts
// as skipped.
func (r *Runner) TryRun(ctx context.Context, p config.Profile, progress func(Progress)) (*report.Soak, error) {
	if !r.busy.TryLock() {
		r.o.Metrics.SoakSkipped.WithLabelValues(r.o.Target, p.Name).Inc()
		return nil, ErrBusy
	}
	defer r.busy.Unlock()
	return r.run(ctx, p, progress, false)
}

// Run runs profile p, after any run in progress. When ctx ends early the
// run stops cleanly and its report says aborted. The error is for a run
// that could not start at all.
func (r *Runner) Run(ctx context.Context, p config.Profile, progress func(Progress)) (*report.Soak, error) {
	r.busy.Lock()
	defer r.busy.Unlock()
	return r.run(ctx, p, progress, false)
}

// run runs p; a search's step is not counted as a soak run of the profile
// in the metrics (imcanary_soak_runs_total and the last success): a search
// fails steps on purpose, and the soak alert must not take one for a run
// that failed.
func (r *Runner) run(ctx context.Context, p config.Profile, progress func(Progress), step bool) (*report.Soak, error) {
	o := r.o
	set := o.Metrics.For(o.Target, metrics.SourceSoak)
	running := o.Metrics.SoakRunning.WithLabelValues(o.Target, p.Name)
	obs := newObserver(o.Health)
	pop, err := r.newPopulation(p, set, obs)
	if err != nil {
		return nil, err
	}
	// The observer learns who reads slowly before any session runs.
	obs.setUsers(pop)
	late, slow, lateNormal := cohorts(pop)
	running.Set(1)
	r.running.Store(p.Name)
	defer func() { running.Set(0); r.running.Store("") }()

	start := time.Now()
	rep := r.newReport(p, pop, start)
	before := snapshot(set)
	connectBefore := readConnect(set)
	log := o.Logger.With("profile", p.Name, "run", rep.ID)
	log.Info("soak run starting", "users", p.Users, "rate", p.Rate, "duration", p.Duration)
	if o.OnStart != nil {
		begun := *rep
		o.OnStart(&begun)
	}

	popCtx, stopPop := context.WithCancel(context.Background())
	defer stopPop()
	var wg sync.WaitGroup
	// Exits when stopPop is called, after logging every user out.
	wg.Go(func() { _ = pop.Run(popCtx) })

	s := &sampler{
		r: r, p: p, pop: pop, set: set, obs: obs, before: before, start: start,
		normal: r.localUsers(p) - slow, lateNormal: lateNormal, progress: progress, phase: report.PhaseRamp,
		minOnline: -1, prev: before, prevT: start, phaseStart: start,
	}
	sampleCtx, stopSampler := context.WithCancel(context.Background())
	// Exits when stopSampler is called.
	wg.Go(func() { s.loop(sampleCtx) })

	// st is the storm drill's record, nil until its drop.
	var st *storm
	stormCtx, stopStorm := context.WithCancel(context.Background())
	defer stopStorm()
	aborted := false
	phase := func(name string) {
		now := time.Now()
		s.setPhase(name, now)
		if name == report.PhaseSend {
			obs.setSendStart(now, p.Settle)
		}
		rep.Phases = append(rep.Phases, report.Phase{Name: name, Start: now})
	}
	phase(report.PhaseRamp)
	aborted = waitRamp(ctx, pop, start, r.localUsers(p)-late, r.o.Across.Sharded())
	// sendStart and sendEnd bound the send phase as it ran, which an
	// abort cuts short: the report's rates are over this span, never the
	// profile's duration.
	var sendStart, sendEnd time.Time
	if !aborted {
		phase(report.PhaseSend)
		sendStart = rep.Phases[len(rep.Phases)-1].Start
		st, aborted = r.send(ctx, p, pop, obs, s, &wg, stormCtx)
		sendEnd = time.Now()
	}
	if !aborted {
		phase(report.PhaseDrain)
		aborted = drain(ctx, p, pop, set, before, r.o.Across.Sharded())
	}
	stopSampler()
	stopStorm()
	stopPop()
	wg.Wait()
	finishReport(rep, pop, s)
	r.fill(rep, p, snapshot(set).sub(before), obs, s, st, slow, aborted, sendEnd.Sub(sendStart))
	rep.ConnectPath = connectPath(connectBefore, readConnect(set), rep.Latency["login"])

	result := rep.Result
	if !step {
		r.record(p, rep)
	}
	log.Info("soak run ended", "result", result, "took", rep.End.Sub(start).Round(time.Millisecond))
	return rep, nil
}

// newReport is the report of a run of p begun at start, before any of
// its figures.
func (r *Runner) newReport(p config.Profile, pop *engine.Population, start time.Time) *report.Soak {
	rep := &report.Soak{
		ID: report.NewRunID(start), Kind: "soak", Target: r.o.Target, Start: start,
		Profile: profileOf(p),
		Users:   report.Users{Configured: r.localUsers(p), Groups: pop.OwnGroups()},
		CatchUp: config.CatchUpOff, Shard: r.o.Shard,
	}
	if r.o.Connection.CatchUp {
		rep.CatchUp = config.CatchUpOn
	}
	return rep
}

// localUsers is how many of p's users this runner runs: all, but where
// they are laid out across shards.
func (r *Runner) localUsers(p config.Profile) int {
	if sl := r.slice(p); sl.Across() {
		return sl.Hi - sl.Lo
	}
	return p.Users
}

// rampGrace is how long after the configured ramp (longer if the connect
// rate limit needs it) the ramp phase ends at the latest.
const rampGrace = 30 * time.Second

// waitRamp waits out the ramp phase of a run begun at start, in which due
// users are due to log in, and reports whether ctx ended. The ramp ends
// when every user due has logged in, or rampGrace after the configured
// ramp: the verdict will say who never did. across ends it at a moment
// every shard of a run reaches together, so that the shards send together
// and none sends to users another has yet to log in: the ramp and as long
// again, 5 s at least and rampGrace at most.
func waitRamp(ctx context.Context, pop *engine.Population, start time.Time, due int, across bool) (aborted bool) {
	end := start.Add(pop.Ramp() + rampGrace)
	if across {
		end = start.Add(pop.Ramp() + min(max(pop.Ramp(), 5*time.Second), rampGrace))
	}
	rampCtx, endRamp := context.WithDeadline(ctx, end)
	// Online counts sessions: each user due holds one per device.
	pop.WaitOnline(rampCtx, due*pop.Devices())
	endRamp()
	if across {
		return !probe.Sleep(ctx, time.Until(end))
	}
	return ctx.Err() != nil
}

// finishReport puts in rep the run's end and what its sampler and
// population saw, once every goroutine of the run has stopped.
func finishReport(rep *report.Soak, pop *engine.Population, s *sampler) {
	rep.End = time.Now()
	rep.Samples = s.samples
	rep.Users.LoggedIn = pop.LoggedIn()
	rep.Users.MinOnlineRatio = s.minOnline
	if s.minOnline < 0 {
		rep.Users.MinOnlineRatio = 0
	}
}

// newPopulation makes the population of profile p, paused until its send
// phase.
func (r *Runner) newPopulation(p config.Profile, set *metrics.Set, obs *observer) (*engine.Population, error) {
	o := r.o
	sr := p.SlowReaders
	var untrusted prometheus.Counter
	if o.ShardClock != nil && r.slice(p).Across() {
		untrusted = o.Metrics.Clock.Untrusted.WithLabelValues(o.Target, metrics.SourceSoak)
	}
	return engine.NewPopulation(engine.Options{
		Connection:          o.Connection,
		Set:                 set,
		Logger:              o.Logger.With("profile", p.Name),
		Prefix:              o.Prefix + "-" + p.Name,
		Slice:               r.slice(p),
		ShardClock:          o.ShardClock,
		Users:               p.Users,
		Ramp:                p.Ramp,
		GroupSize:           p.GroupSize,
		Groups:              p.GroupLayout(),
		Behaviours:          p.Behaviours,
		Devices:             p.Devices,
		Rate:                p.Rate,
		Deadline:            p.Deadline,
		LostAfter:           p.LostAfter,
		MessageSize:         o.MessageSize,
		Observer:            obs,
		StartPaused:         true,
		LateFraction:        p.LateLogins,
		LateAfter:           p.LateAfter,
		SlowReaders:         engine.SlowReaders{Fraction: sr.Fraction, ReadDelay: sr.ReadDelay, Pause: sr.Pause, PauseEvery: sr.PauseEvery},
		ShardClockUntrusted: untrusted,
	})
}

// slice is the slice of p's users this runner runs where they are laid
// out across shards; the zero Slice (all of them) otherwise.
func (r *Runner) slice(p config.Profile) engine.Slice {
	return engine.SliceOf(r.o.Across.Index, r.o.Across.Count, p.Users)
}

// cohorts counts a population's late users (for the ramp), its slow
// readers (judged apart), and the late users among the others (the online
// ratio counts normal users and their late ones).
func cohorts(pop *engine.Population) (late, slow, lateNormal int) {
	sl := pop.Slice()
	for i := sl.Lo; i < sl.Hi; i++ {
		switch {
		case pop.Slow(i):
			slow++
		case pop.Late(i):
			lateNormal++
		}
		if pop.Late(i) {
			late++
		}
	}
	return late, slow, lateNormal
}

// send runs the send phase: the profile's duration of traffic, with its
// storm drill if it has one (st, whose sampler wg owns until stormCtx
// ends). aborted is whether ctx ended first.
func (r *Runner) send(ctx context.Context, p config.Profile, pop *engine.Population, obs *observer, s *sampler, wg *sync.WaitGroup, stormCtx context.Context) (st *storm, aborted bool) {
	pop.SetSending(true)
	if p.Storm.Fraction > 0 {
		aborted = !probe.Sleep(ctx, p.Storm.After)
		if !aborted {
			st = r.drop(p, pop, obs, s)
			// Exits when every dropped session is back or stopStorm
			// is called.
			wg.Go(func() { st.sample(stormCtx) })
			aborted = !probe.Sleep(ctx, p.Duration-p.Storm.After)
		}
	} else {
		aborted = !probe.Sleep(ctx, p.Duration)
	}
	// A sample inside the send phase, however short it was: the
	// online ratio is judged on send-phase samples.
	s.sample(time.Now())
	pop.SetSending(false)
	return st, aborted
}

// drain waits, sweeping, until every owed delivery is delivered or lost,
// or for the profile's drain, and reports whether ctx ended first. across
// drains for the whole of it, and for at least lost_after and a deadline:
// a shard counts owed what other shards receive, so its own counts never
// balance, and a receiver settles the last messages of another shard's
// stream only lost_after after they came (see engine.Inbox.Sweep).
func drain(ctx context.Context, p config.Profile, pop *engine.Population, set *metrics.Set, before counts, across bool) (aborted bool) {
	span := p.Drain
	if across {
		span = max(span, p.LostAfter+p.Deadline)
	}
	drainEnd := time.Now().Add(span)
	for time.Now().Before(drainEnd) {
		pop.Sweep(time.Now())
		if d := snapshot(set).sub(before); !across && pop.Inflight() == 0 && d.all().Expected <= d.all().Delivered+d.all().Lost {
			break
		}
		if !probe.Sleep(ctx, 50*time.Millisecond) {
			aborted = true
			break
		}
	}
	pop.Sweep(time.Now())
	return aborted
}

// record exports the run's result. An inconclusive run says nothing
// about the server either way, so the last success stands as it was.
func (r *Runner) record(p config.Profile, rep *report.Soak) {
	o := r.o
	result := rep.Result
	o.Metrics.SoakRuns.WithLabelValues(o.Target, p.Name, result).Inc()
	if result != metrics.ResultInconclusive {
		success := 0.0
		if result == metrics.ResultPass {
			success = 1
		}
		o.Metrics.SoakLastSuccess.WithLabelValues(o.Target, p.Name).Set(success)
	}
}

// fill computes the report's counts, percentiles and verdict. d counts the
// run's normal users; the slow readers, slow of them, go to the drill.
// sending is how long the send phase ran (0 when it never began): the
// rates are over it.
func (r *Runner) fill(rep *report.Soak, p config.Profile, d counts, obs *observer, s *sampler, st *storm, slow int, aborted bool, sending time.Duration) {
	rep.Deliveries = map[string]report.Deliveries{}
	var all report.Deliveries
	for i, k := range metrics.Kinds {
		dk := d.kind[i].Deliveries
		dk.Undelivered = max(0, dk.Expected-dk.Delivered-dk.Recovered-dk.Lost)
		setRatios(&dk)
		rep.Deliveries[k] = dk
		addTo(&all, dk)
	}
	setRatios(&all)
	rep.Deliveries["all"] = all

	m := report.Messages{Rejected: map[string]int64{}}
	for i := range d.kind {
		m.Sent += d.kind[i].sent
	}
	m.Offline = d.sendErr[metrics.SendOffline]
	m.WriteErrors = d.sendErr[metrics.SendWrite]
	m.Unacked = d.sendErr[metrics.SendAckTimeout] + d.sendErr[metrics.SendDisconnected]
	obs.mu.Lock()
	for code, n := range obs.rejected {
		m.Rejected[code] = n
	}
	m.Acked = obs.acked
	rep.Latency = map[string]report.Percentiles{
		"login":           percentiles(obs.login),
		"ack":             percentiles(obs.ack),
		"delivery_direct": percentiles(obs.deliv[0]),
		"delivery_group":  percentiles(obs.deliv[1]),
	}
	hists := map[string]*hdrhistogram.Histogram{
		"login": obs.login, "ack": obs.ack, "delivery_direct": obs.deliv[0], "delivery_group": obs.deliv[1],
	}
	both := hdrhistogram.Import(obs.deliv[0].Export())
	both.Merge(obs.deliv[1])
	if s.lateNormal > 0 {
		rep.Latency["delivery_on_time"] = percentiles(obs.onTimeDeliv)
		rep.Latency["delivery_late_login"] = percentiles(obs.lateDeliv)
		hists["delivery_on_time"], hists["delivery_late_login"] = obs.onTimeDeliv, obs.lateDeliv
	}
	rep.Histograms = encodeHistograms(hists)
	rep.Errors = topErrors(obs.errors, 10)
	// Normal users' disconnects: the slow readers' are the drill's.
	rep.Disconnects = map[string]int64{}
	var disconnects int64
	for _, reason := range metrics.DisconnectReasons {
		if reason == metrics.ReasonShutdown {
			continue
		}
		rep.Disconnects[reason] = obs.disc[0][reason]
		disconnects += obs.disc[0][reason]
	}
	obs.mu.Unlock()
	if sending > 0 {
		m.SendSeconds = sending.Seconds()
		m.SentPerSec = float64(m.Sent) / m.SendSeconds
	}
	rep.Messages = m
	rep.Users.FailedLogins = d.connectFail

	// Refused: rejected with a code, or no ack within the ack timeout;
	// a send a disconnect cut short is the disconnect's.
	refused := d.sendErr[metrics.SendAckTimeout]
	rep.Messages.AckTimeouts = refused
	for _, n := range m.Rejected {
		refused += n
	}
	tl := tally{all: all, delivery: both, refused: refused, disconnects: disconnects}
	if s.lateNormal > 0 {
		tl.onTime, tl.late = obs.onTimeDeliv, obs.lateDeliv
	}
	rep.Thresholds = thresholdRows(rep, tl)
	if slow > 0 {
		rep.Drill = drillOf(p, slow, d, obs, s.slowLag(), percentiles(both).P99)
	}
	rep.Saturation = s.saturation(rep, obs.satDeliv.Load())
	if st != nil {
		r.fillStorm(rep, p, st)
	}
	rep.Result = resultOf(rep, aborted)
	if aborted {
		note := "The run was stopped before its end: counts cover only the time it ran"
		if sending > 0 {
			note += fmt.Sprintf(", and the send rate is over the %s it sent, not the %s planned", report.FormatSpan(sending), report.FormatSpan(p.Duration))
		}
		rep.Notes = append(rep.Notes, note+".")
	}
	if note := saturationNote(rep); note != "" {
		rep.Notes = append(rep.Notes, note)
	}
	rep.Notes = append(rep.Notes,
		"Latency is measured from each message's intended send time (open loop), so a sender that fell behind shows as latency.",
		"Loss ratio counts deliveries the ledger wrote off (lost) and those still missing when the drain ended (undelivered), over deliveries owed for acknowledged messages (one per recipient device); eventual completeness is its complement. Real-time completeness counts only what was pushed within the deadline: a message a device fetched by catch-up (recovered) is complete eventually but not in real time.",
		"Percentiles come from HDR histograms with 3 significant digits; min_online_ratio is the lowest sampled ratio of normal users online to normal users due online during the send phase.",
	)
	if sh := r.o.Across; sh.Sharded() {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Shard %s of a population laid out across %d shards (population.across_shards): it counts owed every delivery its users' messages make, in whichever shard the recipient lives, and delivered or lost only what its own users receive, from any shard. Its deliveries and verdict are one part of the run: judge the run by the shards' reports merged (imcanary soak merge).", sh, sh.Count))
	}
	if p.Settle > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("The run settled for the first %s of sending: the latency figures and thresholds count the messages sent after it, "+
			"the charts and every count (sent, delivered, lost) all of them.", p.Settle))
	}
	switch {
	case rep.Drill != nil:
		rep.Notes = append(rep.Notes, drillNote(rep.Drill, p.Users))
	case p.SlowReaders.Fraction > 0:
		rep.Notes = append(rep.Notes, fmt.Sprintf("slow_readers.fraction %v of %s users makes no slow reader: the run was not a drill.",
			p.SlowReaders.Fraction, report.FormatCount(int64(p.Users))))
	}
}

func ratioRow(name string, limit, actual float64, pass bool) report.Threshold {
	return report.Threshold{Name: name, Limit: pct(limit), Actual: pct(actual), LimitValue: limit, ActualValue: actual, Pass: pass}
}

// durationRow judges a latency against its limit, both written as the
// report writes latencies; an actual that would read as the limit though
// it is over it keeps a millisecond's precision.
func durationRow(name string, limit, actual time.Duration) report.Threshold {
	a, l := report.FormatLatency(actual), report.FormatLatency(limit)
	if a == l && actual != limit {
		a = actual.Round(time.Millisecond).String()
	}
	return report.Threshold{Name: name, Limit: l, Actual: a,
		LimitValue: limit.Seconds(), ActualValue: actual.Seconds(), Pass: actual <= limit}
}

// withCause gives a failed threshold its cause, where one is known.
func withCause(t report.Threshold, cause string) report.Threshold {
	if !t.Pass {
		t.Cause = cause
	}
	return t
}

// lateLoginCause says why a p99 delivery latency failed when most of the
// deliveries slower than the limit went to users who logged in late:
// messages the server held for them while they were offline, delivered
// at their login. "" when they were not the most.
func lateLoginCause(lateSlow, onTimeSlow int64, limit time.Duration, onTime report.Percentiles) string {
	n := lateSlow + onTimeSlow
	if n == 0 || 2*lateSlow < n {
		return ""
	}
	return fmt.Sprintf("%s of the %s deliveries slower than %s went to users who logged in late (held for them while offline); the on-time recipients' p99 was %s",
		pct(float64(lateSlow)/float64(n)), report.FormatCount(n), report.FormatLatency(limit), report.FormatLatency(onTime.P99))
}

func pct(v float64) string { return fmt.Sprintf("%.4g%%", 100*v) }

func profileOf(p config.Profile) report.Profile {
	t := p.Thresholds
	return report.Profile{
		Name: p.Name, Users: p.Users, GroupSize: p.GroupSize, Groups: p.Groups, Devices: p.Devices, Rate: p.Rate, Ramp: p.Ramp,
		Duration: p.Duration, Settle: p.Settle, Drain: p.Drain, Deadline: p.Deadline,
		LateLogins: p.LateLogins, LateAfter: p.LateAfter,
		Thresholds: report.Thresholds{MaxLoss: t.MaxLoss, MaxLate: t.MaxLate, MaxRefused: t.MaxRefused, MinRealtimeCompleteness: t.MinRealtimeCompleteness, P99Ack: t.P99Ack, P99Delivery: t.P99Delivery,
			MinOnlineRatio: t.MinOnlineRatio, MaxDisconnects: t.MaxDisconnects,
			Recovery99: t.Recovery99, Recovery100: t.Recovery100},
	}
}
