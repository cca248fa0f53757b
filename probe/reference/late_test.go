package reference_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// seqRecorder keeps what one device was pushed and what it fetched, by
// server seq, and counts acks.
type seqRecorder struct {
	mu      sync.Mutex
	pushed  map[uint64]int
	fetched map[uint64]int
	acks    int
}

func newSeqRecorder() *seqRecorder {
	return &seqRecorder{pushed: map[uint64]int{}, fetched: map[uint64]int{}}
}

func (r *seqRecorder) OnAck(uint64, probe.Ack) { r.mu.Lock(); r.acks++; r.mu.Unlock() }
func (r *seqRecorder) OnReject(uint64, string) {}
func (r *seqRecorder) OnDelivery(d *probe.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Recovered {
		r.fetched[d.ServerSeq]++
	} else {
		r.pushed[d.ServerSeq]++
	}
}

// counts returns how many seqs were pushed, fetched and held either way.
func (r *seqRecorder) counts() (pushed, fetched, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[uint64]bool{}
	for s := range r.pushed {
		seen[s] = true
	}
	for s := range r.fetched {
		seen[s] = true
	}
	return len(r.pushed), len(r.fetched), len(seen)
}

// TestLateLoginOfTwoDevices: both devices of a user log in for the first
// time after a group they are in was sent messages, while a device of the
// same process (the sender's) was already in it. The reference server
// hands the offline backlog to one session alone; the user's other device
// has no place in the conversation yet and must still catch up from where
// the process first saw it, not from the newest seq at its login: every
// message reaches both devices, pushed to one and fetched by the other.
// Before the fix the other device took its place at the newest seq and
// never asked for what it had missed, which a soak run counted lost
// (2,160 deliveries of a run with late logins and two devices).
func TestLateLoginOfTwoDevices(t *testing.T) {
	const n = 20
	_, ln, stop, wg := startTarget(t, "127.0.0.1:0", refserver.Options{})
	t.Cleanup(func() { stop(); wg.Wait() })
	drv, err := reference.New(reference.Options{URL: "ws://" + ln.Addr().String() + "/ws", Secret: secret, Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{"a", "b"}, Groups: []probe.Group{{Name: "g", Members: []string{"a", "b"}}}}); err != nil {
		t.Fatal(err)
	}
	const grace = 20 * time.Millisecond
	serve := func(user string) (probe.Session, *seqRecorder) {
		t.Helper()
		s, err := drv.Connect(ctx, user, probe.Device{Catchup: probe.NewCatchup(grace)})
		if err != nil {
			t.Fatalf("connect %s: %v", user, err)
		}
		r := newSeqRecorder()
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Serve(r) }()
		t.Cleanup(func() { _ = s.Close(); <-done })
		return s, r
	}

	// The sender is in the conversation from the start, before anything
	// is sent in it: the answer to the sync its login asked, which comes
	// before its sends' acks, is where the process first saw it.
	a, acks := serve("a")
	for i := range n {
		if err := a.Send(&probe.Message{Ref: uint64(i), Group: "g", Body: []byte(fmt.Sprintf("m%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 5*time.Second, "the sender's acks", func() bool {
		acks.mu.Lock()
		defer acks.mu.Unlock()
		return acks.acks == n
	})

	// b's two devices log in late, together: one gets the backlog.
	var devs [2]probe.Session
	var recs [2]*seqRecorder
	for i := range devs {
		devs[i], recs[i] = serve("b")
	}
	// The engine's sync loop, for a device that lacks something.
	testwait.For(t, 5*time.Second, "both devices hold every message", func() bool {
		all := true
		for i, r := range recs {
			if _, _, held := r.counts(); held < n {
				all = false
				_ = devs[i].(probe.Syncer).Sync()
			}
		}
		if !all {
			time.Sleep(grace)
		}
		return all
	})
	for i, r := range recs {
		pushed, fetched, held := r.counts()
		t.Logf("device %d: pushed %d, fetched %d, held %d of %d", i, pushed, fetched, held, n)
		if pushed+fetched != n {
			t.Errorf("device %d: pushed %d + fetched %d, want %d: each message once", i, pushed, fetched, n)
		}
	}
}
