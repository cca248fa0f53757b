package probetest

import (
	"testing"
	"time"

	"github.com/imcanary/imcanary/engine"
)

// WaitReady waits until pop has been online whole, and fails tb when no
// session came online for stall or when limit has passed. A server whose
// logins are slow on a loaded machine (a password hash each) is given the
// time its own pace needs, while one that stopped logging users in fails
// within stall; stall must exceed the population's longest backoff, the
// longest a failed login waits before it tries again. Provisioning, in
// which no session logs in (Tinode hashes a password for each account it
// makes), counts as progress: it is bounded by limit alone.
func WaitReady(tb testing.TB, pop *engine.Population, wanted int, stall, limit time.Duration) {
	tb.Helper()
	began := time.Now()
	best, last := pop.Online(), began
	for !pop.Ready() {
		now := time.Now()
		if n := pop.Online(); n > best || !pop.Provisioned() {
			best, last = max(best, n), now
		}
		switch {
		case now.Sub(last) > stall:
			tb.Fatalf("population not online: %d of %d sessions, and none more for %v (%v since the start)", pop.Online(), wanted, stall, now.Sub(began).Round(time.Millisecond))
		case now.Sub(began) > limit:
			tb.Fatalf("population not online after %v: %d of %d sessions, still coming online", limit, pop.Online(), wanted)
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Logf("population online (%d sessions) in %v", wanted, time.Since(began).Round(time.Millisecond))
}
