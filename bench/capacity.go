// Package bench is the engine of `imcanary bench`: a capacity benchmark
// that a user runs on their own machine to size imcanary's shards.
//
// It measures with the real binary. Reference servers run as `imcanary
// refserver` processes and probers as `imcanary run` processes, each prober
// against a target of its own, so that sessions can pass what one process's
// file limit allows; the bench reads each prober as an operator would, from
// its /metrics, and from /proc (CPU time, resident set, open files). A run
// has five phases:
//
//  1. Throughput: a flood of real delivery frames to a bare read loop and
//     to a prober, one at a time, in alternating rounds; the figure is
//     deliveries per core-second of each client process, and their ratio.
//  2. Baseline: a prober with one session, whose resident set is
//     subtracted from every step's to give bytes per session.
//  3. Logins: a bare login loop logs the largest step's sessions in to a
//     target of its own, as fast as the machine allows: the ramp's
//     baseline.
//  4. Self-noise: one prober at a fixed number of sessions and deliveries
//     per second; its receive-lag histogram gives the p99 of imcanary's own
//     delay between reading a frame and recording it.
//  5. Session steps: every prober ramps to the step's sessions (one prober
//     after another, so each ramp is timed on an otherwise quiet machine),
//     settles, and is measured over a window. The steps climb to the file
//     limit and stop at the first one in which a prober's saturation
//     detector fires.
//
// The plan is then arithmetic on those figures (makePlan).
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Options configures a run.
type Options struct {
	// Exe is the imcanary binary whose target, run and bench bare-reader
	// subcommands the workers run: normally the running one.
	Exe string
	// Dir is a scratch directory for the workers' data and the target
	// secret; the caller removes it.
	Dir string
	// Quick runs at CI scale: two small steps and short windows, in under
	// a minute.
	Quick bool
	// Processes is how many probers (and reference servers) run side by
	// side. At least 1.
	Processes int
	// TargetURL, if set, is a running target that every prober connects
	// to instead of servers of its own; SecretFile holds its token secret.
	TargetURL  string
	SecretFile string
	// Steps are the sessions per process of each step; nil plans them
	// from the file limit.
	Steps []int
	// Rate is the messages per second each user sends in the session
	// steps. 0, the default, holds idle sessions with heartbeats: the
	// cost of traffic is measured apart, in the self-noise step, and the
	// plan adds the two.
	Rate float64
	// ConnectRate is the logins per second each prober is allowed; 0 is
	// 10,000.
	ConnectRate float64
	// Config supplies the population's shape (group size, heartbeat,
	// deadlines), the saturation limits the probers run with and plan
	// against, and the users and rate to size. ConfigFile names it in
	// the report; "" is the defaults.
	Config     config.Config
	ConfigFile string
	// Progress, if set, is called as the run goes, from the goroutine
	// that called Run.
	Progress func(Progress)
}

// Progress is where a run is.
type Progress struct {
	// Phase is "throughput", "baseline", "logins", "noise" or "step".
	Phase string
	// Step is the 1-based step of Steps, in the step phase.
	Step, Steps        int
	SessionsPerProcess int
	Processes          int
	// Online of Sessions are online, over every prober.
	Online, Sessions int
	// LoginsPerSecond while ramping; DeliveriesPerSecond once online.
	LoginsPerSecond     float64
	DeliveriesPerSecond float64
	// Elapsed since the run began.
	Elapsed time.Duration
	// Note says what is going on, in a few words.
	Note string
}

// Defaults of Options and of the run's shape.
const (
	defaultConnectRate = 10000
	// maxProcesses bounds --processes: prober i dials from 127.0.0.(2+i).
	maxProcesses = 250
	// floodConns is how many connections each flood client holds: enough
	// that the read loops are many goroutines, as in a real population.
	floodConns = 100
	// floodRate is the flood's pace: the self-noise operating point's
	// deliveries per second, at 200 a second per connection.
	floodRate = 20000
	// noise step: the operating point, and a tenth of it quick.
	noiseSessions        = 10000
	noiseDeliveries      = 20000
	quickNoiseSessions   = 1000
	quickNoiseDeliveries = 2000
)

// timing is the shape of a run in time.
type timing struct {
	settle      time.Duration // least wait after the last login
	window      time.Duration // each step's measurement
	poll        time.Duration // scrapes during a window
	floodRounds int
	floodWarm   time.Duration
	floodWindow time.Duration
	baseline    time.Duration
}

var (
	fullTiming = timing{
		settle: 10 * time.Second, window: 20 * time.Second, poll: 2 * time.Second,
		floodRounds: 3, floodWarm: time.Second, floodWindow: 5 * time.Second, baseline: 5 * time.Second,
	}
	quickTiming = timing{
		settle: 2 * time.Second, window: 3 * time.Second, poll: time.Second,
		floodRounds: 2, floodWarm: 500 * time.Millisecond, floodWindow: 1500 * time.Millisecond, baseline: 2 * time.Second,
	}
)

// bench is one run.
type bench struct {
	o       Options
	t       timing
	rep     *Report
	started time.Time
	env     []string
	secret  string // secret file for the probers; "" for none
	// Features of the binary, from its run --help: the other engineers'
	// keys may not be there in an older build.
	connectRateKey, sourceAddrsKey bool
	ownServers                     bool
	seq                            int // numbers prober data directories
	// baseline figures, for the steps.
	baseRSS, baseHeap, baseTargetRSS int64
	// Step-phase progress context.
	cur Progress
}

// Run runs the bench and returns its report. The report is returned even
// when Run fails or ctx ends part way, holding what was measured until
// then, with Stop saying why.
func Run(ctx context.Context, o Options) (*Report, error) {
	b, err := newBench(o)
	if err != nil {
		return nil, err
	}
	err = b.run(ctx)
	b.rep.Seconds = time.Since(b.started).Seconds()
	switch {
	case ctx.Err() != nil:
		b.rep.Stop = Stop{Reason: StopInterrupted, Detail: ctx.Err().Error()}
		err = ctx.Err()
	case err != nil && b.rep.Stop.Reason == "":
		b.rep.Stop = Stop{Reason: StopError, Detail: err.Error()}
	}
	// Judged on the final Stop: an interrupted run reached no limit.
	setLimit(b.rep)
	return b.rep, err
}

func newBench(o Options) (*bench, error) {
	switch {
	case o.Exe == "":
		return nil, errors.New("no imcanary binary to run workers with")
	case o.Dir == "":
		return nil, errors.New("no scratch directory")
	case o.Processes < 1 || o.Processes > maxProcesses:
		return nil, fmt.Errorf("processes %d: want 1 to %d", o.Processes, maxProcesses)
	case o.Rate < 0 || o.Rate > 1000:
		return nil, fmt.Errorf("rate %v: want 0 to 1000 messages per second per user", o.Rate)
	case o.ConnectRate < 0:
		return nil, fmt.Errorf("connect rate %v: must not be negative", o.ConnectRate)
	case o.Config.Population.GroupSize < 2:
		return nil, fmt.Errorf("population.group_size %d: want at least 2", o.Config.Population.GroupSize)
	}
	if o.ConnectRate == 0 {
		o.ConnectRate = defaultConnectRate
	}
	var gomaxprocs int
	if o.Processes > 1 {
		gomaxprocs = sharedGOMAXPROCS(runtime.GOMAXPROCS(0), o.Processes)
	}
	b := &bench{o: o, t: fullTiming, started: time.Now(), env: childEnv(gomaxprocs), ownServers: o.TargetURL == ""}
	mode := "full"
	if o.Quick {
		b.t, mode = quickTiming, "quick"
	}
	b.rep = &Report{Version: ReportVersion, Mode: mode, Started: b.started.UTC().Truncate(time.Second), Steps: []Step{}, Warnings: []string{},
		Setup: Setup{WorkerGOMAXPROCS: gomaxprocs}}
	return b, nil
}

func (b *bench) warn(format string, args ...any) {
	b.rep.Warnings = append(b.rep.Warnings, fmt.Sprintf(format, args...))
}

func (b *bench) progress(p Progress) {
	if b.o.Progress == nil {
		return
	}
	p.Elapsed = time.Since(b.started)
	b.o.Progress(p)
}

func (b *bench) run(ctx context.Context) error {
	m, warns := readMachine()
	b.rep.Machine = m
	for _, w := range warns {
		b.warn("%s", w)
	}
	if m.FileLimit <= fileReserve+10 {
		return fmt.Errorf("file limit %d: too low for even a small prober", m.FileLimit)
	}
	if err := b.setup(ctx); err != nil {
		return err
	}
	if err := b.throughput(ctx); err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	if err := b.baseline(ctx); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if err := b.logins(ctx); err != nil {
		return fmt.Errorf("bare logins: %w", err)
	}
	if err := b.noise(ctx); err != nil {
		return fmt.Errorf("self-noise: %w", err)
	}
	b.steps(ctx)
	b.plan()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// setup writes the target secret, finds the binary's features and records
// how the run is set up.
func (b *bench) setup(ctx context.Context) error {
	o := b.o
	if b.ownServers {
		sec := make([]byte, 32)
		_, _ = rand.Read(sec)
		b.secret = filepath.Join(o.Dir, "secret")
		if err := os.WriteFile(b.secret, []byte(hex.EncodeToString(sec)), 0o600); err != nil {
			return err
		}
	} else {
		b.secret = o.SecretFile
		if b.secret == "" && os.Getenv(config.SecretEnv) != "" {
			// Workers do not inherit IMCANARY_* variables; the secret
			// reaches them as a file, never on a command line.
			b.secret = filepath.Join(o.Dir, "secret")
			if err := os.WriteFile(b.secret, []byte(os.Getenv(config.SecretEnv)), 0o600); err != nil {
				return err
			}
		}
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	help, _ := exec.CommandContext(hctx, o.Exe, "run", "--help").CombinedOutput()
	b.connectRateKey = strings.Contains(string(help), "--population.max_connect_rate")
	// Source addresses matter only against reference servers on loopback,
	// where the bench can give each prober an address of its own.
	b.sourceAddrsKey = strings.Contains(string(help), "--population.source_addrs") && b.ownServers
	if o.Config.Population.Reactor && !strings.Contains(string(help), "--population.reactor") {
		return fmt.Errorf("population.reactor is on, and %s run --help does not list it: this imcanary has no reactor", o.Exe)
	}
	if !strings.Contains(string(help), "--population.users") {
		return fmt.Errorf("%s run --help does not list the population keys: is it imcanary?", o.Exe)
	}

	c := o.Config
	s := &b.rep.Setup
	s.Processes, s.Target = o.Processes, "reference"
	if !b.ownServers {
		s.Target = o.TargetURL
	}
	s.Rate, s.GroupSize, s.HeartbeatSeconds = o.Rate, c.Population.GroupSize, c.Population.Heartbeat.Seconds()
	s.ConnectRate, s.ConnectLimiter = o.ConnectRate, "population.ramp"
	if b.connectRateKey {
		s.ConnectLimiter = "population.max_connect_rate"
	} else {
		b.warn("this imcanary has no population.max_connect_rate: logins are paced by population.ramp (users / %g per second)", o.ConnectRate)
	}
	s.SourceAddrs = b.sourceAddrsKey && o.Processes > 1
	s.Reactor = c.Population.Reactor
	s.SettleSeconds, s.WindowSeconds = b.t.settle.Seconds(), b.t.window.Seconds()
	s.NoiseSessions, s.NoiseDeliveriesPerSecond = noiseSessions, noiseDeliveries
	if o.Quick {
		s.NoiseSessions, s.NoiseDeliveriesPerSecond = quickNoiseSessions, quickNoiseDeliveries
	}
	if most := maxSessionsPerProcess(b.rep.Machine.FileLimit); s.NoiseSessions > most {
		// Keep the operating point's deliveries per session.
		s.NoiseDeliveriesPerSecond *= float64(most) / float64(s.NoiseSessions)
		s.NoiseSessions = most
	}
	s.Saturation = map[string]string{}
	for args := b.saturationArgs(); len(args) >= 2; args = args[2:] {
		s.Saturation[strings.TrimPrefix(args[0], "--")] = args[1]
	}
	return nil
}

// saturationArgs are the saturation.* flags of every prober: the
// configuration's limits, but for two.
//
// max_fds is 1: the steps climb to the file limit on purpose, and the plan
// applies the configured max_fds itself (Plan.FDBound); a detector firing
// at 90% of the limit would only stop the climb short of what it measures.
// A quick run judges over a 2 s window, so that its short steps are not
// judged on their ramp.
func (b *bench) saturationArgs() []string {
	s := b.o.Config.Saturation
	interval, window := s.Interval, s.Window
	if b.o.Quick {
		interval, window = time.Second, 2*time.Second
	}
	return []string{
		"--saturation.interval", interval.String(),
		"--saturation.window", window.String(),
		"--saturation.max_send_lag", s.MaxSendLag.String(),
		"--saturation.max_receive_lag", s.MaxReceiveLag.String(),
		"--saturation.max_sched_latency", s.MaxSchedLatency.String(),
		"--saturation.max_gc_pause", s.MaxGCPause.String(),
		"--saturation.max_cpu", ftoa(s.MaxCPU),
		"--saturation.max_fds", "1",
		"--saturation.max_ports", ftoa(s.MaxPorts),
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// finite returns f, or 0 if it is NaN or infinite: JSON has no NaN, and a
// figure that could not be computed is 0 in the report.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// median of xs, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
