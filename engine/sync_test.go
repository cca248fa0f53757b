package engine

import (
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// syncCounter is an idle session that counts the syncs asked of it.
type syncCounter struct {
	idleSession
	n int
}

func (s *syncCounter) Sync() error { s.n++; return nil }

// TestSyncOnlyWhatIsOwed: a periodic sync goes only to a device that
// something may be missing from, so an idle population costs its heartbeat
// and nothing more; and it still goes to one whose server acknowledged a
// message the device has not had (a trailing gap no later push reveals) or
// that has a gap open.
func TestSyncOnlyWhatIsOwed(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p, _ := lagPop(t, t0, 0)
	dev0 := p.users[0].devices[0] // receives user 1's direct stream
	dev0.catchup = probe.NewCatchup(time.Second)
	sess := &syncCounter{}
	syncs := func() int {
		sess.n = 0
		for range 10 {
			_ = p.syncSession(dev0, sess)
		}
		return sess.n
	}
	if n := syncs(); n != 0 {
		t.Fatalf("%d syncs of an idle device, want none: nothing is owed to it", n)
	}
	st := p.users[1].direct
	ack(p, st, 1, t0)
	if n := syncs(); n != 10 {
		t.Errorf("%d of 10 syncs with seq 1 acknowledged and not received, want every one", n)
	}
	deliver(p, st, 1, t0, t0.Add(10*time.Millisecond))
	if n := syncs(); n != 0 {
		t.Errorf("%d syncs once seq 1 arrived, want none", n)
	}
	// A gap revealed by a later push is fetched when an answer's frame
	// comes: the sync keeps that clock going while it is open.
	dev0.catchup.Got([]byte("d.p-u1"), 1, t0.UnixNano())
	dev0.catchup.Got([]byte("d.p-u1"), 3, t0.UnixNano())
	if n := syncs(); n != 10 {
		t.Errorf("%d of 10 syncs with a gap open, want every one", n)
	}
	// A session whose protocol cannot sync is never asked.
	if err := p.syncSession(dev0, idleSession{}); err != nil {
		t.Errorf("sync of a session without Sync: %v", err)
	}
}
