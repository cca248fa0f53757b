package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// startTargets starts n reference servers, or returns the given target's
// URL n times.
func (b *bench) startTargets(ctx context.Context, n int) ([]string, []*child, error) {
	urls := make([]string, n)
	if !b.ownServers {
		for i := range urls {
			urls[i] = b.o.TargetURL
		}
		return urls, nil, nil
	}
	var kids []*child
	for i := range n {
		c, url, err := b.startTarget(ctx, i)
		if err != nil {
			killAll(kids)
			return nil, nil, err
		}
		kids = append(kids, c)
		urls[i] = url
	}
	return urls, kids, nil
}

// startTarget starts one reference server and returns its URL. The port is
// chosen by the bench (see freePort), so another process may take it
// first: that is retried.
func (b *bench) startTarget(ctx context.Context, i int) (*child, string, error) {
	lo := b.rep.Machine.EphemeralPorts[0]
	if lo == 0 {
		lo = 32768
	}
	var last error
	for range 3 {
		port, err := freePort(lo)
		if err != nil {
			return nil, "", err
		}
		args := []string{"refserver", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--secret-file", b.secret, "--log.level", "warn"}
		c, err := startChild(fmt.Sprintf("target %d", i), b.o.Exe, args, b.env)
		if err != nil {
			return nil, "", err
		}
		// The target prints its URL once it listens.
		line, err := c.line(ctx, 20*time.Second)
		if url, ok := strings.CutPrefix(line, "imcanary refserver: "); err == nil && ok {
			return c, strings.TrimSpace(url), nil
		}
		c.kill()
		if err == nil {
			err = fmt.Errorf("target %d: unexpected output %q", i, line)
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		last = err
	}
	return nil, "", last
}

// prober is one `imcanary run` worker.
type prober struct {
	*child
	idx     int
	addr    string // its HTTP listener, for /metrics
	users   int
	started time.Time
}

// proberSpec is what a prober runs.
type proberSpec struct {
	idx    int // its place among the probers of a step: its prefix and source address
	url    string
	users  int
	rate   float64
	prefix string
	// flood marks the throughput prober: no secret, no pacing.
	flood bool
}

// startProber starts a prober and waits until it serves /metrics.
func (b *bench) startProber(ctx context.Context, s proberSpec) (*prober, error) {
	c := b.o.Config.Population
	port, err := anyPort()
	if err != nil {
		return nil, err
	}
	b.seq++
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"run",
		"--target.url", s.url,
		"--http.listen", addr,
		"--data_dir", filepath.Join(b.o.Dir, "prober-"+strconv.Itoa(b.seq)),
		"--population.users", strconv.Itoa(s.users),
		"--population.rate", ftoa(s.rate),
		"--population.group_size", strconv.Itoa(c.GroupSize),
		"--population.heartbeat", c.Heartbeat.String(),
		"--population.deadline", c.Deadline.String(),
		"--population.lost_after", c.LostAfter.String(),
		"--population.message_size", strconv.Itoa(c.MessageSize),
		"--population.prefix", s.prefix,
		// No canary: its users would be sessions the step did not ask
		// for, and its rounds traffic the step did not plan.
		"--canary.schedule=",
		"--log.level", "warn",
	}
	args = append(args, b.saturationArgs()...)
	if b.rep.Setup.Reactor {
		args = append(args, "--population.reactor=true")
	}
	if !s.flood && b.secret != "" {
		args = append(args, "--target.secret_file", b.secret)
	}
	switch {
	case s.flood:
		args = append(args, "--population.ramp", "0s")
	case b.connectRateKey:
		args = append(args, "--population.ramp", "0s", "--population.max_connect_rate", ftoa(b.o.ConnectRate))
	default:
		ramp := time.Duration(float64(s.users) / b.o.ConnectRate * float64(time.Second))
		args = append(args, "--population.ramp", ramp.String())
	}
	if b.rep.Setup.SourceAddrs && !s.flood {
		// Each prober on a loopback address of its own: its saturation
		// monitor then counts its own ephemeral ports, not every
		// prober's together.
		args = append(args, "--population.source_addrs", fmt.Sprintf("127.0.0.%d", 2+s.idx))
	}
	ch, err := startChild(fmt.Sprintf("prober %d", s.idx), b.o.Exe, args, b.env)
	if err != nil {
		return nil, err
	}
	p := &prober{child: ch, idx: s.idx, addr: addr, users: s.users, started: time.Now()}
	// It prints its metrics address once everything is set up; the HTTP
	// server follows at once.
	if _, err := ch.line(ctx, 30*time.Second); err != nil {
		ch.kill()
		return nil, err
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		_, err := fetchMetrics(ctx, addr)
		if err == nil {
			return p, nil
		}
		if aerr := ch.alive(); aerr != nil {
			return nil, aerr
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			ch.kill()
			return nil, fmt.Errorf("prober %d: /metrics: %w", s.idx, err)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			ch.kill()
			return nil, err
		}
	}
}

// notOnline is a prober that could not bring its sessions online: the
// machine (or the target) holds no more.
type notOnline struct {
	prober, online, users int
	after                 time.Duration
	why                   error
}

func (e *notOnline) Error() string {
	s := fmt.Sprintf("prober %d: %s of %s sessions online after %v", e.prober, count(float64(e.online)), count(float64(e.users)), e.after.Round(time.Second))
	if e.why != nil {
		s += ": " + e.why.Error()
	}
	return s
}

// ramp watches a prober log its users in and returns its logins per
// second, from its first login to its last, and how long that took.
// Polling every 50 ms, a ramp of a few seconds is timed to a few percent.
func (b *bench) ramp(ctx context.Context, p *prober, onlineBefore int) (rate, took float64, err error) {
	timeout := time.Duration(float64(p.users)/b.o.ConnectRate*3*float64(time.Second)) + 60*time.Second
	var tFirst time.Time
	var cFirst float64
	var prevT time.Time
	var prevOnline float64
	for {
		s, err := fetchMetrics(ctx, p.addr)
		now := time.Now()
		if err != nil {
			if aerr := p.alive(); aerr != nil {
				return 0, 0, aerr
			}
			if ctx.Err() != nil {
				return 0, 0, ctx.Err()
			}
		} else {
			online := s.sum(mOnline)
			connects := s.sum(mConnects, "result", "success")
			if tFirst.IsZero() && connects > 0 {
				tFirst, cFirst = now, connects
			}
			if int(online) >= p.users {
				switch d := now.Sub(tFirst).Seconds(); {
				case d > 0:
					return (float64(p.users) - cFirst) / d, d, nil
				default:
					// Everyone came between two polls: time it from
					// the process start, an underestimate.
					d = now.Sub(p.started).Seconds()
					return float64(p.users) / d, d, nil
				}
			}
			cur := 0.0
			if !prevT.IsZero() {
				cur = (online - prevOnline) / now.Sub(prevT).Seconds()
			}
			prevT, prevOnline = now, online
			b.cur.Online, b.cur.LoginsPerSecond = onlineBefore+int(online), max(0, cur)
			b.progress(b.cur)
			if now.Sub(p.started) > timeout {
				return 0, 0, &notOnline{prober: p.idx, online: int(online), users: p.users, after: now.Sub(p.started)}
			}
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
}

// reading is one prober's state at one moment.
type reading struct {
	scr  scrape
	proc procSample
	at   time.Time
}

// procCPU returns a process's CPU seconds, or 0 if it cannot be read.
func procCPU(pid int) float64 {
	s, err := readProc(pid)
	if err != nil {
		return 0
	}
	return s.cpu
}

// childrenCPU sums the CPU seconds of workers.
func childrenCPU(kids []*child) float64 {
	var sum float64
	for _, c := range kids {
		sum += procCPU(c.pid)
	}
	return sum
}

func read(ctx context.Context, p *prober) (reading, error) {
	s, err := fetchMetrics(ctx, p.addr)
	if err != nil {
		if aerr := p.alive(); aerr != nil {
			return reading{}, aerr
		}
		return reading{}, fmt.Errorf("prober %d: %w", p.idx, err)
	}
	ps, err := readProc(p.pid)
	if err != nil {
		return reading{}, fmt.Errorf("prober %d: %w", p.idx, err)
	}
	return reading{scr: s, proc: ps, at: time.Now()}, nil
}

// measure reads the probers over one window and fills in st's figures.
// During the window it scrapes every poll interval for sessions online
// and the saturation detector; a cause active at any scrape counts.
func (b *bench) measure(ctx context.Context, ps []*prober, targets []*child, st *Step) error {
	r0, err := readAll(ctx, ps)
	if err != nil {
		return err
	}
	m0, self0, t0 := readMachineCPU(), procCPU(os.Getpid()), childrenCPU(targets)
	start := time.Now()
	w := &watch{b: b, minOnline: math.MaxInt, causes: map[string]bool{}, prevAt: start}
	for i := range r0 {
		w.prevDeliv += r0[i].scr.sum(mDeliveries)
	}
	if err := b.watchWindow(ctx, ps, start, w); err != nil {
		return err
	}
	r1, err := readAll(ctx, ps)
	if err != nil {
		return err
	}
	m1, self1, t1 := readMachineCPU(), procCPU(os.Getpid()), childrenCPU(targets)
	elapsed := time.Since(start).Seconds()
	scr := make([]scrape, len(ps))
	for i := range r1 {
		scr[i] = r1[i].scr
	}
	w.observe(scr)

	b.fill(st, ps, targets, r0, r1)
	st.Online = w.minOnline
	st.MachineCores = m1.cores(m0)
	st.TargetCores = finite((t1 - t0) / elapsed)
	st.OtherCores = max(0, st.MachineCores-st.CPUCores-st.TargetCores-finite((self1-self0)/elapsed))
	st.Load1 = load1()
	b.judge(st, w.causes)
	if st.Saturated || len(st.Discounted) > 0 {
		for _, p := range ps {
			if l := p.tail.lastSaturated(); l != "" {
				st.Fired = append(st.Fired, p.name+": "+l)
			}
		}
	}
	return nil
}

// readAll reads every prober, or fails with the first that cannot be read.
func readAll(ctx context.Context, ps []*prober) ([]reading, error) {
	rs := make([]reading, len(ps))
	for i, p := range ps {
		var err error
		if rs[i], err = read(ctx, p); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// watch is what a window's scrapes have seen so far: the fewest sessions
// online, every saturation cause, and the deliveries at the last scrape,
// for the progress line's rate.
type watch struct {
	b         *bench
	minOnline int
	causes    map[string]bool
	prevDeliv float64
	prevAt    time.Time
}

func (w *watch) observe(scr []scrape) {
	online, deliv := 0, 0.0
	for _, s := range scr {
		online += int(s.sum(mOnline))
		deliv += s.sum(mDeliveries)
		if s.sum(mSaturated) == 1 {
			for _, c := range s.causes() {
				w.causes[c] = true
			}
		}
	}
	w.minOnline = min(w.minOnline, online)
	now := time.Now()
	w.b.cur.Online = online
	w.b.cur.DeliveriesPerSecond = (deliv - w.prevDeliv) / now.Sub(w.prevAt).Seconds()
	w.prevDeliv, w.prevAt = deliv, now
	w.b.progress(w.b.cur)
}

// watchWindow scrapes every prober each poll interval until the window
// since start is over, telling w.
func (b *bench) watchWindow(ctx context.Context, ps []*prober, start time.Time, w *watch) error {
	for time.Since(start) < b.t.window-b.t.poll/2 {
		if err := sleep(ctx, min(b.t.poll, b.t.window-time.Since(start))); err != nil {
			return err
		}
		if time.Since(start) >= b.t.window-b.t.poll/2 {
			break
		}
		scr := make([]scrape, len(ps))
		for i, p := range ps {
			s, err := fetchMetrics(ctx, p.addr)
			if err != nil {
				if aerr := p.alive(); aerr != nil {
					return aerr
				}
				return err
			}
			scr[i] = s
		}
		w.observe(scr)
	}
	if d := b.t.window - time.Since(start); d > 0 {
		return sleep(ctx, d)
	}
	return nil
}

// fill sets st's figures of the probers themselves from their readings
// at the start (r0) and the end (r1) of the window: deliveries, losses,
// CPU, memory per session, GC, and the send and receive lags.
func (b *bench) fill(st *Step, ps []*prober, targets []*child, r0, r1 []reading) {
	var deliv, lost, reconnects, cpu, wall, rss, heap, gcs, gcCPU float64
	gcExported := true
	var recv, send hist
	for i, p := range ps {
		a, z := r0[i], r1[i]
		deliv += z.scr.sum(mDeliveries) - a.scr.sum(mDeliveries)
		lost += z.scr.sum(mLost) - a.scr.sum(mLost)
		reconnects += z.scr.sum(mConnects, "result", "success") - a.scr.sum(mConnects, "result", "success")
		cpu += z.proc.cpu - a.proc.cpu
		wall += z.at.Sub(a.at).Seconds()
		rss += float64(z.proc.rss)
		heap += z.scr.sum(mHeapInuse) + z.scr.sum(mStackInuse)
		gcs += z.scr.sum(mGCDuration) - a.scr.sum(mGCDuration)
		gcCPU += z.scr.sum(mGCCPU) - a.scr.sum(mGCCPU)
		gcExported = gcExported && z.scr.has(mGCCPU)
		recv = recv.add(z.scr.histogram(mReceiveLag).sub(a.scr.histogram(mReceiveLag)))
		send = send.add(z.scr.histogram(mSendLag).sub(a.scr.histogram(mSendLag)))
		if n, err := countFDs(p.pid); err == nil {
			st.OpenFiles = max(st.OpenFiles, n)
		}
		st.Goroutines = max(st.Goroutines, int(z.scr.sum(mGoroutines)))
	}
	n := float64(len(ps))
	wall /= n // each prober's window; they overlap
	st.DeliveriesPerSecond = finite(deliv / wall)
	st.DeliveriesPerCoreSecond = finite(deliv / cpu)
	st.Lost, st.Reconnects = lost, reconnects
	st.CPUCores = finite(cpu / wall)
	st.CPUSecondsPerSessionSecond = finite(st.CPUCores / float64(st.Sessions))
	st.GCPerMinute = finite(gcs / n / (wall / 60))
	st.GCShare = -1
	if gcExported && cpu > 0 {
		st.GCShare = min(1, finite(gcCPU/cpu))
		st.GCBusy = st.GCShare > GCShareLimit
	}
	st.RSSBytes = int64(rss / n)
	per := float64(st.SessionsPerProcess)
	st.BytesPerSession = finite((rss/n - float64(b.baseRSS)) / per)
	if heap > 0 && b.baseHeap > 0 {
		st.HeapBytesPerSession = finite((heap/n - float64(b.baseHeap)) / per)
	}
	if len(targets) > 0 && b.baseTargetRSS > 0 {
		var trss float64
		for _, t := range targets {
			if s, err := readProc(t.pid); err == nil {
				trss += float64(s.rss)
			}
		}
		st.TargetBytesPerSession = finite((trss/float64(len(targets)) - float64(b.baseTargetRSS)) / per)
	}
	st.ReceiveLagP99Seconds = finite(recv.quantile(0.99))
	st.ReceiveLagOver2ms = finite(recv.over(noiseLimitSec))
	st.SendLagP99Seconds = finite(send.quantile(0.99))
}

// judge sets a step's saturation from the causes seen in its window.
//
// One cause is discounted when the bench's own setup produces it: several
// probers against targets of their own, all dialling from 127.0.0.1. The
// saturation monitor counts every socket on an ephemeral port of a local
// address, whatever its destination, so each prober sees every prober's
// connections as its own port use; but the kernel shares a local port
// between connections to different destinations, and each prober here
// dials only its own target. When each prober's own connections stay
// under max_ports of the range, "ports" is that artefact, not a limit.
func (b *bench) judge(st *Step, causes map[string]bool) {
	st.Causes, st.Discounted = []string{}, []string{}
	r := b.rep.Machine.EphemeralPorts
	size := r[1] - r[0] + 1
	for c := range causes {
		if c == "ports" && st.Processes > 1 && !b.rep.Setup.SourceAddrs && r[0] > 0 &&
			float64(st.SessionsPerProcess) <= b.o.Config.Saturation.MaxPorts*float64(size) {
			st.Discounted = append(st.Discounted, c)
			continue
		}
		st.Causes = append(st.Causes, c)
	}
	slices.Sort(st.Causes)
	slices.Sort(st.Discounted)
	st.Saturated = len(st.Causes) > 0
}

// runStep runs processes probers of users sessions each at rate, against
// their own targets, measures them and stops them all. Prober i names its
// users prefix-pI-…: against one given target, the probers of a step must
// not log in as each other, nor a step as the self-noise step's users,
// whose offline queues may still hold deliveries.
func (b *bench) runStep(ctx context.Context, prefix string, users, processes int, rate float64, st *Step) error {
	*st = Step{SessionsPerProcess: users, Processes: processes, Sessions: users * processes, Rate: rate}
	urls, targets, err := b.startTargets(ctx, processes)
	if err != nil {
		return err
	}
	var probers []*prober
	defer func() {
		kids := make([]*child, len(probers))
		for i, p := range probers {
			kids[i] = p.child
		}
		killAll(targets, kids)
	}()
	b.cur.Sessions, b.cur.Online = st.Sessions, 0
	var rates []float64
	var loginCPU, targetLoginCPU float64
	for i := range processes {
		b.cur.Note = fmt.Sprintf("ramping prober %d/%d", i+1, processes)
		b.progress(b.cur)
		p, err := b.startProber(ctx, proberSpec{idx: i, url: urls[i], users: users, rate: rate, prefix: prefix + "-p" + strconv.Itoa(i)})
		if err != nil {
			return err
		}
		probers = append(probers, p)
		var tgt []*child
		if i < len(targets) {
			tgt = targets[i : i+1]
		}
		c0, tc0 := procCPU(p.pid), childrenCPU(tgt)
		r, took, err := b.ramp(ctx, p, i*users)
		if err != nil {
			var no *notOnline
			if errors.As(err, &no) {
				st.Online = i*users + no.online
			}
			return err
		}
		rates = append(rates, r)
		st.RampSeconds = max(st.RampSeconds, took)
		b.cur.Online = (i + 1) * users
		loginCPU += procCPU(p.pid) - c0
		targetLoginCPU += childrenCPU(tgt) - tc0
	}
	st.LoginsPerSecond = median(rates)
	st.LoginCPUSeconds = finite(loginCPU / float64(st.Sessions))
	if len(targets) > 0 {
		st.TargetLoginCPUSeconds = finite(targetLoginCPU / float64(st.Sessions))
	}
	// Settle: past the detector's window, so that the ramp's own burst
	// is not judged in the step's, and past one send interval, so that
	// every user is sending.
	settle := max(b.t.settle, b.o.Config.Saturation.Window)
	if b.o.Quick {
		settle = max(b.t.settle, 2*time.Second)
	}
	if rate > 0 {
		settle = max(settle, time.Duration(float64(time.Second)/rate))
	}
	b.cur.Note = "settling"
	b.cur.LoginsPerSecond = st.LoginsPerSecond
	b.progress(b.cur)
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	b.cur.Note = "measuring"
	return b.measure(ctx, probers, targets, st)
}
