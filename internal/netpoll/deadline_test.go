//go:build linux

package netpoll

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// runs records when a Handle's ready ran and what its deadline was then.
type runs struct {
	mu sync.Mutex
	at []int64
	// deadline is the Handle's deadline at each run.
	deadline []int64
	ran      chan struct{}
}

func newRuns() *runs { return &runs{ran: make(chan struct{}, 1)} }

func (r *runs) record(h **Handle) func() {
	return func() {
		now := time.Now().UnixNano()
		r.mu.Lock()
		r.at = append(r.at, now)
		r.deadline = append(r.deadline, (*h).Deadline())
		r.mu.Unlock()
		select {
		case r.ran <- struct{}{}:
		default:
		}
	}
}

func (r *runs) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

func (r *runs) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: ready never ran", what)
	}
}

// addTimed registers a socket that never receives data, so that every
// run of its ready is a deadline's.
func addTimed(t *testing.T, p *Poller) (*Handle, *runs) {
	t.Helper()
	_, server := pair(t)
	r := newRuns()
	var h *Handle
	var err error
	h, err = p.Add(server, ReadyFunc(r.record(&h)))
	if err != nil {
		t.Fatal(err)
	}
	return h, r
}

// after waits until the clock has gone past at: a Handle whose deadline
// is at runs, and the clock wakes in the order of deadlines.
func after(t *testing.T, p *Poller, at int64) {
	t.Helper()
	h, r := addTimed(t, p)
	defer h.Remove()
	h.SetDeadline(at)
	r.wait(t, "the marker deadline")
}

func TestDeadlineWakesOnceAfterIt(t *testing.T) {
	p := startPoller(t)
	h, r := addTimed(t, p)
	d := time.Now().Add(30 * time.Millisecond).UnixNano()
	h.SetDeadline(d)
	r.wait(t, "deadline")
	after(t, p, time.Now().Add(50*time.Millisecond).UnixNano())
	r.onceAfter(t, d)
}

// onceAfter checks that ready ran once, not before d, and saw d.
func (r *runs) onceAfter(t *testing.T, d int64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) != 1 {
		t.Fatalf("ready ran %d times for one deadline", len(r.at))
	}
	if r.at[0] < d {
		t.Errorf("ready ran %v before the deadline", time.Duration(d-r.at[0]))
	}
	if r.deadline[0] != d {
		t.Errorf("ready saw deadline %d, want %d", r.deadline[0], d)
	}
}

// TestDeadlineMovedLater: a deadline moved on by every frame wakes once,
// after the last one, and the clock holds a bounded number of entries
// however often it moved.
func TestDeadlineMovedLater(t *testing.T) {
	p := startPoller(t)
	h, r := addTimed(t, p)
	var last int64
	// 200 ms ahead: a loaded machine's pause between two moves longer
	// than that would let one pass, and that is two deadlines.
	for range 20 {
		last = time.Now().Add(200 * time.Millisecond).UnixNano()
		h.SetDeadline(last)
		if n := p.scheduled(); n > 2 {
			t.Fatalf("%d entries on the clock for one handle", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.wait(t, "moved deadline")
	after(t, p, time.Now().Add(30*time.Millisecond).UnixNano())
	r.onceAfter(t, last)
}

func TestDeadlineBroughtForward(t *testing.T) {
	p := startPoller(t)
	h, r := addTimed(t, p)
	h.SetDeadline(time.Now().Add(time.Hour).UnixNano())
	d := time.Now().Add(20 * time.Millisecond).UnixNano()
	h.SetDeadline(d)
	r.wait(t, "deadline brought forward")
	r.mu.Lock()
	if r.at[0] < d {
		t.Errorf("ready ran %v before the deadline", time.Duration(d-r.at[0]))
	}
	r.mu.Unlock()
	// A deadline set again after one has passed is kept.
	d2 := time.Now().Add(20 * time.Millisecond).UnixNano()
	h.SetDeadline(d2)
	r.wait(t, "second deadline")
	if n := r.count(); n != 2 {
		t.Errorf("ready ran %d times for two deadlines", n)
	}
}

func TestDeadlineClearedOrRemoved(t *testing.T) {
	p := startPoller(t)
	cleared, rc := addTimed(t, p)
	removed, rr := addTimed(t, p)
	d := time.Now().Add(20 * time.Millisecond).UnixNano()
	cleared.SetDeadline(d)
	cleared.SetDeadline(0)
	removed.SetDeadline(d)
	removed.Remove()
	after(t, p, d+int64(30*time.Millisecond))
	if n := rc.count(); n != 0 {
		t.Errorf("a cleared deadline ran ready %d times", n)
	}
	if n := rr.count(); n != 0 {
		t.Errorf("a removed handle's deadline ran ready %d times", n)
	}
	if n := p.scheduled(); n != 0 {
		t.Errorf("%d entries left on the clock", n)
	}
}

// TestDeadlinesManyInOrder: handles with deadlines spread over a window,
// some moved later and some brought forward while waiting, each run once
// and never before its deadline.
func TestDeadlinesManyInOrder(t *testing.T) {
	p := startPoller(t)
	const n = 200
	rng := rand.New(rand.NewPCG(1, 2))
	hs := make([]*Handle, n)
	rs := make([]*runs, n)
	want := make([]int64, n)
	for i := range n {
		hs[i], rs[i] = addTimed(t, p)
	}
	// Set after the sockets are made, which takes longer than the
	// window: a deadline passed before it is moved is two deadlines.
	base := time.Now().Add(300 * time.Millisecond).UnixNano()
	for i := range n {
		want[i] = base + rng.Int64N(int64(100*time.Millisecond))
		hs[i].SetDeadline(want[i])
	}
	for i := 0; i < n; i += 3 {
		want[i] += int64(50 * time.Millisecond)
		hs[i].SetDeadline(want[i])
	}
	for i := 1; i < n; i += 5 {
		want[i] = base
		hs[i].SetDeadline(want[i])
	}
	for i := range n {
		rs[i].wait(t, "deadline")
	}
	after(t, p, base+int64(200*time.Millisecond))
	for i := range n {
		r := rs[i]
		r.mu.Lock()
		if len(r.at) != 1 {
			t.Errorf("handle %d: ready ran %d times", i, len(r.at))
		} else if r.at[0] < want[i] {
			t.Errorf("handle %d: ready ran %v before its deadline", i, time.Duration(want[i]-r.at[0]))
		}
		r.mu.Unlock()
	}
	if s := p.scheduled(); s != 0 {
		t.Errorf("%d entries left on the clock", s)
	}
}

func TestDeadlineAfterClose(t *testing.T) {
	p := startPoller(t)
	h, r := addTimed(t, p)
	h.SetDeadline(time.Now().Add(time.Hour).UnixNano())
	p.Close()
	h.SetDeadline(time.Now().UnixNano())
	if s := p.scheduled(); s != 0 {
		t.Errorf("%d entries on a closed Poller's clock", s)
	}
	time.Sleep(30 * time.Millisecond)
	if n := r.count(); n != 0 {
		t.Errorf("ready ran %d times after Close", n)
	}
}

func TestDueQueueOrders(t *testing.T) {
	var q dueQueue
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		q.push(due{at: rng.Int64N(1000)})
	}
	prev := int64(-1)
	for len(q) > 0 {
		e := q.pop()
		if e.at < prev {
			t.Fatalf("popped %d after %d", e.at, prev)
		}
		prev = e.at
	}
}
