package reference_test

import (
	"context"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/saturation"
)

// These tests run a population against the reference server over
// loopback, for what needs a real connection: a clean run's own lags and
// stamps, a restart of the server, provisioning at scale and a slow
// reader. The ledger's count of each fault, and a silent stall's lag, are
// proven exactly in package engine (faults_test.go, in memory under
// synctest), and through every adapter by the conformance suite.

var secret = []byte("test-secret")

// fixture is a target on loopback and a population monitoring it.
type fixture struct {
	t      *testing.T
	srv    *refserver.Server
	ln     net.Listener
	addr   string
	pop    *engine.Population
	set    *metrics.Set
	probe  *metrics.ProbeSet
	health *saturation.Monitor
	// saturated is set if the monitor ever flagged saturation;
	// saturatedTicks counts the 50 ms ticks it was flagged at, so that a
	// test can tell whether it was during a window of its own.
	saturated      atomic.Bool
	saturatedTicks atomic.Int64
	cancel         context.CancelFunc
	wg             sync.WaitGroup
	stopT          context.CancelFunc
}

type popConfig struct {
	users, groupSize int
	rate             float64
	deadline         time.Duration
	lostAfter        time.Duration
	messageSize      int
	slow             engine.SlowReaders
	sendQueue        int // the target's; 0 is its default
	sendBuffer       int // the target's
	maxConnectRate   float64
	dialTimeout      time.Duration // the driver's; 0 is its default
	// wrap, if set, wraps the driver the population uses.
	wrap func(probe.Driver) probe.Driver
	// via, if set, maps the target's address to the one the population
	// dials: a proxy in between.
	via      func(addr string) string
	observer engine.Observer
	// catchUp turns catch-up on; devices, groups and lifetime are the
	// population's Devices, Groups and SessionLifetime.
	catchUp    bool
	devices    int
	groups     []config.GroupSpec
	lifetime   time.Duration
	behaviours []config.Behaviour
	// target, if set, adjusts the target's options.
	target func(*refserver.Options)
	// logger, if set, is the population's.
	logger *slog.Logger
}

func startTarget(t *testing.T, addr string, o refserver.Options) (*refserver.Server, net.Listener, context.CancelFunc, *sync.WaitGroup) {
	t.Helper()
	o.Secret = secret
	srv, err := refserver.New(o)
	if err != nil {
		t.Fatalf("refserver.New: %v", err)
	}
	// Rebinding the address of a target that just stopped can take a
	// moment on a busy machine.
	ln := listenAgain(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	return srv, ln, cancel, &wg
}

func newFixture(t *testing.T, f refserver.Faults, pc popConfig) *fixture {
	t.Helper()
	fx := &fixture{t: t}
	to := refserver.Options{Faults: f, SendQueue: pc.sendQueue, SendBuffer: pc.sendBuffer}
	if pc.target != nil {
		pc.target(&to)
	}
	srv, ln, stopT, twg := startTarget(t, "127.0.0.1:0", to)
	fx.srv, fx.ln, fx.addr, fx.stopT = srv, ln, ln.Addr().String(), stopT
	dial := fx.addr
	if pc.via != nil {
		dial = pc.via(fx.addr)
	}
	drv, err := reference.New(reference.Options{URL: "ws://" + dial + "/ws", Secret: secret, Heartbeat: time.Second, DialTimeout: pc.dialTimeout})
	if err != nil {
		t.Fatal(err)
	}
	var pdrv probe.Driver = drv
	if pc.wrap != nil {
		pdrv = pc.wrap(drv)
	}
	m := metrics.New(prometheus.NewPedanticRegistry())
	fx.set, fx.probe = m.For("test", metrics.SourceBackground), m.Probe("test")
	// The saturation monitor at its production limits, but for the lags,
	// which must stay under a tenth of these tests' deadlines.
	fx.health, err = saturation.New(saturation.Config{
		Interval: 100 * time.Millisecond, Window: time.Second,
		MaxSendLag: pc.deadline / 10, MaxReceiveLag: pc.deadline / 10,
		MaxSchedLatency: 50 * time.Millisecond, MaxGCPause: 50 * time.Millisecond,
		MaxCPU: 0.9, MaxFDs: 0.9, MaxPorts: 0.9,
	}, fx.probe, nil)
	if err != nil {
		t.Fatal(err)
	}
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver:         pdrv,
			Run:            "testrun",
			Heartbeat:      time.Second,
			BackoffMin:     20 * time.Millisecond,
			BackoffMax:     300 * time.Millisecond,
			Health:         fx.health,
			MaxConnectRate: pc.maxConnectRate,
			CatchUp:        pc.catchUp,
		},
		Set:             fx.set,
		Prefix:          "t",
		Users:           pc.users,
		GroupSize:       pc.groupSize,
		Rate:            pc.rate,
		Ramp:            100 * time.Millisecond,
		Deadline:        pc.deadline,
		LostAfter:       pc.lostAfter,
		MessageSize:     pc.messageSize,
		SlowReaders:     pc.slow,
		Observer:        pc.observer,
		Devices:         pc.devices,
		Groups:          pc.groups,
		SessionLifetime: pc.lifetime,
		Behaviours:      pc.behaviours,
		Logger:          pc.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fx.cancel = cancel
	fx.wg.Go(func() { _ = fx.pop.Run(ctx) })
	fx.wg.Go(func() { fx.health.Run(ctx) })
	fx.wg.Go(func() {
		for probe.Sleep(ctx, 50*time.Millisecond) {
			if !fx.health.Saturated() {
				continue
			}
			fx.saturatedTicks.Add(1)
			if !fx.saturated.Swap(true) {
				t.Logf("saturated: %v", fx.health.Causes())
			}
		}
	})
	t.Cleanup(func() {
		fx.cancel()
		fx.wg.Wait()
		stopT()
		twg.Wait()
	})
	testwait.For(t, 10*time.Second, "population online", fx.pop.Ready)
	return fx
}

// soakStep sends for d, sweeping as the sweeper does.
func (fx *fixture) soakStep(d time.Duration) { testwait.Traffic(fx.pop, d) }

// soak sends for d, then pauses sending and waits until every acked message
// is accounted for (delivered or lost), then one lost_after more for
// duplicates and stragglers; or until lostAfter has passed twice.
func (fx *fixture) soak(d, lostAfter time.Duration) {
	testwait.Traffic(fx.pop, d)
	testwait.Settle(fx.pop, lostAfter, 2*lostAfter+time.Second, func() bool {
		c := fx.counts()
		return c.expected > 0 && c.delivered+c.recovered+c.lost == c.expected
	})
}

type totals struct {
	sent, expected, delivered, recovered, lost, late, dup, reordered, latePush float64
	// unowed are deliveries of messages never acked: not in expected.
	unowed float64
}

// counts returns the normal users' counts (and everything sent).
func (fx *fixture) counts() totals { return fx.cohort(0) }

// cohort returns the counts of one cohort (metrics.CohortIndex).
func (fx *fixture) cohort(i int) totals {
	var c totals
	for _, k := range fx.set.Kind {
		c.sent += metrics.Value(k.Sent)
		c.expected += metrics.Value(k.Cohort[i].Expected)
		c.delivered += metrics.Value(k.Cohort[i].Delivered)
		c.recovered += metrics.Value(k.Cohort[i].Recovered)
		c.lost += metrics.Value(k.Cohort[i].Lost)
		c.late += metrics.Value(k.Cohort[i].Late)
		c.dup += metrics.Value(k.Cohort[i].Duplicate)
		c.reordered += metrics.Value(k.Cohort[i].Reordered)
		c.latePush += metrics.Value(k.Cohort[i].LatePush)
		c.unowed += metrics.Value(k.Cohort[i].Unowed)
	}
	return c
}

// Light enough to keep latency far under the deadline on a loaded 2-core
// machine under -race: 20 users at 25 msg/s, group size 5, so 500 msg/s
// and about 1,250 deliveries/s.
var base = popConfig{users: 20, groupSize: 5, rate: 25, deadline: time.Second, lostAfter: 2 * time.Second}

const soakFor = 3 * time.Second

func TestCleanRunCountsNothingWrong(t *testing.T) {
	fx := newFixture(t, refserver.Faults{}, base)
	fx.soak(soakFor, base.lostAfter)
	c := fx.counts()
	t.Logf("clean: %+v", c)
	if c.expected < 2000 {
		t.Fatalf("expected deliveries = %v, want thousands", c.expected)
	}
	if c.delivered != c.expected {
		t.Errorf("delivered = %v, want every expected delivery (%v)", c.delivered, c.expected)
	}
	if c.lost != 0 || c.late != 0 || c.dup != 0 || c.reordered != 0 {
		t.Errorf("lost/late/duplicate/reordered = %v/%v/%v/%v on a clean target, want all 0", c.lost, c.late, c.dup, c.reordered)
	}
	if n := metrics.Value(fx.set.SessionsLagging); n != 0 {
		t.Errorf("sessions lagging = %v on a clean target, want 0", n)
	}
	// The converse of the saturation tests: a healthy run never flags it,
	// and its receive lag is measured (every adapter stamps its frames).
	if fx.saturated.Load() {
		t.Errorf("the prober flagged itself saturated during a healthy run")
	}
	if n, _ := histCount(fx.probe.ReceiveLag); n < uint64(c.delivered) {
		t.Errorf("%d receive lag samples, want one per delivery (%v)", n, c.delivered)
	}
	if n, _ := histCount(fx.probe.SendLag); n < uint64(c.sent) {
		t.Errorf("%d send lag samples, want one per message sent (%v)", n, c.sent)
	}
}

// histCount returns a histogram's sample count and its p99 bucket bound.
func histCount(o prometheus.Observer) (uint64, float64) {
	var m dto.Metric
	_ = o.(prometheus.Metric).Write(&m)
	h := m.Histogram
	for _, b := range h.Bucket {
		if float64(b.GetCumulativeCount()) >= 0.99*float64(h.GetSampleCount()) {
			return h.GetSampleCount(), b.GetUpperBound()
		}
	}
	return h.GetSampleCount(), math.Inf(1)
}

// within reports whether got is within tol (a fraction) of want.
func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

// TestProvisionManyGroups provisions more groups than the target's send
// queue holds replies: a provisioner that wrote them all before reading
// would be kicked as a slow reader.
func TestProvisionManyGroups(t *testing.T) {
	srv, err := refserver.New(refserver.Options{Secret: secret, SendQueue: 16})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	defer func() { cancel(); wg.Wait() }()
	drv, err := reference.New(reference.Options{URL: "ws://" + ln.Addr().String() + "/ws", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	var plan probe.Plan
	for i := range 500 {
		plan.Groups = append(plan.Groups, probe.Group{Name: "g" + strconv.Itoa(i), Members: []string{"a", "b"}})
	}
	if err := drv.Provision(ctx, plan); err != nil {
		t.Fatalf("Provision(500 groups) = %v, want nil", err)
	}
	// Idempotent: the same plan again succeeds.
	if err := drv.Provision(ctx, plan); err != nil {
		t.Fatalf("second Provision = %v, want nil", err)
	}
	if k := srv.Stats().SlowConsumerKicks; k != 0 {
		t.Errorf("slow-consumer kicks = %d, want 0", k)
	}
}

// TestSlowReaderDrill: a fifth of the users stop reading; the target's
// small send queue overflows behind them and it closes them as slow
// consumers (4008). The drill must count exactly that, and the normal
// users must see no loss: the server's treatment of slow readers is the
// subject, and it must not blur everyone else's numbers.
func TestSlowReaderDrill(t *testing.T) {
	pc := base
	// Each slow reader is sent 25 bodies of 16 KiB a second and reads 10:
	// with the target's send buffer fixed at 64 KiB, its 64-frame queue
	// overflows within seconds, and the close frame reaches the reader
	// after the few frames still in the socket buffers.
	pc.rate, pc.messageSize = 10, 16<<10
	pc.slow = engine.SlowReaders{Fraction: 0.2, ReadDelay: 100 * time.Millisecond}
	pc.sendQueue, pc.sendBuffer = 64, 64<<10
	fx := newFixture(t, refserver.Faults{}, pc)
	slow := 0
	for i := range fx.pop.Users() {
		if fx.pop.Slow(i) {
			slow++
		}
	}
	start := time.Now()
	testwait.For(t, 20*time.Second, "every slow reader disconnected as a slow consumer", func() bool {
		return metrics.Value(fx.set.Disconnects[metrics.ReasonSlowConsumer]) >= float64(slow)
	})
	t.Logf("%d slow readers disconnected as slow consumers within %v", slow, time.Since(start).Round(time.Millisecond))
	fx.soak(time.Second, pc.lostAfter)
	normal, sr := fx.cohort(0), fx.cohort(1)
	t.Logf("normal: %+v", normal)
	t.Logf("slow readers: %+v", sr)
	// On a loaded machine some acks come after the deadline: those
	// messages are written off as ack timeouts and owed to nobody, yet
	// still delivered. Each explains at most one delivery per recipient,
	// as measured in this run; on a quiet machine there are none, and
	// delivered must equal expected exactly.
	ackTimeouts := metrics.Value(fx.set.SendErrors[metrics.SendAckTimeout])
	if extra := normal.delivered - normal.expected; normal.expected < 1000 || extra < 0 ||
		extra > ackTimeouts*float64(pc.groupSize-1) || normal.lost != 0 || normal.dup != 0 {
		t.Errorf("normal users: %+v with %v ack timeouts, want every expected delivery delivered once, none lost, "+
			"and no more beyond those of messages written off", normal, ackTimeouts)
	}
	if sr.expected == 0 {
		t.Errorf("slow readers: nothing expected, want their deliveries counted in their own cohort")
	}
	for _, r := range []string{metrics.ReasonError, metrics.ReasonServerClose} {
		if n := metrics.Value(fx.set.Disconnects[r]); n != 0 {
			t.Errorf("%s disconnects = %v, want 0: only the slow readers' slow_consumer closes", r, n)
		}
	}
	if n := metrics.Value(fx.set.SessionsLagging); n != 0 {
		t.Errorf("sessions lagging = %v, want 0: slow readers are not counted", n)
	}
}
