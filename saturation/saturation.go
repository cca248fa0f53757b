// Package saturation tells when imcanary's own numbers cannot be trusted.
//
// A prober that is short of CPU, stalls in the Go scheduler or the garbage
// collector, or runs out of file descriptors or ephemeral ports adds its own
// delay and loss to what it blames on the server. The Monitor measures each
// of these from the runtime and /proc, judges each over a sliding window,
// and exports whether the prober is saturated and why, so that SLO alerts
// can be inhibited and soak verdicts made inconclusive.
package saturation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
)

var _ engine.Health = (*Monitor)(nil)

// The messages of the lines that say the prober is saturated and list its
// causes with their figures. imcanary bench picks them out of its probers'
// logs.
const (
	LogSaturated     = "prober saturated: its latency and loss numbers may be its own"
	LogCausesChanged = "prober saturation causes changed"
)

const (
	// maxSteps bounds the ring: the monitor keeps a snapshot, with two
	// runtime histograms, per step. The configuration's own limit is the
	// same.
	maxSteps = 600

	// minLagSamples is the fewest lag samples a window needs before its
	// p99 is judged: with fewer, one slow send among a handful would
	// declare the whole prober saturated.
	minLagSamples = 20

	// portEvery is how many Checks apart the ephemeral ports are counted
	// at the most often: it reads every TCP socket of the network
	// namespace, which is costly on a host with hundreds of thousands of
	// them, and port use moves slowly. portCost spaces the counts further
	// where one takes long: see Check.
	portEvery = 10
	portCost  = 100

	// maxPortAddrs bounds the address label of the port-usage gauge. The
	// population dials from a few addresses; more means something else on
	// the host is busy, and its addresses still count towards the cause.
	maxPortAddrs = 64

	schedLatencies = "/sched/latencies:seconds"
	gcPauses       = "/sched/pauses/total/gc:seconds"
)

// Config is the monitor's configuration: saturation.* of imcanary's own.
// The configuration's rules (limits positive, ratios at most 1, a sensible
// interval) are its to check; New guards only what the monitor cannot run
// without.
//
// MaxSendLag and MaxReceiveLag bound the p99 of the lags recorded through
// SendLag and ReceiveLag over the window: the cause is active when more
// than 1% of at least 20 samples exceed the limit. MaxSchedLatency bounds
// the p99 of the Go scheduler's latency over the window; unlike the lags it
// needs no minimum count, as the runtime records only one scheduling in
// eight, and a prober whose goroutines all spin on a starved CPU schedules
// rarely, yet each wait is long. MaxGCPause bounds the longest
// stop-the-world pause in the window. MaxCPU bounds the process's CPU
// seconds per wall second per core it may use (GOMAXPROCS); MaxFDs open
// files per the soft RLIMIT_NOFILE; MaxPorts, for each local address, the
// TCP sockets holding a port of the ephemeral range per port of the range
// (sockets on a listening port are the server side of a connection and
// hold no ephemeral port). Levels (open files, ports) are judged as
// sampled.
type Config = config.Saturation

// validate guards the monitor's own invariants: its ring holds one slot per
// interval of the window.
func validate(c Config) error {
	if c.Interval <= 0 || c.Window < c.Interval || c.Window%c.Interval != 0 || c.Window/c.Interval > maxSteps {
		return fmt.Errorf("saturation.New: Window %v, want 1 to %d whole intervals of %v", c.Window, maxSteps, c.Interval)
	}
	return nil
}

// cacheLine pads the hot-path atomics apart: every sender and receiver
// goroutine writes the lag counters and reads the saturated flag, and
// sharing a cache line would make each write stall the other paths' reads.
type cacheLine [64]byte

// lagCounter counts one kind of lag since the process started. Counts are
// cumulative so that the hot path never resets anything: Check takes
// differences between snapshots.
type lagCounter struct {
	total, over atomic.Uint64
	limit       time.Duration
	obs         prometheus.Observer
}

func (c *lagCounter) record(d time.Duration) {
	c.obs.Observe(d.Seconds())
	// total before over, and load reads them in the other order, so that
	// a snapshot never holds more over than total.
	c.total.Add(1)
	if d > c.limit {
		c.over.Add(1)
	}
}

func (c *lagCounter) load() lagCount {
	over := c.over.Load()
	return lagCount{total: c.total.Load(), over: over}
}

type lagCount struct{ total, over uint64 }

// snapshot is what one Check read of the cumulative sources.
type snapshot struct {
	at         time.Time
	send, recv lagCount
	cpu        float64 // process CPU seconds
	cpuOK      bool
	sched, gc  []uint64 // cumulative bucket counts; nil if unavailable
}

// hist is a runtime/metrics histogram the monitor follows.
type hist struct {
	ok      bool
	buckets []float64 // constant for the life of the process
}

// Monitor measures the prober's own health and says when it is saturated.
// SendLag, ReceiveLag and Saturated are safe for any number of goroutines
// and neither block nor allocate; Check serialises itself.
type Monitor struct {
	send lagCounter
	_    cacheLine
	recv lagCounter
	_    cacheLine
	sat  atomic.Bool
	_    cacheLine

	cfg   Config
	steps int // snapshots in a window
	set   *metrics.ProbeSet
	log   *slog.Logger

	// mu serialises Check and guards everything below. It is never taken
	// on the hot path.
	mu     sync.Mutex
	causes []string  // active, sorted
	since  time.Time // start of the current saturated period

	ring    []snapshot // steps+1 snapshots, the newest at (taken-1) % len
	taken   uint64     // snapshots taken
	samples []rtmetrics.Sample
	sched   hist
	gc      hist
	delta   []uint64 // scratch for a window's bucket counts

	procRoot string
	proc     *procfs.Proc // nil if /proc is unreadable
	procErr  error

	ports     portReading // the last port sample, kept between samples
	portsNext time.Time   // when ports are next counted
	// clock times the port count; tests replace it.
	clock      func() time.Time
	portGauges map[netip.Addr]prometheus.Gauge

	warned map[string]bool // warnOnce keys already logged
}

// New returns a Monitor that exports to set and logs to log. It rejects a
// Config with a missing or out-of-range field, naming every such field.
func New(cfg Config, set *metrics.ProbeSet, log *slog.Logger) (*Monitor, error) {
	return newMonitor(cfg, set, log, "/proc")
}

// newMonitor reads /proc under procRoot: tests point it elsewhere to see a
// missing /proc handled.
func newMonitor(cfg Config, set *metrics.ProbeSet, log *slog.Logger, procRoot string) (*Monitor, error) {
	if err := validate(cfg); err != nil {
		return nil, err
	}
	if set == nil {
		return nil, errors.New("saturation: no metrics set")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{
		send:       lagCounter{limit: cfg.MaxSendLag, obs: set.SendLag},
		recv:       lagCounter{limit: cfg.MaxReceiveLag, obs: set.ReceiveLag},
		cfg:        cfg,
		steps:      int(cfg.Window / cfg.Interval),
		set:        set,
		log:        log,
		procRoot:   procRoot,
		clock:      time.Now,
		portGauges: map[netip.Addr]prometheus.Gauge{},
		warned:     map[string]bool{},
	}
	m.ring = make([]snapshot, m.steps+1)

	m.sched = m.follow(schedLatencies)
	m.gc = m.follow(gcPauses)
	m.samples = []rtmetrics.Sample{{Name: schedLatencies}, {Name: gcPauses}}
	// Every snapshot owns its bucket counts, allocated here once, so that
	// Check allocates nothing for the runtime histograms.
	for i := range m.ring {
		if m.sched.ok {
			m.ring[i].sched = make([]uint64, len(m.sched.buckets)-1)
		}
		if m.gc.ok {
			m.ring[i].gc = make([]uint64, len(m.gc.buckets)-1)
		}
	}
	m.delta = make([]uint64, max(len(m.sched.buckets), len(m.gc.buckets)))

	fs, err := procfs.NewFS(procRoot)
	if err == nil {
		var p procfs.Proc
		if p, err = fs.Proc(os.Getpid()); err == nil {
			m.proc = &p
		}
	}
	m.procErr = err

	for _, c := range metrics.Causes {
		set.Cause[c].Set(0)
	}
	set.Saturated.Set(0)
	return m, nil
}

// follow looks up a runtime histogram. One this Go does not have leaves its
// cause off, with a warning, rather than failing the daemon.
func (m *Monitor) follow(name string) hist {
	for _, d := range rtmetrics.All() {
		if d.Name == name && d.Kind == rtmetrics.KindFloat64Histogram {
			s := []rtmetrics.Sample{{Name: name}}
			rtmetrics.Read(s)
			b := s[0].Value.Float64Histogram().Buckets
			return hist{ok: len(b) >= 2, buckets: b}
		}
	}
	m.unavailable(name, errors.New("not a runtime/metrics histogram of this Go"))
	return hist{}
}

// SendLag records how late a message was written against its intended
// send time.
func (m *Monitor) SendLag(d time.Duration) { m.send.record(d) }

// ReceiveLag records the time from a frame's read off the socket to the
// ledger's record of it.
func (m *Monitor) ReceiveLag(d time.Duration) { m.recv.record(d) }

// Saturated reports whether the last Check found any cause active.
func (m *Monitor) Saturated() bool { return m.sat.Load() }

// Causes returns the active causes, sorted: values of metrics.Causes.
func (m *Monitor) Causes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.causes)
}

// Since returns when the current saturated period began, or the zero time
// if the prober is not saturated.
func (m *Monitor) Since() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.since
}

// Run checks every Interval until ctx is done. It is the monitor's only
// goroutine and returns when ctx is done.
func (m *Monitor) Run(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	m.Check(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Not the tick's time: a late tick would pair a wall time with
			// CPU time read later, and overstate the CPU use.
			m.Check(time.Now())
		}
	}
}

// readings are the values one Check judged. A reading that is not known
// (source unavailable, too few samples) never makes its cause active.
type readings struct {
	send, recv lagReading
	sched, gc  histReading
	cpu        cpuReading
	fds        fdReading
	ports      portReading
}

type lagReading struct {
	known       bool
	total, over uint64
}

// histReading is the bucket [lo, hi) that holds the judged quantile.
type histReading struct {
	known  bool
	n      uint64
	lo, hi float64 // seconds
}

type cpuReading struct {
	known      bool
	ratio      float64
	gomaxprocs int
}

type fdReading struct {
	known       bool
	open, limit uint64
}

type portReading struct {
	known bool
	// addr and remote are the fullest destination over MaxPorts that the
	// prober has a connection to (none: zero); used counts every
	// program's sockets toward it, own the prober's.
	addr      netip.Addr
	remote    netip.AddrPort
	used, own int
	size      int // ports in the ephemeral range
}

func (r portReading) ratio() float64 { return float64(r.used) / float64(r.size) }

// Check takes one sample and judges every cause. Run calls it every
// Interval; each call closes one step of the window, so a window is the
// last Window/Interval calls. The first call only takes the baseline of
// the windowed causes.
func (m *Monitor) Check(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()

	cur := m.take(now)
	var r readings
	if m.taken > 1 {
		back := min(m.taken-1, uint64(m.steps))
		old := &m.ring[(m.taken-1-back)%uint64(len(m.ring))]
		r.send = judgeLag(cur.send, old.send)
		r.recv = judgeLag(cur.recv, old.recv)
		if m.sched.ok {
			r.sched = m.quantile(m.sched, cur.sched, old.sched, 99)
		}
		if m.gc.ok {
			r.gc = m.quantile(m.gc, cur.gc, old.gc, 100)
		}
		if cur.cpuOK && old.cpuOK {
			if wall := cur.at.Sub(old.at).Seconds(); wall > 0 {
				procs := runtime.GOMAXPROCS(0)
				r.cpu = cpuReading{known: true, ratio: (cur.cpu - old.cpu) / wall / float64(procs), gomaxprocs: procs}
				m.set.CPU.Set(r.cpu.ratio)
			}
		}
	}
	r.fds = m.readFDs()
	if (m.taken-1)%portEvery == 0 && !now.Before(m.portsNext) {
		t0 := m.clock()
		m.ports = m.samplePorts()
		// Counting reads every TCP socket of the namespace, about 1.5 µs
		// each: 0.4 s at the 240,000 of six shards on one host. The
		// next count waits portEvery Checks, and portCost times as long
		// as this one took, so that it costs at most 1/portCost of a
		// core.
		m.portsNext = now.Add(portCost * m.clock().Sub(t0))
	}
	r.ports = m.ports

	m.publish(now, &r)
}

// take reads the cumulative sources into the ring's next slot.
func (m *Monitor) take(now time.Time) *snapshot {
	s := &m.ring[m.taken%uint64(len(m.ring))]
	m.taken++
	s.at = now
	s.send = m.send.load()
	s.recv = m.recv.load()
	if m.sched.ok || m.gc.ok {
		rtmetrics.Read(m.samples)
		if m.sched.ok {
			copy(s.sched, m.samples[0].Value.Float64Histogram().Counts)
		}
		if m.gc.ok {
			copy(s.gc, m.samples[1].Value.Float64Histogram().Counts)
		}
	}
	s.cpuOK = false
	if m.proc == nil {
		m.unavailable("cpu", m.procErr)
		return s
	}
	st, err := m.proc.Stat()
	if err != nil {
		m.unavailable("cpu", err)
		return s
	}
	s.cpu, s.cpuOK = st.CPUTime(), true
	return s
}

func judgeLag(cur, old lagCount) lagReading {
	r := lagReading{total: cur.total - old.total, over: cur.over - old.over}
	// A sample in flight during the old snapshot can count as over in the
	// window and in total before it.
	r.over = min(r.over, r.total)
	r.known = r.total >= minLagSamples
	return r
}

// quantile finds the bucket holding the pct-th percentile of the samples
// between two cumulative snapshots: the sample of rank ceil(pct·n/100), so
// 100 is the largest. Integer arithmetic: 0.99·100 is not 99 in floating
// point, and ceil would make the p99 of 100 samples their maximum.
func (m *Monitor) quantile(h hist, cur, old []uint64, pct uint64) histReading {
	d := m.delta[:len(cur)]
	var n uint64
	for i := range cur {
		d[i] = cur[i] - old[i]
		n += d[i]
	}
	if n == 0 {
		return histReading{}
	}
	rank := (pct*n + 99) / 100
	var cum uint64
	for i, c := range d {
		cum += c
		if cum >= rank {
			return histReading{known: true, n: n, lo: h.buckets[i], hi: h.buckets[i+1]}
		}
	}
	return histReading{}
}

// readFDs reads the open descriptors and their soft limit. The count is a
// stat of /proc/self/fd on Linux 6.2 and later, a directory read before.
func (m *Monitor) readFDs() fdReading {
	if m.proc == nil {
		m.unavailable("fds", m.procErr)
		return fdReading{}
	}
	n, err := m.proc.FileDescriptorsLen()
	if err != nil {
		m.unavailable("fds", err)
		return fdReading{}
	}
	// Read every time: the limit can be raised at run time (prlimit).
	l, err := m.proc.Limits()
	if err != nil {
		m.unavailable("fds", err)
		return fdReading{}
	}
	if l.OpenFiles == 0 {
		m.unavailable("fds", errors.New("open files limit is 0"))
		return fdReading{}
	}
	return fdReading{known: true, open: uint64(n), limit: l.OpenFiles}
}

// active judges the readings against the limits.
func (m *Monitor) active(r *readings) map[string]bool {
	c := m.cfg
	lag := func(l lagReading) bool { return l.known && l.over*100 > l.total }
	return map[string]bool{
		metrics.CauseSendLag:    lag(r.send),
		metrics.CauseReceiveLag: lag(r.recv),
		// A bucket's lower bound is the least its samples can be: the
		// cause is raised only when the quantile is surely over the limit,
		// at the cost of missing one that overshoots within its bucket
		// (runtime buckets are about a quarter of their value wide).
		metrics.CauseSchedLatency: r.sched.known && r.sched.lo >= c.MaxSchedLatency.Seconds(),
		metrics.CauseGCPause:      r.gc.known && r.gc.lo >= c.MaxGCPause.Seconds(),
		metrics.CauseCPU:          r.cpu.known && r.cpu.ratio > c.MaxCPU,
		metrics.CauseFDs:          r.fds.known && float64(r.fds.open)/float64(r.fds.limit) > c.MaxFDs,
		metrics.CausePorts:        r.ports.known && r.ports.own > 0 && r.ports.ratio() > c.MaxPorts,
	}
}

// publish exports the verdict and logs its transitions.
func (m *Monitor) publish(now time.Time, r *readings) {
	act := m.active(r)
	var causes []string
	for _, c := range metrics.Causes {
		v := 0.0
		if act[c] {
			v = 1
			causes = append(causes, c)
		}
		m.set.Cause[c].Set(v)
	}
	slices.Sort(causes)
	was := len(m.causes) > 0
	is := len(causes) > 0
	if is {
		m.set.Saturated.Set(1)
	} else {
		m.set.Saturated.Set(0)
	}
	m.sat.Store(is)

	switch {
	case is && !was:
		m.since = now
		m.log.Warn(LogSaturated,
			append([]any{"causes", causes}, m.details(r, causes)...)...)
	case is && was && !slices.Equal(causes, m.causes):
		m.log.Info(LogCausesChanged,
			append([]any{"causes", causes, "since", m.since}, m.details(r, causes)...)...)
	case !is && was:
		m.log.Info("prober no longer saturated", "lasted", now.Sub(m.since), "causes", m.causes)
		m.since = time.Time{}
	}
	m.causes = causes
}

// details describes each active cause's measured values and limits.
func (m *Monitor) details(r *readings, causes []string) []any {
	c := m.cfg
	lag := func(name string, l lagReading, limit time.Duration) slog.Attr {
		return slog.Group(name, "over_limit", l.over, "samples", l.total, "limit", limit)
	}
	out := make([]any, 0, len(causes))
	for _, cause := range causes {
		switch cause {
		case metrics.CauseSendLag:
			out = append(out, lag(cause, r.send, c.MaxSendLag))
		case metrics.CauseReceiveLag:
			out = append(out, lag(cause, r.recv, c.MaxReceiveLag))
		case metrics.CauseSchedLatency:
			out = append(out, slog.Group(cause, "p99_at_least", seconds(r.sched.lo), "p99_below", seconds(r.sched.hi),
				"samples", r.sched.n, "limit", c.MaxSchedLatency))
		case metrics.CauseGCPause:
			out = append(out, slog.Group(cause, "max_at_least", seconds(r.gc.lo), "max_below", seconds(r.gc.hi),
				"pauses", r.gc.n, "limit", c.MaxGCPause))
		case metrics.CauseCPU:
			out = append(out, slog.Group(cause, "ratio", r.cpu.ratio, "gomaxprocs", r.cpu.gomaxprocs, "limit", c.MaxCPU))
		case metrics.CauseFDs:
			out = append(out, slog.Group(cause, "open", r.fds.open, "soft_limit", r.fds.limit,
				"ratio", float64(r.fds.open)/float64(r.fds.limit), "limit", c.MaxFDs))
		case metrics.CausePorts:
			out = append(out, slog.Group(cause, "address", r.ports.addr.String(), "destination", r.ports.remote.String(),
				"used", r.ports.used, "own", r.ports.own, "range", r.ports.size, "ratio", r.ports.ratio(), "limit", c.MaxPorts))
		}
	}
	return out
}

// seconds turns a bucket bound into a duration, or a string for the
// unbounded ends.
func seconds(s float64) any {
	if math.IsInf(s, 0) {
		return fmt.Sprint(s)
	}
	return time.Duration(s * float64(time.Second))
}

// unavailable logs, once per source, that a cause cannot be judged. The
// cause stays inactive: a read error is no evidence of saturation.
func (m *Monitor) unavailable(source string, err error) {
	m.warnOnce(source, "prober saturation source unavailable; its cause is not judged", "source", source, "err", err)
}

// warnOnce logs at Warn the first time key is seen: a condition that lasts
// would otherwise repeat every Check.
func (m *Monitor) warnOnce(key, msg string, args ...any) {
	if m.warned[key] {
		return
	}
	m.warned[key] = true
	m.log.Warn(msg, args...)
}
