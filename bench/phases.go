package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// throughput runs the flood: a bare reader and a prober, each with
// floodConns connections to one flood server, flooded one at a time in
// alternating rounds (bare first in odd rounds, imcanary first in even
// ones, so that neither always follows the other).
func (b *bench) throughput(ctx context.Context) error {
	b.progress(Progress{Phase: "throughput", Note: "starting the flood"})
	fs, err := newFloodServer()
	if err != nil {
		return err
	}
	defer fs.close()
	bare, err := startChild("bare reader", b.o.Exe,
		[]string{"bench", "bare-reader", "--url", fs.url(), "--conns", strconv.Itoa(floodConns)}, b.env)
	if err != nil {
		return err
	}
	defer bare.kill()
	imc, err := b.startProber(ctx, proberSpec{idx: 0, url: fs.url(), users: floodConns, prefix: kindReal, flood: true})
	if err != nil {
		return err
	}
	defer imc.kill()
	if line, err := bare.line(ctx, 30*time.Second); err != nil {
		return err
	} else if line != "ready" {
		return fmt.Errorf("bare reader: unexpected output %q", line)
	}
	alive := func() error { return errors.Join(bare.alive(), imc.alive()) }
	if err := fs.waitFlood(ctx, floodConns, 30*time.Second, alive); err != nil {
		return err
	}

	delivered := map[string]func() (float64, error){
		kindBare: func() (float64, error) {
			if _, err := fmt.Fprintln(bare.stdin); err != nil {
				return 0, fmt.Errorf("bare reader: %w", err)
			}
			line, err := bare.line(ctx, 10*time.Second)
			if err != nil {
				return 0, err
			}
			return strconv.ParseFloat(strings.TrimSpace(line), 64)
		},
		kindReal: func() (float64, error) {
			s, err := fetchMetrics(ctx, imc.addr)
			if err != nil {
				return 0, errors.Join(err, imc.alive())
			}
			return s.sum(mDeliveries), nil
		},
	}
	pid := map[string]int{kindBare: bare.pid, kindReal: imc.pid}
	res := map[string]*Client{kindBare: {}, kindReal: {}}
	t := &b.rep.Throughput
	t.Connections, t.WindowSeconds, t.OfferedPerSecond = floodConns, b.t.floodWindow.Seconds(), floodRate
	var ignored0 float64
	if s, err := fetchMetrics(ctx, imc.addr); err == nil {
		ignored0 = s.sum(mIgnored)
	}
	for round := range b.t.floodRounds {
		order := []string{kindBare, kindReal}
		if round%2 == 1 {
			order = []string{kindReal, kindBare}
		}
		for _, kind := range order {
			name := map[string]string{kindBare: "bare read loop", kindReal: "imcanary"}[kind]
			b.progress(Progress{Phase: "throughput", Note: fmt.Sprintf("round %d/%d: %s", round+1, b.t.floodRounds, name)})
			stop := make(chan struct{})
			var sent int
			var wg sync.WaitGroup
			// Exits when stop is closed.
			wg.Go(func() { sent = fs.flood(kind, floodRate, stop) })
			err := b.floodWindow(ctx, delivered[kind], pid[kind], res[kind])
			close(stop)
			wg.Wait()
			res[kind].Sent += float64(sent)
			if err != nil {
				return err
			}
			if err := alive(); err != nil {
				return err
			}
		}
		t.Rounds = round + 1
	}
	for _, c := range res {
		c.DeliveriesPerCoreSecond = finite(c.Deliveries / c.CPUSeconds)
		c.DeliveriesPerSecond = finite(c.Deliveries / c.WallSeconds)
		c.CoresUsed = finite(c.CPUSeconds / c.WallSeconds)
	}
	t.Bare, t.Imcanary = *res[kindBare], *res[kindReal]
	t.Ratio = finite(t.Imcanary.DeliveriesPerCoreSecond / t.Bare.DeliveriesPerCoreSecond)
	gen := newFloodGen(floodRun, kindReal+"-u42")
	var n int
	for range 5 {
		gen.appendFrame(nil, time.Now().UnixNano())
		n += len(gen.payload)
	}
	t.FrameBytes = float64(n) / 5
	for _, c := range []*Client{&t.Bare, &t.Imcanary} {
		if c.DeliveriesPerSecond < 0.9*floodRate {
			b.warn("a flood client took %s deliveries/s of the %s offered: the machine was too busy to keep the pace, and that client's figure includes some backlog", count(c.DeliveriesPerSecond), count(floodRate))
		}
	}
	if s, err := fetchMetrics(ctx, imc.addr); err == nil {
		if d := s.sum(mIgnored) - ignored0; d > 0 {
			b.warn("the prober ignored %s flood frames (imcanary_deliveries_ignored_total): its throughput counts only deliveries", count(d))
		}
	}
	return nil
}

// floodWindow measures one client over one window of the flood, after a
// warm-up in which its goroutines settle into the pace.
func (b *bench) floodWindow(ctx context.Context, count func() (float64, error), pid int, c *Client) error {
	if err := sleep(ctx, b.t.floodWarm); err != nil {
		return err
	}
	n0, err := count()
	if err != nil {
		return err
	}
	p0, err := readProc(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := sleep(ctx, b.t.floodWindow); err != nil {
		return err
	}
	n1, err := count()
	if err != nil {
		return err
	}
	p1, err := readProc(pid)
	if err != nil {
		return err
	}
	c.Deliveries += n1 - n0
	c.CPUSeconds += p1.cpu - p0.cpu
	c.WallSeconds += time.Since(t0).Seconds()
	return nil
}

// baseline measures an idle prober with one session and its target: what
// a process costs before its sessions.
func (b *bench) baseline(ctx context.Context) error {
	b.cur = Progress{Phase: "baseline", Note: "one idle session", Sessions: 1}
	b.progress(b.cur)
	urls, targets, err := b.startTargets(ctx, 1)
	if err != nil {
		return err
	}
	var p *prober
	defer func() {
		var kids []*child
		if p != nil {
			kids = append(kids, p.child)
		}
		killAll(targets, kids)
	}()
	p, err = b.startProber(ctx, proberSpec{url: urls[0], users: 1, rate: b.o.Rate, prefix: "bench-base"})
	if err != nil {
		return err
	}
	if _, _, err := b.ramp(ctx, p, 0); err != nil {
		return err
	}
	if err := sleep(ctx, b.t.baseline); err != nil {
		return err
	}
	r, err := read(ctx, p)
	if err != nil {
		return err
	}
	b.baseRSS = r.proc.rss
	b.baseHeap = int64(r.scr.sum(mHeapInuse) + r.scr.sum(mStackInuse))
	bl := &b.rep.Baseline
	bl.RSSBytes = r.proc.rss
	if n, err := countFDs(p.pid); err == nil {
		bl.OpenFiles = n
	}
	if len(targets) > 0 {
		if s, err := readProc(targets[0].pid); err == nil {
			b.baseTargetRSS, bl.TargetRSSBytes = s.rss, s.rss
		}
	}
	return nil
}

// bareLoginWorkers is how many logins the bare login loop has in flight:
// enough to keep two cores busy on loopback.
const bareLoginWorkers = 64

// logins runs the ramp's baseline: the bare login loop (BareLogin) against
// a target of its own, at the largest step's sessions per process, which
// is the ramp the report's figure comes from.
func (b *bench) logins(ctx context.Context) error {
	steps := planSteps(b.o.Steps, maxSessionsPerProcess(b.rep.Machine.FileLimit), b.o.Quick)
	n := steps[len(steps)-1]
	b.cur = Progress{Phase: "logins", Sessions: n, SessionsPerProcess: n, Processes: 1, Note: "bare login loop"}
	b.progress(b.cur)
	urls, targets, err := b.startTargets(ctx, 1)
	if err != nil {
		return err
	}
	defer killAll(targets)
	args := []string{"bench", "bare-login", "--url", urls[0], "--users", strconv.Itoa(n),
		"--workers", strconv.Itoa(bareLoginWorkers), "--prefix", "bench-bare"}
	if b.secret != "" {
		args = append(args, "--secret-file", b.secret)
	}
	tc0 := childrenCPU(targets)
	c, err := startChild("bare login", b.o.Exe, args, b.env)
	if err != nil {
		return err
	}
	// The target before its client: see killAll.
	defer killAll(targets, []*child{c})
	line, err := c.line(ctx, time.Duration(n)*time.Millisecond+60*time.Second)
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	took := 0.0
	if len(f) == 2 && f[0] == "ready" {
		took, err = strconv.ParseFloat(f[1], 64)
	}
	if took <= 0 || err != nil {
		return fmt.Errorf("bare login: unexpected output %q", line)
	}
	l := &b.rep.Logins
	l.Sessions, l.Workers = n, bareLoginWorkers
	l.LoginsPerSecond = float64(n) / took
	// The client's CPU from its start: its setup is a few milliseconds
	// of the whole.
	l.CPUSecondsPerLogin = finite(procCPU(c.pid) / float64(n))
	if len(targets) > 0 {
		l.TargetCPUSecondsPerLogin = finite((childrenCPU(targets) - tc0) / float64(n))
	}
	return nil
}

// noise is the self-noise step: one prober at the operating point.
func (b *bench) noise(ctx context.Context) error {
	s := b.rep.Setup
	rate := rateFor(s.NoiseDeliveriesPerSecond, s.NoiseSessions, s.GroupSize)
	b.cur = Progress{Phase: "noise", SessionsPerProcess: s.NoiseSessions, Processes: 1}
	err := b.attempts(ctx, "self-noise step", func(st *Step) error {
		return b.runStep(ctx, "bench-noise", s.NoiseSessions, 1, rate, st)
	}, &b.rep.Noise)
	if b.rep.Noise.Saturated {
		b.warn("the self-noise step saturated (%s): its lags are the machine's as much as imcanary's", strings.Join(b.rep.Noise.Causes, ", "))
	}
	return err
}

// maxAttempts is how often a step is run when other processes crowd it.
const maxAttempts = 3

// attempts runs a step, and runs it again, up to maxAttempts in all, while
// it saturates with other processes busy on more than a quarter of the
// machine's cores: the detector cannot tell whose the delay is, and on a
// shared machine (CI, a developer's laptop mid-build) a step that saturated
// because of someone else's burst says nothing about imcanary. Each
// discarded attempt is named in the warnings.
func (b *bench) attempts(ctx context.Context, name string, run func(*Step) error, st *Step) error {
	for attempt := 1; ; attempt++ {
		err := run(st)
		st.Attempts = attempt
		crowded := st.OtherCores > float64(b.rep.Machine.Cores)/4
		if err != nil || !st.Saturated || !crowded || attempt == maxAttempts || ctx.Err() != nil {
			return err
		}
		b.warn("%s, attempt %d, discarded: saturated (%s) while other processes used %.2f of %d cores",
			name, attempt, strings.Join(st.Causes, ", "), st.OtherCores, b.rep.Machine.Cores)
		b.cur.Note = "crowded by other processes: again"
		b.progress(b.cur)
	}
}

// steps runs the session steps until one saturates or fails.
func (b *bench) steps(ctx context.Context) {
	most := maxSessionsPerProcess(b.rep.Machine.FileLimit)
	steps := planSteps(b.o.Steps, most, b.o.Quick)
	for i, users := range steps {
		b.cur = Progress{Phase: "step", Step: i + 1, Steps: len(steps), SessionsPerProcess: users, Processes: b.o.Processes}
		var st Step
		err := b.attempts(ctx, fmt.Sprintf("step %d", i+1), func(st *Step) error {
			return b.runStep(ctx, "bench", users, b.o.Processes, b.o.Rate, st)
		}, &st)
		if ctx.Err() != nil {
			return
		}
		var no *notOnline
		switch {
		case errors.As(err, &no):
			b.rep.Steps = append(b.rep.Steps, st)
			b.rep.Stop = Stop{Reason: StopNotOnline, Step: i + 1, Detail: err.Error()}
			return
		case err != nil:
			b.rep.Stop = Stop{Reason: StopError, Step: i + 1, Detail: err.Error()}
			return
		}
		b.rep.Steps = append(b.rep.Steps, st)
		if len(st.Discounted) > 0 {
			b.warn("step %d: %s discounted: the saturation monitor counts every prober's connections from 127.0.0.1 as each one's ephemeral ports, but each prober dials its own target, and %s connections per destination use %.0f%% of the range",
				i+1, strings.Join(st.Discounted, ", "), count(float64(st.SessionsPerProcess)),
				100*float64(st.SessionsPerProcess)/float64(b.rep.Machine.EphemeralPorts[1]-b.rep.Machine.EphemeralPorts[0]+1))
		}
		if st.Saturated {
			b.rep.Stop = Stop{Reason: StopSaturated, Step: i + 1, Detail: "saturation detector fired: " + strings.Join(st.Causes, ", ")}
			return
		}
	}
	b.rep.Stop = Stop{Reason: StopStepsDone, Detail: fmt.Sprintf("%s steps held, the last at %s sessions per process (file limit %s)",
		count(float64(len(steps))), count(float64(steps[len(steps)-1])), count(float64(b.rep.Machine.FileLimit)))}
}

// plan makes the plan from the figures.
func (b *bench) plan() {
	c := b.o.Config
	n := b.rep.Noise
	in := planInput{
		machine: b.rep.Machine,
		maxFDs:  c.Saturation.MaxFDs, maxPorts: c.Saturation.MaxPorts, maxCPU: c.Saturation.MaxCPU,
		baseFDs:       max(0, b.rep.Baseline.OpenFiles-1),
		noiseSessions: n.Sessions, noiseDeliveries: n.DeliveriesPerSecond, noiseCPU: n.CPUCores, noiseBytes: n.BytesPerSession,
		receive: b.rep.Throughput.Imcanary.DeliveriesPerCoreSecond,
		file:    b.o.ConfigFile, users: c.Population.Users, rate: c.Population.Rate, groupSize: c.Population.GroupSize,
	}
	if c.Canary.Schedule != "" {
		in.canaryUsers = c.Canary.Users
	}
	// The largest step held gives the per-session costs; failing that,
	// the largest measured.
	var ref *Step
	for i := range b.rep.Steps {
		st := &b.rep.Steps[i]
		if st.Online < st.Sessions {
			continue
		}
		if !st.Saturated {
			in.held = max(in.held, st.Sessions)
		}
		if ref == nil || ref.Saturated || (!st.Saturated && st.Sessions >= ref.Sessions) {
			ref = st
		}
	}
	if ref != nil {
		in.stepBytes = ref.BytesPerSession
		in.stepCPU = ref.CPUSecondsPerSessionSecond
		in.stepDeliveries = ref.DeliveriesPerSecond / float64(ref.Sessions)
	} else {
		b.warn("no session step completed: the plan has no per-session costs")
	}
	b.rep.Plan = makePlan(in)
}
