package reference_test

import (
	"context"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// These tests prove catch-up, several devices per user and group layouts
// against the reference server, each with a fault of known size (or none)
// and the count it must produce. Their tolerances are relative to what
// the server itself counted in the same run.

// withCatchUp is base with catch-up on, as the daemon runs by default.
func withCatchUp() popConfig {
	pc := base
	pc.catchUp = true
	return pc
}

// TestDropPushIsRecovered: a push the server discards while the message
// stays in its history is fetched by catch-up: recovered, never lost.
func TestDropPushIsRecovered(t *testing.T) {
	const p = 0.02
	fx := newFixture(t, refserver.Faults{DropPush: p}, withCatchUp())
	fx.soak(soakFor, base.lostAfter)
	c, st := fx.counts(), fx.srv.Stats()
	t.Logf("drop-push %v: %+v; target dropped %d pushes", p, c, st.DroppedPush)
	if st.DroppedPush == 0 {
		t.Fatalf("the target dropped no push: the fault was not injected")
	}
	if !within(c.recovered, float64(st.DroppedPush), 0.2) {
		t.Errorf("recovered = %v, target dropped %d pushes: want within 20%%", c.recovered, st.DroppedPush)
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost/duplicate = %v/%v, want 0: the store still had every message", c.lost, c.dup)
	}
	if c.delivered+c.recovered != c.expected {
		t.Errorf("delivered %v + recovered %v = %v, want every one of the %v expected", c.delivered, c.recovered, c.delivered+c.recovered, c.expected)
	}
	recoveredLatency, _ := histCount(fx.set.Kind[metrics.Direct].Cohort[metrics.Normal].RecoveryLatency)
	groupLatency, _ := histCount(fx.set.Kind[metrics.Group].Cohort[metrics.Normal].RecoveryLatency)
	if float64(recoveredLatency+groupLatency) != c.recovered {
		t.Errorf("recovery latency observed %d times, want once per recovered delivery (%v)", recoveredLatency+groupLatency, c.recovered)
	}
}

// TestDropIsLostDespiteCatchUp: what the server loses for a recipient is not
// in its history either: lost, and catch-up recovers nothing.
func TestDropIsLostDespiteCatchUp(t *testing.T) {
	const p = 0.02
	fx := newFixture(t, refserver.Faults{Drop: p}, withCatchUp())
	fx.soak(soakFor, base.lostAfter)
	c, st := fx.counts(), fx.srv.Stats()
	t.Logf("drop %v: %+v; target dropped %d", p, c, st.Dropped)
	if st.Dropped == 0 {
		t.Fatalf("the target dropped nothing: the fault was not injected")
	}
	// With catch-up, the tail drops no later message reveals are found
	// by the sync too, so the count is exact but for rounding.
	if !within(c.lost, float64(st.Dropped), 0.2) {
		t.Errorf("lost = %v, target dropped %d: want within 20%%", c.lost, st.Dropped)
	}
	if c.recovered != 0 || c.dup != 0 {
		t.Errorf("recovered/duplicate = %v/%v, want 0: the store has none of the dropped", c.recovered, c.dup)
	}
}

// TestSkipDeviceIsCountedPerDevice: with two devices per user, a delivery
// that skips one of them is owed to that device: lost without catch-up,
// recovered with it; in both, each skip is counted once.
func TestSkipDeviceIsCountedPerDevice(t *testing.T) {
	const p = 0.02
	for _, tt := range []struct {
		name    string
		catchUp bool
	}{{"catch-up off", false}, {"catch-up on", true}} {
		t.Run(tt.name, func(t *testing.T) {
			pc := base
			pc.devices, pc.catchUp = 2, tt.catchUp
			fx := newFixture(t, refserver.Faults{SkipDevice: p}, pc)
			fx.soak(soakFor, base.lostAfter)
			c, st := fx.counts(), fx.srv.Stats()
			t.Logf("skip-device %v, %s: %+v; target skipped %d", p, tt.name, c, st.SkippedDevice)
			if st.SkippedDevice == 0 {
				t.Fatalf("the target skipped no device: the fault was not injected")
			}
			missed := c.lost
			if tt.catchUp {
				missed = c.recovered
				if c.lost != 0 {
					t.Errorf("lost = %v, want 0: catch-up fetches what a device was skipped for", c.lost)
				}
			}
			if !within(missed, float64(st.SkippedDevice), 0.2) {
				t.Errorf("missed deliveries = %v, target skipped %d: want within 20%%", missed, st.SkippedDevice)
			}
			if c.dup != 0 {
				t.Errorf("duplicate = %v, want 0", c.dup)
			}
		})
	}
}

// TestDevicesCleanRun: two devices per user on a clean server: every
// message is owed to every device of its recipients and to its sender's
// other device (the server mirrors a user's messages), and each one gets
// it once.
func TestDevicesCleanRun(t *testing.T) {
	pc := withCatchUp()
	pc.devices = 2
	fx := newFixture(t, refserver.Faults{}, pc)
	fx.soak(soakFor, base.lostAfter)
	c := fx.counts()
	t.Logf("devices 2: %+v", c)
	// Per message: 2 devices of each recipient, and the sender's other
	// device. Direct: 1 recipient; group of 5: 4.
	d := fx.set.Kind[metrics.Direct]
	g := fx.set.Kind[metrics.Group]
	acked := func(k metrics.KindSet, perMsg float64) float64 {
		return metrics.Value(k.Cohort[metrics.Normal].Expected) / perMsg
	}
	if a, b := acked(d, 3), acked(g, 9); a != float64(int(a)) || b != float64(int(b)) || a == 0 || b == 0 {
		t.Errorf("expected deliveries %v direct, %v group: want multiples of 3 and 9 per acked message",
			metrics.Value(d.Cohort[metrics.Normal].Expected), metrics.Value(g.Cohort[metrics.Normal].Expected))
	}
	if c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("counts %+v: want nothing lost or duplicated, every expected delivery made", c)
	}
}

// TestChurnLosesNothing: users whose sessions end every 5 s on average, on
// a clean server, two devices each: what a device misses while away is
// fetched when it comes back, and nothing is counted lost or duplicated.
func TestChurnLosesNothing(t *testing.T) {
	pc := withCatchUp()
	// Lighter than base, and a lost_after that leaves a device coming
	// back under -race on a loaded machine time to fetch what it missed:
	// the daemon's default is 30 s.
	pc.devices, pc.lifetime, pc.rate = 2, 5*time.Second, 10
	pc.deadline, pc.lostAfter = 2*time.Second, 6*time.Second
	fx := newFixture(t, refserver.Faults{}, pc)
	fx.soak(2*soakFor, pc.lostAfter)
	c := fx.counts()
	churned := metrics.Value(fx.set.Disconnects[metrics.ReasonChurn])
	t.Logf("churn: %+v; %v sessions churned", c, churned)
	if churned == 0 {
		t.Fatalf("no session churned: the test did not test churn")
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost/duplicate = %v/%v, want 0", c.lost, c.dup)
	}
	if c.recovered == 0 {
		t.Errorf("recovered = 0 after %v churned sessions: catch-up never fetched what a device missed", churned)
	}
}

// TestMixedGroupLayout: a layout of several sizes, users in several
// groups, on a clean server: the fan-out histogram fills for each size
// class used, and nothing is lost.
func TestMixedGroupLayout(t *testing.T) {
	pc := withCatchUp()
	// About 2,500 deliveries a second: a member of the group of 100 owes
	// 99 per message.
	pc.users, pc.rate = 120, 1
	pc.deadline, pc.lostAfter = 2*time.Second, 6*time.Second
	pc.groups = []config.GroupSpec{{Count: 1, Size: 100}, {Count: 4, Size: 20}, {Count: 20, Size: 5}}
	fx := newFixture(t, refserver.Faults{}, pc)
	fx.soak(2*soakFor, pc.lostAfter)
	c := fx.counts()
	t.Logf("mixed layout: %+v", c)
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost/duplicate = %v/%v, want 0", c.lost, c.dup)
	}
	for class, name := range metrics.SizeClasses[:3] {
		if n, _ := histCount(fx.set.Fanout[class]); n == 0 {
			t.Errorf("fan-out of size class %s observed 0 times, want some", name)
		}
	}
	if n, _ := histCount(fx.set.Fanout[3]); n != 0 {
		t.Errorf("fan-out of size class %s observed %d times, but no group is that large", metrics.SizeClasses[3], n)
	}
}

// TestBehaviourMix: active users, silent users, large-message senders and
// users who keep leaving and rejoining their groups, on a clean server:
// nothing is lost, so nothing was owed to a member who had left (the
// server pushes nothing to one), and no session lags for a group it is
// out of.
func TestBehaviourMix(t *testing.T) {
	pc := withCatchUp()
	pc.users, pc.rate = 40, 0
	pc.deadline, pc.lostAfter = 2*time.Second, 6*time.Second
	pc.behaviours = []config.Behaviour{
		{Name: "active", Share: 0.4, Rate: 10},
		{Name: "silent", Share: 0.3},
		{Name: "large", Share: 0.1, Rate: 2, MessageSize: "4096-16384"},
		{Name: "joiner", Share: 0.2, Rate: 5, MembershipChurn: 700 * time.Millisecond},
	}
	pc.groups = []config.GroupSpec{{Count: 8, Size: 10}}
	fx := newFixture(t, refserver.Faults{}, pc)
	lagging := 0.0
	for range 4 {
		fx.soakStep(soakFor / 2)
		lagging = max(lagging, metrics.Value(fx.set.SessionsLagging))
	}
	fx.soak(0, pc.lostAfter)
	c := fx.counts()
	changes := metrics.Value(fx.set.MembershipChanges)
	t.Logf("behaviour mix: %+v; %v membership changes, left_group %v", c, changes, metrics.Value(fx.set.Ignored[metrics.IgnoredLeftGroup]))
	if changes < 4 {
		t.Fatalf("%v membership changes: the test did not churn membership", changes)
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost/duplicate = %v/%v, want 0", c.lost, c.dup)
	}
	if lagging != 0 {
		t.Errorf("sessions lagging %v, want 0: a member out of a group is owed nothing of it", lagging)
	}
	if c.expected == 0 || c.delivered+c.recovered < c.expected {
		t.Errorf("delivered %v + recovered %v of %v expected, want all", c.delivered, c.recovered, c.expected)
	}
}

// TestDeviceLimitIsConflict: a login past the server's device limit closes
// the user's oldest session, which imcanary classifies as a conflict,
// never as an error or loss.
func TestDeviceLimitIsConflict(t *testing.T) {
	_, ln, stop, wg := startTarget(t, "127.0.0.1:0", refserver.Options{MaxDevices: 1})
	defer func() { stop(); wg.Wait() }()
	drv, err := reference.New(reference.Options{URL: "ws://" + ln.Addr().String() + "/ws", Secret: secret, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	first, err := drv.Connect(context.Background(), "u1", probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- first.Serve(nopHandler{}) }()
	second, err := drv.Connect(context.Background(), "u1", probe.Device{Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	select {
	case err := <-done:
		if r := probe.ReasonOf(err); r != metrics.ReasonConflict {
			t.Errorf("the displaced session ended with %v (reason %s), want reason conflict", err, r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first session was not closed by the second login")
	}
}

// TestPushesInFlightAreNotRecovered: a clean server whose pushes take up to
// a quarter of the deadline, in any pattern, loses and reorders nothing,
// and catch-up must not fetch a push still on its way: a fixed delay
// behind every sync answer, jitter that brings a conversation's messages
// from several senders out of seq order, and both. At a 3 s deadline the
// grace (1 s) is 250 ms past the quarter (750 ms), more than a loaded
// machine's scheduling delays. Each sender's stream is 1 s apart (2 msg/s
// alternating direct and group), more than the jitter, so that the server
// never reorders one sender's messages and any reordered count is false.
func TestPushesInFlightAreNotRecovered(t *testing.T) {
	pc := withCatchUp()
	pc.rate, pc.deadline, pc.lostAfter = 2, 3*time.Second, 6*time.Second
	quarter := pc.deadline / 4
	for _, tt := range []struct {
		name   string
		faults refserver.Faults
	}{
		{"delay", refserver.Faults{Delay: quarter}},
		{"jitter", refserver.Faults{Jitter: quarter}},
		{"delay and jitter", refserver.Faults{Delay: quarter / 2, Jitter: quarter / 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t, tt.faults, pc)
			fx.soak(soakFor, pc.lostAfter)
			c := fx.counts()
			t.Logf("%+v: %+v", tt.faults, c)
			if c.expected < 200 {
				t.Fatalf("expected deliveries = %v, want hundreds", c.expected)
			}
			if c.recovered != 0 || c.lost != 0 || c.reordered != 0 || c.dup != 0 {
				t.Errorf("recovered/lost/reordered/duplicate = %v/%v/%v/%v, want all 0: every push came within a quarter of the deadline",
					c.recovered, c.lost, c.reordered, c.dup)
			}
			if c.delivered != c.expected {
				t.Errorf("delivered %v of %v expected", c.delivered, c.expected)
			}
		})
	}
}

// TestReorderWithCatchUp: a push the server holds back is reordered if it
// comes within the catch-up grace, and otherwise recovered by catch-up and
// then counted as a late push when it does come, never as lost: together
// the two match what the server held back. At 25 msg/s a sender's next
// message releases the held one within 80 ms, under the grace (333 ms); at
// 2 msg/s only after a second, over it. lost_after is past the server's
// 5 s hold, so that the last held pushes arrive while their streams are
// still remembered.
func TestReorderWithCatchUp(t *testing.T) {
	for _, tt := range []struct {
		name  string
		users int
		rate  float64
		// slow is set where the held pushes outlast the grace.
		slow bool
	}{
		{"held within the grace", 20, 25, false},
		{"held past the grace", 80, 2, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const p = 0.05
			pc := withCatchUp()
			pc.users, pc.rate, pc.lostAfter = tt.users, tt.rate, 6*time.Second
			fx := newFixture(t, refserver.Faults{Reorder: p}, pc)
			fx.soak(soakFor, pc.lostAfter)
			c, st := fx.counts(), fx.srv.Stats()
			t.Logf("reorder %v at %v msg/s: %+v; target held %d, released after a later one %d", p, tt.rate, c, st.Held, st.Reordered)
			if st.Held < 20 {
				t.Fatalf("the target held back %d pushes, want at least 20 to judge by", st.Held)
			}
			if !within(c.reordered+c.latePush, float64(st.Held), 0.2) {
				t.Errorf("reordered %v + late push %v, target held back %d: want within 20%%", c.reordered, c.latePush, st.Held)
			}
			if c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
				t.Errorf("lost/dup = %v/%v, delivered %v + recovered %v of %v: a held push costs nothing else", c.lost, c.dup, c.delivered, c.recovered, c.expected)
			}
			// Every recovery here was of a push that came after all.
			if c.recovered != c.latePush {
				t.Errorf("recovered %v, late push %v: want equal, the server pushed every message", c.recovered, c.latePush)
			}
			if tt.slow && c.latePush < c.reordered {
				t.Errorf("late push %v < reordered %v with pushes held past the grace", c.latePush, c.reordered)
			}
			if !tt.slow && c.latePush > 0.2*c.reordered {
				t.Errorf("late push %v, reordered %v with pushes held within the grace: want mostly reordered", c.latePush, c.reordered)
			}
		})
	}
}
