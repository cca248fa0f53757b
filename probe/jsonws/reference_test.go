package jsonws_test

import (
	"context"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/refserver"
)

// These tests prove the mapping against the reference server: the same
// population, under the same fault, once through the native adapter and
// once through configs/jsonws-reference.yaml, must count the same, within
// the fault's binomial noise, and what the server itself counted.

var secret = []byte("test-secret-of-32-characters-ok!")

// mappedReference is the shipped mapping of the reference protocol.
func mappedReference(t testing.TB) jsonws.Config {
	t.Helper()
	cfg, err := protocols.Loader().Load("../../configs/jsonws-reference.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig())
}

type popConfig struct {
	prefix           string
	users, groupSize int
	groups           []config.GroupSpec
	rate             float64
	ramp             time.Duration
	deadline         time.Duration
	lostAfter        time.Duration
	catchUp          bool
	devices          int
	// backoff is the first reconnect's; the most is 15 times it.
	backoff     time.Duration
	slow        engine.SlowReaders
	messageSize int
	// paused starts the population with sending off (SetSending).
	paused bool
}

var base = popConfig{prefix: "t", users: 20, groupSize: 5, rate: 20, ramp: 100 * time.Millisecond, deadline: time.Second, lostAfter: 2 * time.Second}

type fixture struct {
	t   *testing.T
	srv *refserver.Server
	pop *engine.Population
	set *metrics.Set
	drv probe.Driver
}

// newFixture starts a reference server with faults f and a population on
// it through the native adapter or (mapped) the mapping.
func newFixture(t *testing.T, mapped bool, f refserver.Faults, pc popConfig) *fixture {
	t.Helper()
	srv, err := refserver.New(refserver.Options{Secret: secret, Faults: f})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopSrv := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(sctx, ln) })
	// Registered first, run last: the population stops before its server.
	t.Cleanup(func() {
		stopSrv()
		wg.Wait()
	})
	url := "ws://" + ln.Addr().String() + "/ws"
	var drv probe.Driver
	if mapped {
		drv, err = jsonws.New(mappedReference(t), jsonws.Options{URL: url, Secret: secret, Heartbeat: time.Second})
	} else {
		drv, err = reference.New(reference.Options{URL: url, Secret: secret, Heartbeat: time.Second})
	}
	if err != nil {
		t.Fatal(err)
	}
	fx := startPopulation(t, drv, pc)
	fx.srv = srv
	return fx
}

// startPopulation runs a population of pc on drv until the test ends, and
// returns once it is online.
func startPopulation(t *testing.T, drv probe.Driver, pc popConfig) *fixture {
	t.Helper()
	fx := &fixture{t: t, drv: drv}
	fx.set = metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
	backoff := pc.backoff
	if backoff == 0 {
		backoff = 20 * time.Millisecond
	}
	var err error
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver: drv, Run: "testrun", Heartbeat: time.Second,
			BackoffMin: backoff, BackoffMax: 15 * backoff,
			CatchUp: pc.catchUp,
		},
		Set: fx.set, Prefix: pc.prefix, Users: pc.users, GroupSize: pc.groupSize, Rate: pc.rate, Groups: pc.groups,
		Ramp: pc.ramp, Deadline: pc.deadline, LostAfter: pc.lostAfter, Devices: pc.devices,
		SlowReaders: pc.slow, MessageSize: pc.messageSize, StartPaused: pc.paused,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = fx.pop.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	// Tinode's logins are a bcrypt each: on a loaded machine they come
	// slower than any fixed guess, so the wait fails on a stall (longer
	// than the longest backoff), not on a wall-clock bound.
	sessions := pc.users * max(pc.devices, 1)
	probetest.WaitReady(t, fx.pop, sessions, 10*time.Second+15*backoff, 10*(10*time.Second+2*pc.ramp))
	return fx
}

type totals struct {
	sent, expected, delivered, recovered, lost, late, dup, reordered float64
}

func (fx *fixture) counts() totals { return fx.cohort(metrics.Normal) }

// cohort returns the counts of one cohort of receivers.
func (fx *fixture) cohort(co metrics.Cohort) totals {
	var c totals
	for _, k := range fx.set.Kind {
		r := k.Cohort[co]
		c.sent += metrics.Value(k.Sent)
		c.expected += metrics.Value(r.Expected)
		c.delivered += metrics.Value(r.Delivered)
		c.recovered += metrics.Value(r.Recovered)
		c.lost += metrics.Value(r.Lost)
		c.late += metrics.Value(r.Late)
		c.dup += metrics.Value(r.Duplicate)
		c.reordered += metrics.Value(r.Reordered)
	}
	return c
}

// soak sends for d, then stops sending and waits until every acked message
// is accounted for, or four times lost_after. A receiver whose session a
// test ended comes back after its backoff, syncs and fetches after the
// gap's grace: on a loaded CI machine twice lost_after was once too short
// for that (TestTinodePopulation, 6 of 2,510 neither delivered nor lost
// after 13 s). Waiting longer costs a run that settles nothing.
func (fx *fixture) soak(d, lostAfter time.Duration) totals {
	testwait.Traffic(fx.pop, d)
	testwait.Settle(fx.pop, lostAfter, 4*lostAfter+time.Second, func() bool {
		c := fx.counts()
		return c.expected > 0 && c.delivered+c.recovered+c.lost == c.expected
	})
	return fx.counts()
}

// agree checks that two measured rates of a fault of probability p over n1
// and n2 trials differ by no more than their binomial noise allows (five
// standard deviations of the difference, and one event).
func agree(t *testing.T, what string, k1, n1, k2, n2, p float64) {
	t.Helper()
	sd := math.Sqrt(p*(1-p)/n1 + p*(1-p)/n2)
	if d := math.Abs(k1/n1 - k2/n2); d > 5*sd+1/math.Min(n1, n2) {
		t.Errorf("%s: native %.4f (%v/%v), mapped %.4f (%v/%v): differ by %.4f, more than the noise allows (5 sd = %.4f)",
			what, k1/n1, k1, n1, k2/n2, k2, n2, d, 5*sd)
	}
}

func TestMappedMatchesNative(t *testing.T) {
	const soakFor = 2 * time.Second
	cases := []struct {
		name   string
		faults refserver.Faults
		pc     popConfig
		p      float64
		// count picks the count the fault shows in, and server what
		// the server counted of it.
		count  func(totals) float64
		server func(refserver.Stats) uint64
	}{
		{"clean", refserver.Faults{}, base, 0, func(c totals) float64 { return c.lost }, nil},
		{"drop", refserver.Faults{Drop: 0.02}, base, 0.02, func(c totals) float64 { return c.lost },
			func(s refserver.Stats) uint64 { return s.Dropped }},
		{"duplicate", refserver.Faults{Duplicate: 0.02}, base, 0.02, func(c totals) float64 { return c.dup },
			func(s refserver.Stats) uint64 { return s.Duplicated }},
		{"reorder", refserver.Faults{Reorder: 0.02}, base, 0.02, func(c totals) float64 { return c.reordered },
			func(s refserver.Stats) uint64 { return s.Reordered }},
		{"drop-push with catch-up", refserver.Faults{DropPush: 0.02}, withCatchUp(base), 0.02, func(c totals) float64 { return c.recovered },
			func(s refserver.Stats) uint64 { return s.DroppedPush }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got [2]totals
			var srv [2]uint64
			for i, mapped := range []bool{false, true} {
				fx := newFixture(t, mapped, c.faults, c.pc)
				got[i] = fx.soak(soakFor, c.pc.lostAfter)
				if c.server != nil {
					srv[i] = c.server(fx.srv.Stats())
				}
				t.Logf("mapped=%v: %+v, server counted %d", mapped, got[i], srv[i])
				if got[i].expected < 1000 {
					t.Fatalf("mapped=%v: %v expected deliveries, want over 1000", mapped, got[i].expected)
				}
			}
			nat, mapd := got[0], got[1]
			if c.p == 0 {
				for i, g := range got {
					if g.lost != 0 || g.dup != 0 || g.reordered != 0 || g.late != 0 || g.delivered != g.expected {
						t.Errorf("clean run (mapped=%v): %+v, want every expected delivery and nothing else", i == 1, g)
					}
				}
				return
			}
			agree(t, c.name, c.count(nat), nat.expected, c.count(mapd), mapd.expected, c.p)
			// Each is also what its own server counted: drops at a
			// stream's tail are the only ones no later message shows.
			for i, g := range got {
				if k := c.count(g); math.Abs(k-float64(srv[i])) > math.Max(5, 0.2*float64(srv[i])) {
					t.Errorf("mapped=%v: counted %v, the server %d", i == 1, k, srv[i])
				}
			}
			if mapd.dup != 0 && c.name != "duplicate" || mapd.lost != 0 && c.name != "drop" {
				t.Errorf("mapped: duplicate %v, lost %v, want 0 under %s", mapd.dup, mapd.lost, c.name)
			}
		})
	}
}

func withCatchUp(pc popConfig) popConfig {
	pc.catchUp = true
	return pc
}

// TestMappedDevicesCatchUp: two devices per user, a server that skips one
// of them now and then, and catch-up on: every skip is fetched and counted
// recovered on the device it skipped, as the native adapter does.
func TestMappedDevicesCatchUp(t *testing.T) {
	pc := withCatchUp(base)
	pc.devices, pc.users = 2, 12
	fx := newFixture(t, true, refserver.Faults{SkipDevice: 0.02}, pc)
	c := fx.soak(2*time.Second, pc.lostAfter)
	st := fx.srv.Stats()
	t.Logf("skip-device: %+v; server skipped %d", c, st.SkippedDevice)
	if st.SkippedDevice == 0 {
		t.Fatal("the server skipped no device: the fault was not injected")
	}
	if math.Abs(c.recovered-float64(st.SkippedDevice)) > math.Max(5, 0.2*float64(st.SkippedDevice)) {
		t.Errorf("recovered %v, server skipped %d", c.recovered, st.SkippedDevice)
	}
	if c.lost != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("lost %v, delivered %v + recovered %v of %v: the store had every skipped message", c.lost, c.delivered, c.recovered, c.expected)
	}
}

// histCountOf returns a histogram's sample count and sum.
func histCountOf(o prometheus.Observer) (uint64, float64) {
	var m dto.Metric
	_ = o.(prometheus.Metric).Write(&m)
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

// checkComplete checks a run on a server that loses nothing, during which
// the sessions of some receivers (killed of them) ended: thousands of
// deliveries, every acked message delivered or, for the receivers away a
// while, recovered by catch-up, none lost or twice, and ack and delivery
// latency recorded for both kinds.
func (fx *fixture) checkComplete(c totals, killed int) {
	t := fx.t
	t.Helper()
	if c.expected < 2000 {
		t.Fatalf("%v expected deliveries, want thousands", c.expected)
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost %v, duplicate %v: want 0 on a server that loses nothing", c.lost, c.dup)
	}
	if c.delivered+c.recovered != c.expected {
		t.Errorf("delivered %v + recovered %v != expected %v: every acked message is accounted once", c.delivered, c.recovered, c.expected)
	}
	if c.recovered == 0 {
		t.Errorf("nothing recovered after %d sessions ended mid-run: catch-up did not run", killed)
	}
	for _, k := range []metrics.Kind{metrics.Direct, metrics.Group} {
		if n, _ := histCountOf(fx.set.Kind[k].AckLatency); n == 0 {
			t.Errorf("no %s ack latency recorded", k.Name())
		}
		if n, _ := histCountOf(fx.set.Kind[k].Cohort[metrics.Normal].DeliveryLatency); n == 0 {
			t.Errorf("no %s delivery latency recorded", k.Name())
		}
	}
}

// TestMappedPushesInFlightAreNotRecovered: through the mapping, as through
// the native adapter, a push up to a quarter of the deadline behind the
// message or sync answer that revealed its seq is a push, not a recovery:
// the mapping's catch-up waits the same grace.
func TestMappedPushesInFlightAreNotRecovered(t *testing.T) {
	pc := withCatchUp(base)
	// 2 msg/s alternating direct and group: a sender's own messages 1 s
	// apart, more than the jitter, so that any reordered is false. At a
	// 3 s deadline the grace is 250 ms past the quarter, more than a
	// loaded machine's scheduling delays.
	pc.rate, pc.deadline, pc.lostAfter = 2, 3*time.Second, 6*time.Second
	quarter := pc.deadline / 4
	for _, f := range []refserver.Faults{{Delay: quarter}, {Jitter: quarter}} {
		fx := newFixture(t, true, f, pc)
		c := fx.soak(3*time.Second, pc.lostAfter)
		t.Logf("%+v: %+v", f, c)
		if c.expected < 200 {
			t.Fatalf("%v expected deliveries, want hundreds", c.expected)
		}
		if c.recovered != 0 || c.lost != 0 || c.reordered != 0 || c.dup != 0 || c.delivered != c.expected {
			t.Errorf("delay %v, jitter %v: %+v; want every delivery pushed, none recovered, lost or reordered", f.Delay, f.Jitter, c)
		}
	}
}
