package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// The dialer tests run in synctest bubbles: synctest.Wait says when every
// connect has gone as far as it can, and idle times pass on a fake clock.

// fakeSession is a Session the dialer tests hand back.
type fakeSession struct{ probe.Session }

func TestDialersBoundConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		d := newDialers(ctx, 4, time.Minute)
		release := make(chan struct{})
		var inFlight, most atomic.Int64
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				s, err := d.do(ctx, func() (probe.Session, error) {
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					<-release
					inFlight.Add(-1)
					return fakeSession{}, nil
				})
				if err != nil || s == nil {
					t.Errorf("do = %v, %v; want a session", s, err)
				}
			})
		}
		// Every connect is now either in a dialer, blocked on release, or
		// waiting for one: a fifth in flight would be now.
		synctest.Wait()
		if n := inFlight.Load(); n != 4 {
			t.Fatalf("%d connects in flight, want 4", n)
		}
		close(release)
		wg.Wait()
		if m := most.Load(); m != 4 {
			t.Errorf("at most %d connects in flight, want 4 (the pool's size)", m)
		}
		if r := d.running(); r != 4 {
			t.Errorf("%d dialers running after the burst, want 4 kept for the next", r)
		}
		cancel()
		d.wait()
		if r := d.running(); r != 0 {
			t.Errorf("%d dialers running after the population ended, want 0", r)
		}
	})
}

// Connects one after another reuse the dialers, whose stacks have grown
// once, and an idle pool empties itself. A connect may start a second
// dialer while the first is between handing its result over and waiting
// for more; never a third, as one of the two is always waiting.
func TestDialersReuseAndIdleExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		d := newDialers(ctx, 8, 50*time.Millisecond)
		errBoom := errors.New("boom")
		for i := range 100 {
			_, err := d.do(ctx, func() (probe.Session, error) { return nil, errBoom })
			if !errors.Is(err, errBoom) {
				t.Fatalf("connect %d: err = %v, want the driver's", i, err)
			}
			if r := d.running(); r > 2 {
				t.Fatalf("connect %d: %d dialers running, want at most 2 reused", i, r)
			}
		}
		// Past the idle time, on the bubble's clock.
		time.Sleep(time.Second)
		synctest.Wait()
		if r := d.running(); r > 0 {
			t.Fatalf("%d dialers still running long after their idle time", r)
		}
		d.wait()
	})
}

// A connect waiting for a dialer gives up when its context ends.
func TestDialersWaitingConnectCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		d := newDialers(ctx, 1, time.Minute)
		release := make(chan struct{})
		busy := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _ = d.do(ctx, func() (probe.Session, error) { close(busy); <-release; return nil, nil })
		})
		<-busy
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer wcancel()
		if _, err := d.do(wctx, func() (probe.Session, error) { t.Error("ran a cancelled connect"); return nil, nil }); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want the waiting connect's deadline", err)
		}
		close(release)
		wg.Wait()
		cancel()
		d.wait()
	})
}
