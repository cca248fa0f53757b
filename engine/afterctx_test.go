package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// afterCtx runs exactly one of its two callbacks: f after the delay if the
// context is still live, cancelled if the context ends first, and never
// both, whichever way the race between them goes.
func TestAfterCtx(t *testing.T) {
	for _, tt := range []struct {
		name          string
		delay, cancel time.Duration
		wantF         bool
	}{
		{"delay first", time.Second, 2 * time.Second, true},
		{"context first", 2 * time.Second, time.Second, false},
		{"same instant", time.Second, time.Second, false},
		{"no delay", 0, time.Second, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var f, c atomic.Int32
				var fAt time.Time
				start := time.Now()
				afterCtx(ctx, tt.delay, func() { f.Add(1); fAt = time.Now() }, func() { c.Add(1) })
				time.AfterFunc(tt.cancel, cancel)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if n, m := f.Load(), c.Load(); n+m != 1 {
					t.Fatalf("f ran %d times and cancelled %d, want exactly one of them once", n, m)
				}
				if tt.name == "same instant" {
					return // either may win; one, once, is the point
				}
				if got := f.Load() == 1; got != tt.wantF {
					t.Errorf("f ran: %v, want %v", got, tt.wantF)
				}
				if tt.wantF && fAt.Sub(start) != tt.delay {
					t.Errorf("f ran after %v, want %v", fAt.Sub(start), tt.delay)
				}
			})
		})
	}
}
