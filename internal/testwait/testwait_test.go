package testwait

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records a Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestForHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			time.Sleep(time.Millisecond)
			n.Add(1)
		}
	}()
	f := &fakeTB{TB: t}
	For(f, time.Minute, "three ticks", func() bool { return n.Load() == 3 })
	if f.failed != "" {
		t.Errorf("For failed on a condition that came true: %s", f.failed)
	}
}

func TestForTimesOut(t *testing.T) {
	f := &fakeTB{TB: t}
	calls := 0
	For(f, 20*time.Millisecond, "nothing", func() bool {
		calls++
		// The fake Fatalf returns: true once For has given up, so that
		// For returns too.
		return f.failed != ""
	})
	if want := "timed out after 20ms waiting for nothing"; f.failed != want || calls < 2 {
		t.Errorf("For on a condition never true: failed %q after %d polls; want %q", f.failed, calls, want)
	}
}

type sweeps struct {
	sending bool
	n       int
	// acks is how many sweeps pass before the sends in flight are
	// acked.
	acks int
}

func (s *sweeps) SetSending(on bool)  { s.sending = on }
func (s *sweeps) Sweep(now time.Time) { s.n++ }
func (s *sweeps) Inflight() int {
	if s.n < s.acks {
		return 1
	}
	return 0
}

// Settle stops sending, sweeps until the condition holds, and reports
// whether it did before the limit.
func TestSettle(t *testing.T) {
	s := &sweeps{sending: true}
	if !Settle(s, 0, time.Second, func() bool { return s.n >= 3 }) {
		t.Fatal("Settle = false with a condition that holds after three sweeps")
	}
	if s.sending || s.n < 3 {
		t.Errorf("after Settle: sending %v, %d sweeps; want stopped, at least 3", s.sending, s.n)
	}
	if Settle(s, 0, 20*time.Millisecond, func() bool { return false }) {
		t.Error("Settle = true with a condition that never holds")
	}
}

// A settle waits for the acks in flight, even when every delivery owed so
// far is accounted for: each ack may make more owed.
func TestSettleWaitsForAcks(t *testing.T) {
	s := &sweeps{sending: true, acks: 5}
	if !Settle(s, 0, time.Minute, func() bool { return true }) {
		t.Fatal("Settle = false once the acks came")
	}
	if s.n < s.acks {
		t.Errorf("Settle returned after %d sweeps with a send in flight until sweep %d", s.n, s.acks)
	}
	s = &sweeps{sending: true, acks: 1 << 30}
	if Settle(s, 0, 20*time.Millisecond, func() bool { return true }) {
		t.Error("Settle = true with a send in flight throughout")
	}
}
