package openim_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/canary"
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/openim"
	"github.com/imcanary/imcanary/probe/openim/openimtest"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/soak"
)

// These tests run the adapter against openimtest, a gateway written from
// OpenIM's own protobuf types whose frames follow OpenIM v3.8.3's
// internal/msggateway, and those that need no injected fault against the
// real OpenIM too, where CI runs one (onServers). Each fault is injected
// at a known rate and must be counted as what it is, within a tolerance
// relative to what the gateway itself did in the same run; with none,
// nothing may be counted wrong.

const secret = "test-api-secret"

// popConfig is what a test changes of the population.
type popConfig struct {
	users, groupSize, devices int
	rate                      float64
	catchUp                   bool
	// deadline is the population's; 0 is 2 s.
	deadline     time.Duration
	lostAfter    time.Duration
	lateFraction float64
	lateAfter    time.Duration
	messageSize  int
	// startPaused holds sending until the test starts it (SetSending).
	startPaused bool
}

var base = popConfig{users: 60, groupSize: 5, devices: 1, rate: 2, catchUp: true, lostAfter: 4 * time.Second}

type fixture struct {
	t    *testing.T
	drv  *openim.Driver
	kill *probetest.Killer
	pop  *engine.Population
	set  *metrics.Set
}

func newGateway(t *testing.T, o openimtest.Options) *openimtest.Server {
	t.Helper()
	o.Secret = secret
	gw, err := openimtest.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return gw
}

// server is an OpenIM to test against: an openimtest gateway or the real
// services (realServer).
type server interface {
	APIURL() string
	WSURL() string
}

// secretOf is srv's API secret.
func secretOf(srv server) []byte {
	if r, ok := srv.(realServer); ok {
		return r.secret
	}
	return []byte(secret)
}

// onServers runs f against a fresh openimtest gateway and against the
// real OpenIM, where CI runs one, with pc made for it (forReal).
func onServers(t *testing.T, pc popConfig, f func(t *testing.T, srv server, pc popConfig)) {
	t.Run("openimtest", func(t *testing.T) { f(t, newGateway(t, openimtest.Options{}), pc) })
	t.Run("real", func(t *testing.T) { f(t, realTarget(t), pc.forReal()) })
}

// forReal fits pc to the real OpenIM as CI runs it, where every message is
// written through FerretDB: a tenth of the test gateway's rate (12
// messages a second for 60 users), at which every test here passed on
// FerretDB's PostgreSQL backend. At a quarter, on its SQLite backend,
// pushes fell seconds behind and catch-up pulled them first (a quarter was
// not tried on PostgreSQL). Latency is counted late past 5 s, lost past
// 15 s.
func (pc popConfig) forReal() popConfig {
	pc.rate /= 10
	pc.deadline = 5 * time.Second
	pc.lostAfter = max(pc.lostAfter, 15*time.Second)
	return pc
}

func newDriver(t *testing.T, srv server, o openim.Options) *openim.Driver {
	t.Helper()
	o.URL = srv.WSURL()
	if o.Secret == nil {
		o.Secret = secretOf(srv)
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	drv, err := openim.New(openim.Config{APIURL: srv.APIURL()}, o)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func start(t *testing.T, srv server, pc popConfig) *fixture {
	t.Helper()
	fx := &fixture{t: t, drv: newDriver(t, srv, openim.Options{})}
	fx.kill = &probetest.Killer{Driver: fx.drv, Abort: func(s probe.Session) { s.(probe.Aborter).Abort() }}
	fx.set = metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
	var err error
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver: fx.kill, Run: "testrun", Heartbeat: time.Second,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, CatchUp: pc.catchUp,
		},
		Set: fx.set, Prefix: fmt.Sprintf("oim%d", time.Now().UnixNano()%1e6), Users: pc.users, GroupSize: pc.groupSize,
		Devices: max(pc.devices, 1), Rate: pc.rate, Ramp: time.Second, Deadline: cmp.Or(pc.deadline, 2*time.Second), LostAfter: pc.lostAfter,
		LateFraction: pc.lateFraction, LateAfter: pc.lateAfter, MessageSize: pc.messageSize,
		StartPaused: pc.startPaused,
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
	if !pc.startPaused {
		probetest.WaitReady(t, fx.pop, pc.users*max(pc.devices, 1), 10*time.Second, 60*time.Second)
	}
	return fx
}

func (fx *fixture) user(i int) string { return fx.pop.Plan().Users[i] }

func (fx *fixture) totals() probetest.Totals { return probetest.Cohort(fx.set, metrics.Normal) }

// TestGatewayCleanRun: with no fault, every owed delivery is delivered
// once, in order, on time, and the server's seqs show no gap; own messages
// come back to the sending device by sender sync and are not counted.
func TestGatewayCleanRun(t *testing.T) {
	onServers(t, base, func(t *testing.T, srv server, pc popConfig) {
		// The real server at its tenth of the rate owes fewer in the time.
		n, least := 2000.0, 1000.0
		if _, real := srv.(realServer); real {
			n, least = 600, 300
		}
		fx := start(t, srv, pc)
		c := probetest.SoakUntil(t, fx.pop, fx.set, n, 20*time.Second, pc.lostAfter, metrics.Normal)
		t.Logf("clean: %v; driver %+v; delivery p99 direct ≤ %v, group ≤ %v", c, fx.drv.Stats(),
			probetest.Quantile(fx.set.Kind[metrics.Direct].Cohort[metrics.Normal].DeliveryLatency, 0.99),
			probetest.Quantile(fx.set.Kind[metrics.Group].Cohort[metrics.Normal].DeliveryLatency, 0.99))
		if c.Expected < least {
			t.Fatalf("expected = %v, want over %v deliveries", c.Expected, least)
		}
		if c.Delivered != c.Expected || c.Lost+c.Late+c.Dup+c.Reordered+c.Recovered != 0 {
			t.Errorf("%v: want every expected delivery delivered, nothing else", c)
		}
		if g, m := fx.drv.ServerGaps(); g != 0 || m != 0 {
			t.Errorf("server gaps %d (%d missed) on a clean server, want 0", g, m)
		}
		if n := fx.drv.FramesUnmatched(); n != 0 {
			t.Errorf("%d frames unmatched", n)
		}
	})
}

// TestGatewayFaults injects each fault at a known rate: the ledger counts
// it as what it is, as many times as the gateway did it.
func TestGatewayFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults openimtest.Faults
		// pc, if set, is the population instead of base.
		pc    *popConfig
		check func(t *testing.T, c probetest.Totals, st openimtest.Stats, drv *openim.Driver)
	}{
		{"dropped push is pulled", openimtest.Faults{DropPush: 0.02}, nil, func(t *testing.T, c probetest.Totals, st openimtest.Stats, drv *openim.Driver) {
			if st.PushesDropped == 0 {
				t.Fatal("the gateway dropped no push: the fault was not injected")
			}
			// A dropped push of a sender's own message, on its own
			// connection, leaves a gap in the seqs too, but is owed to
			// nobody: every other one is pulled and recovered.
			if owed := st.PushesDropped - st.PushesDroppedOwn; c.Recovered != float64(owed) {
				t.Errorf("recovered %v, gateway dropped %d pushes owed to someone (%d more of senders' own)", c.Recovered, owed, st.PushesDroppedOwn)
			}
			if c.Lost != 0 || c.Dup != 0 || c.Delivered+c.Recovered != c.Expected {
				t.Errorf("%v: the store had every message, want none lost or duplicated", c)
			}
			if g, _ := drv.ServerGaps(); g == 0 {
				t.Error("no server seq gap counted for the dropped pushes")
			}
		}},
		{"duplicate push is counted", openimtest.Faults{DuplicatePush: 0.02}, nil, func(t *testing.T, c probetest.Totals, st openimtest.Stats, _ *openim.Driver) {
			if st.PushesDuplicated == 0 {
				t.Fatal("the gateway duplicated no push")
			}
			// One of a sender's own message, on its own connection,
			// is skipped with the original.
			if owed := st.PushesDuplicated - st.PushesDuplicatedOwn; c.Dup != float64(owed) {
				t.Errorf("duplicates %v, gateway duplicated %d pushes owed to someone (%d more of senders' own)", c.Dup, owed, st.PushesDuplicatedOwn)
			}
			if c.Lost != 0 || c.Delivered != c.Expected {
				t.Errorf("%v: duplicates must not disturb completeness", c)
			}
		}},
		// A held push waits for its sender's next one in the
		// conversation; past the catch-up grace (a third of the 2 s
		// deadline) its gap is pulled first and it arrives as a late
		// push, not a reorder. Few users sending fast keep most waits
		// shorter.
		{"reordered push is counted", openimtest.Faults{ReorderPush: 0.02}, &popConfig{users: 20, groupSize: 5, devices: 1, rate: 8, catchUp: true, lostAfter: 4 * time.Second}, func(t *testing.T, c probetest.Totals, st openimtest.Stats, _ *openim.Driver) {
			if st.PushesReordered == 0 {
				t.Fatal("the gateway reordered no push")
			}
			if c.Reordered == 0 || c.Reordered > float64(st.PushesReordered) {
				t.Errorf("reordered %v, gateway swapped %d pushes: want some counted, never more", c.Reordered, st.PushesReordered)
			}
			if c.Lost != 0 || c.Dup != 0 || c.Delivered+c.Recovered != c.Expected {
				t.Errorf("%v: reordering must cost nothing else", c)
			}
		}},
		{"unstored send is lost", openimtest.Faults{Unstored: 0.01}, nil, func(t *testing.T, c probetest.Totals, st openimtest.Stats, drv *openim.Driver) {
			if st.Unstored == 0 {
				t.Fatal("the gateway stored every send")
			}
			// An unstored group message is owed to each member but its
			// sender: more lost deliveries than unstored sends.
			if c.Lost < float64(st.Unstored) {
				t.Errorf("lost %v, gateway acked and dropped %d sends: want at least one loss each", c.Lost, st.Unstored)
			}
			if c.Recovered != 0 || c.Dup != 0 {
				t.Errorf("%v: nothing of an unstored message can be pulled", c)
			}
			if g, _ := drv.ServerGaps(); g != 0 {
				t.Errorf("%d server gaps: an unstored message has no seq, the server's numbering cannot show it", g)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := newGateway(t, openimtest.Options{Faults: tc.faults, Seed: 7})
			pc := base
			if tc.pc != nil {
				pc = *tc.pc
			}
			// Three times the deadline for catch-up to find a dropped
			// push (after the grace of a third of the deadline, at the
			// next frame or sync) before it is counted lost, so that a
			// loaded machine's stalls do not turn a recovery into a loss.
			pc.lostAfter = 6 * time.Second
			fx := start(t, gw, pc)
			c := probetest.SoakUntil(t, fx.pop, fx.set, 2000, 20*time.Second, pc.lostAfter, metrics.Normal)
			st := gw.Stats()
			t.Logf("%s: %v; gateway %+v; driver %+v", tc.name, c, st, fx.drv.Stats())
			if c.Expected < 1000 {
				t.Fatalf("expected = %v, want over a thousand deliveries", c.Expected)
			}
			tc.check(t, c, st, fx.drv)
		})
	}
}

// TestGatewayDelayIsLatency: a push delayed past the deadline is late, not
// lost. Catch-up is off: with it, the sync every quarter of lost_after
// finds the newer seqs before their pushes come and pulls them, recovered
// rather than late, as OpenIM's SDK would get them.
func TestGatewayDelayIsLatency(t *testing.T) {
	gw := newGateway(t, openimtest.Options{Faults: openimtest.Faults{PushDelay: 2500 * time.Millisecond}})
	pc := base
	pc.catchUp = false
	fx := start(t, gw, pc)
	c := probetest.SoakUntil(t, fx.pop, fx.set, 1000, 20*time.Second, base.lostAfter, metrics.Normal)
	t.Logf("delay: %v", c)
	if c.Late != c.Delivered || c.Delivered != c.Expected || c.Lost != 0 {
		t.Errorf("%v: want every delivery late (2.5 s past a 2 s deadline), none lost", c)
	}
}

// TestGatewayPushInFlightIsNotRecovered: OpenIM counts a message in the
// conversation's newest seq when it accepts it, and pushes it later (its
// published run averaged 0.2 s from send to receipt). A push up to a
// quarter of the deadline late is a push, not recovered by the sync every
// quarter of lost_after that names its seq first. At a 3 s deadline the
// grace (1 s) is 250 ms past the quarter, more than a loaded machine's
// scheduling delays.
func TestGatewayPushInFlightIsNotRecovered(t *testing.T) {
	pc := base
	pc.deadline, pc.lostAfter = 3*time.Second, 6*time.Second
	gw := newGateway(t, openimtest.Options{Faults: openimtest.Faults{PushDelay: pc.deadline / 4}})
	fx := start(t, gw, pc)
	c := probetest.SoakUntil(t, fx.pop, fx.set, 1000, 20*time.Second, pc.lostAfter, metrics.Normal)
	t.Logf("push delay %v: %v", pc.deadline/4, c)
	if c.Expected < 1000 {
		t.Fatalf("expected = %v, want over a thousand deliveries", c.Expected)
	}
	if c.Delivered != c.Expected || c.Recovered+c.Lost+c.Late+c.Dup+c.Reordered != 0 {
		t.Errorf("%v: want every delivery pushed on time, none recovered", c)
	}
}

// TestGatewayCatchUp: users dropped without a close come back to what was
// sent meanwhile, got by GetNewestSeq and a pull: recovered, never lost.
// With catch-up off the same drops are lost.
func TestGatewayCatchUp(t *testing.T) {
	for _, catchUp := range []bool{true, false} {
		pc := base
		pc.catchUp = catchUp
		onServers(t, pc, func(t *testing.T, srv server, pc popConfig) {
			t.Logf("catch_up=%v", catchUp)
			fx := start(t, srv, pc)
			testwait.Traffic(fx.pop, time.Second)
			killed := 0
			for i := range 4 {
				killed += fx.kill.Kill(fx.user(3+i*13), 1500*time.Millisecond)
			}
			testwait.Traffic(fx.pop, 4*time.Second)
			c := probetest.Settle(t, fx.pop, fx.set, pc.lostAfter, metrics.Normal)
			t.Logf("catch-up %v: %v; %d sessions dropped; driver %+v", catchUp, c, killed, fx.drv.Stats())
			if killed == 0 {
				t.Fatal("no session dropped")
			}
			if catchUp {
				if c.Recovered == 0 || c.Lost != 0 || c.Dup != 0 || c.Delivered+c.Recovered != c.Expected {
					t.Errorf("%v: want what the dropped users missed recovered, nothing lost", c)
				}
			} else if missing := c.Expected - c.Delivered - c.Recovered; missing == 0 || c.Recovered != 0 {
				// Missing: lost, or never come when sending stopped (a
				// stream's last messages, with nothing after them to show
				// the gap; a soak's report counts them undelivered).
				t.Errorf("%v: with catch-up off, want what the dropped users missed missing", c)
			}
		})
	}
}

// TestGatewayLateLogins is OpenIM's reliability test in small: half the
// users log in late and must get what was sent to them meanwhile, through
// GetNewestSeq and a pull at their first login.
func TestGatewayLateLogins(t *testing.T) {
	pc := base
	pc.lateFraction, pc.lateAfter, pc.lostAfter, pc.startPaused = 0.5, 4*time.Second, 10*time.Second, true
	onServers(t, pc, func(t *testing.T, srv server, pc popConfig) { lateLogins(t, srv, pc) })
}

func lateLogins(t *testing.T, srv server, pc popConfig) {
	fx := start(t, srv, pc)
	// Sending starts once the users on time are online, as a soak's
	// send phase does: the late ones are owed what is sent meanwhile.
	testwait.For(t, 30*time.Second, fmt.Sprintf("the %d users on time to be online", pc.users/2), func() bool { return fx.pop.Online() >= pc.users/2 })
	fx.pop.SetSending(true)
	probetest.WaitReady(t, fx.pop, pc.users, 15*time.Second, 60*time.Second)
	testwait.Traffic(fx.pop, 2*time.Second)
	c := probetest.Settle(t, fx.pop, fx.set, pc.lostAfter, metrics.Normal)
	t.Logf("late logins: %v", c)
	if c.Recovered == 0 || c.Lost != 0 || c.Delivered+c.Recovered != c.Expected {
		t.Errorf("%v: want the late users' messages recovered at their login, nothing lost", c)
	}
}

// TestGatewayDevices: each user on two platforms; a message is owed to
// each of the recipient's sessions and to the sender's other one
// (MirrorsOwn), and nothing is lost or doubled.
func TestGatewayDevices(t *testing.T) {
	pc := base
	pc.users, pc.devices = 30, 2
	onServers(t, pc, func(t *testing.T, srv server, pc popConfig) { devices(t, srv, pc) })
}

func devices(t *testing.T, srv server, pc popConfig) {
	fx := start(t, srv, pc)
	c := probetest.SoakUntil(t, fx.pop, fx.set, 1500, 20*time.Second, pc.lostAfter, metrics.Normal)
	t.Logf("devices: %v", c)
	if c.Delivered != c.Expected || c.Lost+c.Dup != 0 {
		t.Errorf("%v: want every delivery to every device", c)
	}
	// Owed to 2 devices of each recipient and the sender's other one:
	// direct 3 per message, group 2×4+1 per message.
	if c.Expected < 3*c.Sent {
		t.Errorf("expected %v for %v sent, want at least 3 deliveries a message with 2 devices", c.Expected, c.Sent)
	}
}

// TestKickIsConflict: a second login on the same platform kicks the first
// (2002), which ends as conflict, not error; the second works.
func TestKickIsConflict(t *testing.T) {
	gw := newGateway(t, openimtest.Options{})
	drv := newDriver(t, gw, openim.Options{})
	ctx := context.Background()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{"kick-a"}}); err != nil {
		t.Fatal(err)
	}
	first, err := drv.Connect(ctx, "kick-a", probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- first.Serve(newRecorder()) }()
	second, err := drv.Connect(ctx, "kick-a", probe.Device{Index: 0})
	if err != nil {
		t.Fatalf("second login on the same platform: %v", err)
	}
	defer second.Close()
	select {
	case err := <-ended:
		if r := probe.ReasonOf(err); r != metrics.ReasonConflict {
			t.Errorf("first session ended %q (%v), want conflict", r, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("first session not kicked within 10 s")
	}
	if drv.Stats().Kicked != 1 {
		t.Errorf("kicked = %d, want 1", drv.Stats().Kicked)
	}
	// Another platform is another device: no kick.
	other, err := drv.Connect(ctx, "kick-a", probe.Device{Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
}

// TestRefusedCredentials: a wrong API secret fails provisioning as
// unauthorized, naming the admin and never the secret.
func TestRefusedCredentials(t *testing.T) {
	gw := newGateway(t, openimtest.Options{})
	drv := newDriver(t, gw, openim.Options{Secret: []byte("not-the-secret")})
	err := drv.Provision(context.Background(), probe.Plan{Users: []string{"u1"}})
	if err == nil || probe.FailureReason(err) != metrics.ConnectUnauthorized {
		t.Fatalf("Provision with a wrong secret = %v (%s), want unauthorized", err, probe.FailureReason(err))
	}
	if strings.Contains(err.Error(), "not-the-secret") {
		t.Errorf("error %q holds the secret", err)
	}
}

// TestOversizeSendRefused: a body whose frame passes the gateway's
// 51,200 bytes is refused before it is written, with an error saying so,
// and the session stays up.
func TestOversizeSendRefused(t *testing.T) {
	onServers(t, base, func(t *testing.T, srv server, _ popConfig) { oversizeSendRefused(t, srv) })
}

func oversizeSendRefused(t *testing.T, srv server) {
	drv := newDriver(t, srv, openim.Options{})
	ctx := context.Background()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{"big-a", "big-b"}}); err != nil {
		t.Fatal(err)
	}
	s, err := drv.Connect(ctx, "big-a", probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := newRecorder()
	done := make(chan error, 1)
	go func() { done <- s.Serve(h) }()
	err = s.Send(&probe.Message{Ref: 1, To: "big-b", Body: []byte(strings.Repeat("x", 40000))})
	if err == nil || !strings.Contains(err.Error(), "51200") {
		t.Fatalf("Send of 40,000 bytes = %v, want an error naming the 51200-byte limit", err)
	}
	if err := s.Send(&probe.Message{Ref: 2, To: "big-b", Body: []byte("imc1 small")}); err != nil {
		t.Fatalf("Send after the refusal: %v", err)
	}
	testwait.For(t, 5*time.Second, "the small send answered", func() bool { _, _, ok := h.answered(2); return ok })
	if _, reason, ok := h.answered(2); !ok || reason != "" {
		t.Errorf("the small send: answered %v, rejected %q; want acked", ok, reason)
	}
	if _, _, ok := h.answered(1); ok {
		t.Errorf("the refused send was answered: it was written")
	}
	if drv.Stats().Oversize != 1 {
		t.Errorf("oversize = %d, want 1", drv.Stats().Oversize)
	}
	select {
	case err := <-done:
		t.Fatalf("session ended: %v", err)
	default:
	}
}

// TestShippedConfig: configs/openim.yaml, given a gateway's and an API's
// address and the secret, runs a canary round that passes: the daemon's
// own path from the configuration to the driver. What it tests is that
// path, not how fast the server pushes: on a loaded machine the real
// OpenIM has pushed a direct message after the catch-up grace (CI: 6 of
// 20 fetched instead, the slowest at 4.0 s), which fails a round as it
// should. A round that failed only so, with every message delivered or
// fetched, is logged, not failed; any other failure fails.
func TestShippedConfig(t *testing.T) {
	onServers(t, base, func(t *testing.T, srv server, _ popConfig) { shippedConfig(t, srv) })
}

func shippedConfig(t *testing.T, srv server) {
	// The secret is read from the environment when the target opens.
	t.Setenv(config.SecretEnv, string(secretOf(srv)))
	cfg, err := protocols.Loader().Load("../../configs/openim.yaml", []string{
		"IMCANARY_TARGET_URL=" + srv.WSURL(),
		"IMCANARY_TARGET_OPENIM_API_URL=" + srv.APIURL(),
		"IMCANARY_DATA_DIR=" + t.TempDir(),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := canary.Once(context.Background(), cfg, slog.New(slog.DiscardHandler), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("canary round on configs/openim.yaml: %s %+v", r.Result, r.Checks)
	slowOnly := true
	for _, c := range r.Checks {
		for _, why := range c.Reasons {
			slowOnly = slowOnly && (why == "recovered" || why == "late")
		}
		if c.Expected == 0 || c.Delivered+c.Recovered != c.Expected {
			t.Errorf("%s: delivered %d and fetched %d of %d", c.Kind, c.Delivered, c.Recovered, c.Expected)
		}
	}
	switch {
	case r.Result == "pass":
	case r.Result == "fail" && slowOnly:
		t.Logf("the round failed only on the server's push time (late, or fetched by catch-up first), with every message delivered: not this test's matter")
	default:
		t.Errorf("round %s (%s), want pass: %+v", r.Result, r.Cause, r.Checks)
	}
}

// TestProvisionIdempotent: the same plan twice changes nothing; a group
// that exists without some of its members is given them.
func TestProvisionIdempotent(t *testing.T) {
	onServers(t, base, func(t *testing.T, srv server, _ popConfig) { provisionIdempotent(t, srv) })
}

func provisionIdempotent(t *testing.T, srv server) {
	drv := newDriver(t, srv, openim.Options{})
	ctx := context.Background()
	// Names of this run: the real server keeps what earlier runs made.
	p := fmt.Sprintf("idem%d", time.Now().UnixNano()%1e9)
	users := []string{p + "-a", p + "-b", p + "-c", p + "-d"}
	small := probe.Plan{Users: users, Groups: []probe.Group{{Name: p + "-g", Members: users[:2]}}}
	if err := drv.Provision(ctx, small); err != nil {
		t.Fatal(err)
	}
	full := probe.Plan{Users: users, Groups: []probe.Group{{Name: p + "-g", Members: users}}}
	for i := range 2 {
		// The real OpenIM's invite can race its own msgtransfer to make
		// the new members' conversations (E11000 from one of them, the
		// other made them): the population retries a provisioning that
		// failed, and so does this test, a few times.
		err := drv.Provision(ctx, full)
		for try := 1; err != nil && try < 3; try++ {
			if _, real := srv.(realServer); !real {
				break
			}
			t.Logf("provision #%d of the full plan, try %d: %v", i+1, try, err)
			time.Sleep(500 * time.Millisecond)
			err = drv.Provision(ctx, full)
		}
		if err != nil {
			t.Fatalf("provision #%d of the full plan: %v", i+1, err)
		}
	}
	// Every member gets a group message: each of the four logs in, d
	// sends, a, b and c receive.
	var sessions []probe.Session
	recs := map[string]*recorder{}
	for _, u := range users {
		s, err := drv.Connect(ctx, u, probe.Device{Index: 0})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		recs[u] = newRecorder()
		serve(s, recs[u])
		sessions = append(sessions, s)
	}
	if err := sessions[3].Send(&probe.Message{Ref: 1, Group: p + "-g", Body: []byte("imc1 idem")}); err != nil {
		t.Fatal(err)
	}
	for _, u := range users[:3] {
		r := recs[u]
		testwait.For(t, 5*time.Second, u+"'s one delivery of the group message (if none, it is not a member)", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.deliveries == 1
		})
	}
}

// TestNativeProfile runs configs/soak-scenarios.yaml's
// openim-native-reliability, scaled down in users and time, against the
// test gateway through the soak command's own path: two platforms a user,
// half the users late, whose missed messages come by GetNewestSeq and a
// pull; nothing lost, and the verdict passes.
func TestNativeProfile(t *testing.T) {
	gw := newGateway(t, openimtest.Options{})
	t.Setenv(config.SecretEnv, secret)
	cfg, err := protocols.Loader().Load("../../configs/soak-scenarios.yaml", []string{
		"IMCANARY_TARGET_PROTOCOL=openim",
		"IMCANARY_TARGET_URL=" + gw.WSURL(),
		"IMCANARY_TARGET_OPENIM_API_URL=" + gw.APIURL(),
		"IMCANARY_POPULATION_HEARTBEAT=5s",
		"IMCANARY_DATA_DIR=" + t.TempDir(),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const name = "openim-native-reliability"
	i := slices.IndexFunc(cfg.Soak.Profiles, func(p config.Profile) bool { return p.Name == name })
	if i < 0 {
		t.Fatalf("no profile %s", name)
	}
	p := &cfg.Soak.Profiles[i]
	if p.Devices != 2 || p.LateLogins == 0 {
		t.Fatalf("%s: devices %d, late logins %v: not the profile the test scales", name, p.Devices, p.LateLogins)
	}
	// 40 users in the profile's groups of 5, for 15 s, the late half 4 s
	// in: the rest of the profile as shipped.

	p.Users, p.Groups, p.Duration, p.LateAfter, p.LostAfter, p.Deadline, p.Ramp, p.Drain = 40, "40x5", 15*time.Second, 4*time.Second, 8*time.Second, 2*time.Second, 2*time.Second, 4*time.Second
	rep, err := soak.Once(context.Background(), cfg, name, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	all := rep.Deliveries["all"]
	t.Logf("%s at 40 users: %s %+v, users %+v", name, rep.Result, all, rep.Users)
	if all.Recovered == 0 {
		t.Errorf("nothing recovered: the late users' missed messages were not pulled")
	}
	if all.Lost+all.Undelivered != 0 || all.Delivered+all.Recovered != all.Expected {
		t.Errorf("deliveries %+v, want every expected one delivered or recovered", all)
	}
	if rep.Result != metrics.ResultPass {
		t.Errorf("verdict %s, want pass; thresholds %+v", rep.Result, rep.Thresholds)
	}
}
