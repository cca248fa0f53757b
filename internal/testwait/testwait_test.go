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
