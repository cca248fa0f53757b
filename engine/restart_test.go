package engine

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// TestMemRestart kills the server under a population and brings it back:
// every session ends as the server's close and comes back with backoff,
// sends during the outage are skipped (counted offline, never expected),
// and what is lost is exactly what the dead server held: the deliveries it
// was delaying when it died. Nothing is counted twice, and a clean stretch
// after the restart loses nothing more. The bubble's end proves that no
// goroutine of the outage outlives the population.
func TestMemRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newMemServer()
		// Every third delivery is held 400 ms, under the deadline: at the
		// kill, a known number is in flight.
		srv.setFaults(every(3, memFault{delay: 400 * time.Millisecond}))
		r := runMem(t, srv)
		time.Sleep(3 * time.Second)

		srv.kill()
		synctest.Wait()
		if n := r.pop.Online(); n != 0 {
			t.Fatalf("%d sessions online after the kill, want 0", n)
		}
		if n := metrics.Value(r.set.Disconnects[metrics.ReasonServerClose]); n != memUsers {
			t.Errorf("server_close disconnects = %v, want one per user (%d)", n, memUsers)
		}
		expected := r.totals().expected
		offline0, fail0 := metrics.Value(r.set.SendErrors[metrics.SendOffline]), metrics.Value(r.set.ConnectFail)
		time.Sleep(2 * time.Second)
		if n := metrics.Value(r.set.SendErrors[metrics.SendOffline]) - offline0; n == 0 {
			t.Error("no sends counted offline during the outage")
		}
		if n := metrics.Value(r.set.ConnectFail) - fail0; n == 0 {
			t.Error("no failed connects counted during the outage")
		}
		if n := r.totals().expected; n != expected {
			t.Errorf("expected grew from %v to %v while the server was down: a skipped send is owed to nobody", expected, n)
		}

		srv.setFaults(nil)
		srv.revive()
		began := time.Now()
		for r.pop.Online() < memUsers && time.Since(began) < 5*time.Second {
			time.Sleep(10 * time.Millisecond)
		}
		if n := r.pop.Online(); n != memUsers {
			t.Fatalf("%d of %d sessions back 5 s after the server", n, memUsers)
		}
		t.Logf("every session back %v after the server", time.Since(began))
		// Later messages of every stream reveal the gaps the dead server
		// left.
		time.Sleep(5 * time.Second)
		c := r.settle()
		discarded := srv.discarded.Load()
		t.Logf("%+v; server discarded %d", c, discarded)
		if discarded == 0 {
			t.Fatal("the kill discarded nothing: the test must kill with deliveries in flight")
		}
		if c.lost != float64(discarded) || c.delivered+c.lost != c.expected {
			t.Errorf("lost %v, delivered %v, expected %v: want exactly the %d the dead server discarded lost, the rest delivered",
				c.lost, c.delivered, c.expected, discarded)
		}
		if c.dup+c.unowed+c.reordered+c.late != 0 {
			t.Errorf("%+v: want no duplicate, unowed, reordered or late delivery across a restart", c)
		}

		// Losses are final: a clean stretch after the restart adds none.
		r.pop.SetSending(true)
		time.Sleep(5 * time.Second)
		again := r.settle()
		if again.lost != c.lost || again.delivered <= c.delivered || again.delivered+again.lost != again.expected {
			t.Errorf("after a clean stretch: %+v, before %+v; want new deliveries, all of them, and no new loss", again, c)
		}
	})
}
