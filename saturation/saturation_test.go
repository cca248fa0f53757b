package saturation

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/procfs"

	"github.com/imcanary/imcanary/metrics"
)

// healthy is a configuration no idle test process should trip, even under
// -race on a shared two-core machine running other test packages.
func healthy() Config {
	return Config{
		Interval:        100 * time.Millisecond,
		Window:          500 * time.Millisecond,
		MaxSendLag:      100 * time.Millisecond,
		MaxReceiveLag:   100 * time.Millisecond,
		MaxSchedLatency: time.Second,
		MaxGCPause:      time.Second,
		MaxCPU:          1,
		MaxFDs:          0.9,
		MaxPorts:        0.9,
	}
}

// logBuf collects a test monitor's log; Run logs from its own goroutine.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newTest(t testing.TB, cfg Config) (*Monitor, *metrics.ProbeSet, *logBuf) {
	t.Helper()
	return newTestAt(t, cfg, "/proc")
}

func newTestAt(t testing.TB, cfg Config, procRoot string) (*Monitor, *metrics.ProbeSet, *logBuf) {
	t.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).Probe("t")
	var lb logBuf
	log := slog.New(slog.NewTextHandler(&lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := newMonitor(cfg, set, log, procRoot)
	if err != nil {
		t.Fatalf("New(%+v) = %v, want no error", cfg, err)
	}
	return m, set, &lb
}

// assertState checks the verdict through every way it is exported.
func assertState(t *testing.T, m *Monitor, set *metrics.ProbeSet, want []string) {
	t.Helper()
	if got := m.Causes(); !slices.Equal(got, want) {
		t.Errorf("Causes() = %q, want %q", got, want)
	}
	if got, w := m.Saturated(), len(want) > 0; got != w {
		t.Errorf("Saturated() = %v, want %v", got, w)
	}
	if got, w := m.Since().IsZero(), len(want) == 0; got != w {
		t.Errorf("Since().IsZero() = %v, want %v", got, w)
	}
	wantSat := 0.0
	if len(want) > 0 {
		wantSat = 1
	}
	if got := testutil.ToFloat64(set.Saturated); got != wantSat {
		t.Errorf("imcanary_probe_saturated = %v, want %v", got, wantSat)
	}
	for _, c := range metrics.Causes {
		w := 0.0
		if slices.Contains(want, c) {
			w = 1
		}
		if got := testutil.ToFloat64(set.Cause[c]); got != w {
			t.Errorf("imcanary_probe_saturation_cause{cause=%q} = %v, want %v", c, got, w)
		}
	}
}

// TestNewValidates: New refuses only what the monitor cannot run with, a
// window that is not a whole number of intervals; the limits are the
// configuration's to check.
func TestNewValidates(t *testing.T) {
	set := metrics.New(prometheus.NewPedanticRegistry()).Probe("t")
	for _, edit := range []func(*Config){
		func(c *Config) { c.Interval = 0 },
		func(c *Config) { c.Window = 50 * time.Millisecond },
		func(c *Config) { c.Window = 250 * time.Millisecond },
		func(c *Config) { c.Window = 601 * c.Interval },
	} {
		cfg := healthy()
		edit(&cfg)
		if _, err := New(cfg, set, nil); err == nil || !strings.Contains(err.Error(), "Window") {
			t.Errorf("New(interval %v, window %v) = %v, want an error naming Window", cfg.Interval, cfg.Window, err)
		}
	}
	if _, err := New(healthy(), set, nil); err != nil {
		t.Errorf("New(%+v) = %v, want no error", healthy(), err)
	}
}

// TestHealthyNeverSaturated is the converse of every fault test below: an
// idle process recording lags well under their limits is never saturated.
// It sleeps in real time rather than under synctest: CPU use and scheduler
// waits are only true against the wall clock.
func TestHealthyNeverSaturated(t *testing.T) {
	m, set, lb := newTest(t, healthy())
	m.Check(time.Now())
	for range 8 {
		for range 200 {
			m.SendLag(time.Millisecond)
			m.ReceiveLag(2 * time.Millisecond)
		}
		time.Sleep(m.cfg.Interval)
		m.Check(time.Now())
		assertState(t, m, set, nil)
	}
	if cpu := testutil.ToFloat64(set.CPU); cpu < 0 || cpu > 1 {
		t.Errorf("imcanary_probe_cpu_usage_ratio = %v, want 0 to 1", cpu)
	}
	if strings.Contains(lb.String(), "level=WARN") {
		t.Errorf("log = %q, want no warning", lb.String())
	}
}

func TestLagThreshold(t *testing.T) {
	const limit = 10 * time.Millisecond
	tests := []struct {
		name       string
		total, bad int
		want       bool
	}{
		{"below minimum samples, all slow", minLagSamples - 1, minLagSamples - 1, false},
		{"minimum samples, all slow", minLagSamples, minLagSamples, true},
		{"1 slow of 3", 3, 1, false},
		{"exactly 1% slow", 1000, 10, false},
		{"just over 1% slow", 1000, 11, true},
		{"none slow", 1000, 0, false},
	}
	kinds := []struct {
		cause  string
		record func(*Monitor, time.Duration)
	}{
		{metrics.CauseSendLag, (*Monitor).SendLag},
		{metrics.CauseReceiveLag, (*Monitor).ReceiveLag},
	}
	for _, k := range kinds {
		for _, tt := range tests {
			t.Run(k.cause+"/"+tt.name, func(t *testing.T) {
				cfg := healthy()
				cfg.MaxSendLag, cfg.MaxReceiveLag = limit, limit
				m, set, _ := newTest(t, cfg)
				// Synthetic times a second apart: the lag causes only count
				// Checks, and long steps keep the CPU ratio far from its limit.
				now := time.Now()
				m.Check(now)
				for i := range tt.total {
					d := limit / 2
					if i < tt.bad {
						d = limit + time.Microsecond
					}
					k.record(m, d)
				}
				m.Check(now.Add(time.Second))
				var want []string
				if tt.want {
					want = []string{k.cause}
				}
				assertState(t, m, set, want)
			})
		}
	}
}

// TestLagSaturatesAndClears follows one slow interval through the window:
// the cause holds while that interval is in the window and clears on the
// first Check after it slid out.
func TestLagSaturatesAndClears(t *testing.T) {
	kinds := []struct {
		cause  string
		record func(*Monitor, time.Duration)
	}{
		{metrics.CauseSendLag, (*Monitor).SendLag},
		{metrics.CauseReceiveLag, (*Monitor).ReceiveLag},
	}
	for _, k := range kinds {
		t.Run(k.cause, func(t *testing.T) {
			cfg := healthy()
			m, set, lb := newTest(t, cfg)
			steps := int(cfg.Window / cfg.Interval)
			start := time.Now()
			at := func(i int) time.Time { return start.Add(time.Duration(i) * time.Second) }
			m.Check(at(0))
			for range 100 {
				k.record(m, 2*cfg.MaxSendLag)
			}
			m.Check(at(1))
			assertState(t, m, set, []string{k.cause})
			if got := m.Since(); !got.Equal(at(1)) {
				t.Errorf("Since() = %v, want %v", got, at(1))
			}
			if log := lb.String(); !strings.Contains(log, "level=WARN msg=\"prober saturated") || !strings.Contains(log, k.cause+".over_limit=100") {
				t.Errorf("log = %q, want a warning naming %s with its measured values", log, k.cause)
			}
			// Healthy traffic from now on; the slow interval is in the
			// window until Check steps+1.
			for i := 2; i <= steps+1; i++ {
				for range 100 {
					k.record(m, time.Millisecond)
				}
				m.Check(at(i))
				var want []string
				if i <= steps {
					want = []string{k.cause}
				}
				assertState(t, m, set, want)
			}
			if log := lb.String(); !strings.Contains(log, "level=INFO msg=\"prober no longer saturated\" lasted="+(time.Duration(steps)*time.Second).String()) {
				t.Errorf("log = %q, want the recovery with how long it lasted", log)
			}
		})
	}
}

// spin starts n goroutines that burn CPU until stop is closed or 3 s have
// passed, whichever is first, and returns the WaitGroup that joins them.
func spin(n int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	for range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%1024 == 0 && time.Now().After(deadline) {
					return
				}
			}
		})
	}
	return &wg
}

// TestCPUFault overloads the process with four spinning goroutines per
// core: goroutines wait for a CPU (sched_latency) and the process uses its
// cores (cpu). Either proves the fault seen; a machine shared with other
// test packages may keep the CPU ratio under its limit, never the
// scheduler's queue. Real time, as in TestHealthyNeverSaturated.
func TestCPUFault(t *testing.T) {
	cfg := healthy()
	cfg.MaxSchedLatency = 5 * time.Millisecond
	cfg.MaxCPU = 0.8
	m, set, lb := newTest(t, cfg)
	m.Check(time.Now())

	stop := make(chan struct{})
	wg := spin(runtime.GOMAXPROCS(0)*4, stop)
	var seen []string
	var cpu float64
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); {
		time.Sleep(cfg.Interval)
		m.Check(time.Now())
		cpu = max(cpu, testutil.ToFloat64(set.CPU))
		if c := m.Causes(); slices.Contains(c, metrics.CauseSchedLatency) || slices.Contains(c, metrics.CauseCPU) {
			seen = c
			break
		}
	}
	close(stop)
	wg.Wait()
	if seen == nil {
		t.Fatalf("Causes() under %d spinning goroutines never had %s or %s; highest CPU ratio %v; log %q",
			runtime.GOMAXPROCS(0)*4, metrics.CauseSchedLatency, metrics.CauseCPU, cpu, lb.String())
	}
	t.Logf("causes under load: %q, CPU ratio up to %.2f", seen, cpu)
	if !m.Saturated() || testutil.ToFloat64(set.Saturated) != 1 {
		t.Errorf("Saturated() = %v, imcanary_probe_saturated = %v, want true and 1", m.Saturated(), testutil.ToFloat64(set.Saturated))
	}
	if cpu <= 0 {
		t.Errorf("imcanary_probe_cpu_usage_ratio = %v under load, want above 0", cpu)
	}

	// Once the spinners are gone the window slides past them.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(cfg.Interval)
		m.Check(time.Now())
		if left = m.Causes(); !slices.Contains(left, metrics.CauseSchedLatency) && !slices.Contains(left, metrics.CauseCPU) {
			break
		}
	}
	if slices.Contains(left, metrics.CauseSchedLatency) || slices.Contains(left, metrics.CauseCPU) {
		t.Errorf("Causes() = %q after the spinners stopped, want neither %s nor %s", left, metrics.CauseSchedLatency, metrics.CauseCPU)
	}
}

// TestGCPause forces a collection between two Checks with automatic GC off,
// so that the window holds exactly that one pause.
func TestGCPause(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	cfg := healthy()
	cfg.MaxGCPause = time.Nanosecond // any real stop-the-world pause is longer
	m, set, lb := newTest(t, cfg)
	steps := int(cfg.Window / cfg.Interval)
	start := time.Now()
	at := func(i int) time.Time { return start.Add(time.Duration(i) * time.Second) }

	m.Check(at(0))
	m.Check(at(1))
	assertState(t, m, set, nil)
	runtime.GC()
	m.Check(at(2))
	assertState(t, m, set, []string{metrics.CauseGCPause})
	if log := lb.String(); !strings.Contains(log, "gc_pause.max_at_least=") {
		t.Errorf("log = %q, want the pause measured", log)
	}
	for i := 3; i <= steps+2; i++ {
		m.Check(at(i))
	}
	assertState(t, m, set, nil)
}

func TestFDs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("open files are read from /proc")
	}
	p, err := procfs.Self()
	if err != nil {
		t.Fatalf("procfs.Self() = %v", err)
	}
	open, err := p.FileDescriptorsLen()
	if err != nil {
		t.Fatalf("FileDescriptorsLen() = %v", err)
	}
	lim, err := p.Limits()
	if err != nil {
		t.Fatalf("Limits() = %v", err)
	}
	// The limit is the knob: the process's own rlimit stays as it is.
	cfg := healthy()
	cfg.MaxFDs = float64(open+10) / float64(lim.OpenFiles)
	m, set, lb := newTest(t, cfg)
	m.Check(time.Now())
	assertState(t, m, set, nil)

	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for range 40 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatalf("os.Open(%q) = %v", os.DevNull, err)
		}
		files = append(files, f)
	}
	m.Check(time.Now().Add(time.Second))
	assertState(t, m, set, []string{metrics.CauseFDs})
	if log := lb.String(); !strings.Contains(log, "fds.open=") || !strings.Contains(log, "fds.soft_limit=") {
		t.Errorf("log = %q, want the open files and their limit", log)
	}

	for _, f := range files {
		f.Close()
	}
	files = nil
	m.Check(time.Now().Add(2 * time.Second))
	assertState(t, m, set, nil)
}

// TestPortsLive counts a real loopback connection: its client side holds
// an ephemeral port of 127.0.0.1, its server side does not.
func TestPortsLive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("sockets are read from /proc")
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("net.Listen() = %v", err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatalf("net.Dial(%s) = %v", ln.Addr(), err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept() = %v", err)
	}
	defer s.Close()

	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatalf("reading the port range: %v", err)
	}
	rng, err := parsePortRange(b)
	if err != nil {
		t.Fatal(err)
	}

	cfg := healthy()
	cfg.MaxPorts = 1e-9 // one socket is over
	m, set, _ := newTest(t, cfg)
	m.Check(time.Now())
	if !slices.Contains(m.Causes(), metrics.CausePorts) {
		t.Errorf("Causes() = %q with a loopback connection and MaxPorts %v, want %s", m.Causes(), cfg.MaxPorts, metrics.CausePorts)
	}
	// Other processes of the namespace may hold ports of 127.0.0.1 too.
	if got, least := testutil.ToFloat64(set.PortUsage("127.0.0.1")), 1/float64(rng.size()); got < least {
		t.Errorf("imcanary_probe_ephemeral_port_usage_ratio{address=\"127.0.0.1\"} = %v, want at least %v", got, least)
	}
}

// TestUnavailableProc runs without /proc: each source is warned about once
// and no cause is raised from what could not be read.
func TestUnavailableProc(t *testing.T) {
	cfg := healthy()
	cfg.MaxCPU, cfg.MaxFDs, cfg.MaxPorts = 1e-9, 1e-9, 1e-9
	m, set, lb := newTestAt(t, cfg, t.TempDir()+"/no-proc")
	start := time.Now()
	for i := range 2 * portEvery {
		m.Check(start.Add(time.Duration(i) * time.Second))
		assertState(t, m, set, nil)
	}
	log := lb.String()
	for _, source := range []string{"cpu", "fds", "ports"} {
		if n := strings.Count(log, "source="+source+" "); n != 1 {
			t.Errorf("log has %d warnings for source %s, want 1: %q", n, source, log)
		}
	}
}

// TestConcurrentRecording records from many goroutines while Checks run:
// -race proves the hot path and Check share nothing unsynchronised, and
// the window sees every sample.
func TestConcurrentRecording(t *testing.T) {
	cfg := healthy()
	cfg.Window = 600 * cfg.Interval // every Check below stays in one window
	m, _, _ := newTest(t, cfg)
	start := time.Now()
	m.Check(start)
	const workers, each = 8, 5000
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range each {
				m.SendLag(time.Duration(i%2) * time.Second) // half over the limit
				_ = m.Saturated()
			}
		})
	}
	for i := 1; i <= 20; i++ {
		m.Check(start.Add(time.Duration(i) * time.Second))
		_ = m.Causes()
	}
	wg.Wait()
	m.Check(start.Add(time.Minute))
	if !slices.Equal(m.Causes(), []string{metrics.CauseSendLag}) {
		t.Errorf("Causes() = %q, want [%s]", m.Causes(), metrics.CauseSendLag)
	}
	got := judgeLag(m.ring[(m.taken-1)%uint64(len(m.ring))].send, m.ring[0].send)
	if got.total != workers*each || got.over != workers*each/2 {
		t.Errorf("window lag counts = %d over of %d, want %d of %d", got.over, got.total, workers*each/2, workers*each)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _, _ := newTest(t, healthy())
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			m.Run(ctx)
			close(done)
		}()
		time.Sleep(3*m.cfg.Interval + m.cfg.Interval/2)
		cancel()
		<-done // synctest fails the test if Run never returns
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.taken != 4 {
			t.Errorf("Run made %d Checks in 3.5 intervals, want 4 (one at start, one per tick)", m.taken)
		}
	})
	t.Run("cancelled before", func(t *testing.T) {
		m, _, _ := newTest(t, healthy())
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		m.Run(ctx)
		if m.taken != 0 {
			t.Errorf("Run on a done context made %d Checks, want 0", m.taken)
		}
	})
}

func TestHotPathAllocs(t *testing.T) {
	m, _, _ := newTest(t, healthy())
	if n := testing.AllocsPerRun(1000, func() {
		m.SendLag(time.Millisecond)
		m.ReceiveLag(time.Second)
		_ = m.Saturated()
	}); n != 0 {
		t.Errorf("SendLag, ReceiveLag and Saturated allocate %v times, want 0", n)
	}
}

func BenchmarkSendLag(b *testing.B) {
	m, _, _ := newTest(b, healthy())
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.SendLag(time.Duration(i&1023) * time.Microsecond)
	}
}

func BenchmarkSendLagParallel(b *testing.B) {
	m, _, _ := newTest(b, healthy())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			m.SendLag(time.Duration(i&1023) * time.Microsecond)
		}
	})
}

func BenchmarkSaturated(b *testing.B) {
	m, _, _ := newTest(b, healthy())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = m.Saturated()
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	m, _, _ := newTest(b, healthy())
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.Check(now.Add(time.Duration(i) * time.Second))
	}
}

func TestQuantile(t *testing.T) {
	h := hist{ok: true, buckets: []float64{0, 1, 2, 3, 4, math.Inf(1)}}
	tests := []struct {
		name   string
		counts []uint64
		pct    uint64
		want   histReading
	}{
		{"empty", []uint64{0, 0, 0, 0, 0}, 99, histReading{}},
		// The 99th of 100 is in the first bucket: 0.99·100 in floating
		// point would round the rank up to the 100th.
		{"p99 of 100 with one outlier", []uint64{99, 0, 0, 1, 0}, 99, histReading{known: true, n: 100, lo: 0, hi: 1}},
		{"p99 of 100 with two outliers", []uint64{98, 0, 0, 2, 0}, 99, histReading{known: true, n: 100, lo: 3, hi: 4}},
		{"p99 of few is their maximum", []uint64{3, 1, 0, 0, 0}, 99, histReading{known: true, n: 4, lo: 1, hi: 2}},
		{"maximum", []uint64{500, 0, 1, 0, 0}, 100, histReading{known: true, n: 501, lo: 2, hi: 3}},
		{"maximum in the open bucket", []uint64{0, 0, 0, 0, 1}, 100, histReading{known: true, n: 1, lo: 4, hi: math.Inf(1)}},
	}
	m := &Monitor{delta: make([]uint64, 5)}
	base := []uint64{7, 7, 7, 7, 7} // cumulative counts: the window is the difference
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := make([]uint64, len(base))
			for i := range cur {
				cur[i] = base[i] + tt.counts[i]
			}
			if got := m.quantile(h, cur, base, tt.pct); got != tt.want {
				t.Errorf("quantile(%v, p%d) = %+v, want %+v", tt.counts, tt.pct, got, tt.want)
			}
		})
	}
}
