package engine

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A pause is a barrier: SetSending(false) returns only when no send is
// under way, so that a drain which reads the counts after it cannot miss a
// message whose write was still going on (its ack, and the deliveries it
// makes owed, would come after the counts said everything was accounted).
func TestPauseWaitsForSendsUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newMemServer()
		r := runMem(t, srv)
		stall := make(chan struct{})
		srv.stall.Store(&stall)
		for srv.stalled.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		var paused atomic.Bool
		go func() {
			r.pop.SetSending(false)
			paused.Store(true)
		}()
		time.Sleep(time.Second)
		synctest.Wait()
		if paused.Load() {
			t.Errorf("SetSending(false) returned with %d sends held in their write", srv.stalled.Load())
		}
		srv.stall.Store(nil)
		close(stall)
		time.Sleep(10 * time.Millisecond) // the pause looks again each 1 ms
		synctest.Wait()
		if !paused.Load() {
			t.Fatal("SetSending(false) still waiting after the held sends were written")
		}
		routed := srv.routed.Load()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := srv.routed.Load(); n != routed {
			t.Errorf("%d sends after the pause returned, want none", n-routed)
		}
		if n := r.pop.Inflight(); n != 0 {
			t.Errorf("%d sends await their ack after a pause and 2s, want none", n)
		}
		c := r.totals()
		if c.expected == 0 || c.delivered != c.expected {
			t.Errorf("%+v: want every owed delivery delivered", c)
		}
	})
}
