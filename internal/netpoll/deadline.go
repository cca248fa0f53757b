//go:build linux

package netpoll

import (
	"sync"
	"time"

	"github.com/imcanary/imcanary/internal/minheap"
)

// Deadlines: a Handle may ask to be woken at a time with nothing to read
// (a connection silent for too long is dead). A timer per connection
// costs a runtime timer, its closure and a reset or a wake-up each time
// the deadline moves; one clock per Poller costs an entry in a heap. The
// deadline moves with every frame, so moving it later is a store: the
// clock looks at it when the time it was scheduled for comes, and
// schedules it again if it moved. Only an earlier deadline (a close's
// grace) takes the clock's lock.

// lateBy is the least time between two runs of the clock: a deadline is
// met up to this late, and a Poller whose sessions' deadlines are spread
// over time wakes at most 1/lateBy times a second for them, not once a
// deadline.
const lateBy = 10 * time.Millisecond

// clock is a Poller's schedule of deadlines.
type clock struct {
	mu sync.Mutex
	q  dueQueue
	// t runs tick; armed is when it is set to run (Unix ns), 0 when it
	// is not.
	t     *time.Timer
	armed int64
	// stopped: Close has stopped the clock; deadlines are not kept.
	stopped bool
}

// due is a Handle scheduled at a time. An entry whose time is no longer
// its Handle's (a deadline brought forward was scheduled again) is stale
// and skipped.
type due struct {
	at int64
	h  *Handle
}

// dueQueue is a min-heap of due by time (see minheap).
type dueQueue []due

func dueLess(a, b due) bool { return a.at < b.at }

func (q *dueQueue) push(e due) { *q = minheap.Push(*q, e, dueLess) }

func (q *dueQueue) pop() (e due) {
	e, *q = minheap.Pop(*q, dueLess)
	return e
}

// SetDeadline has the Poller run ready once at (Unix ns) has passed,
// unless the deadline is moved later first; 0 takes it away. ready itself
// tells a deadline from data (compare Deadline with the time): the Poller
// runs it the same way for both. A deadline is met up to about 10 ms
// late. Moving it later is a store, cheap enough for every frame.
func (h *Handle) SetDeadline(at int64) {
	h.deadline.Store(at)
	if at == 0 {
		return
	}
	if s := h.sched.Load(); s != 0 && s <= at {
		// The clock comes at s, finds the deadline moved and
		// schedules it again.
		return
	}
	h.p.clock.schedule(h, at)
}

// Deadline is the deadline last set, 0 for none.
func (h *Handle) Deadline() int64 { return h.deadline.Load() }

// schedule puts h on the clock at at, unless it is there earlier.
func (c *clock) schedule(h *Handle, at int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || h.removed.Load() {
		return
	}
	if s := h.sched.Load(); s != 0 && s <= at {
		return
	}
	h.sched.Store(at)
	c.q.push(due{at: at, h: h})
	c.armLocked(at, time.Now().UnixNano())
}

// armLocked has tick run at at, if that is before it is set to.
func (c *clock) armLocked(at, now int64) {
	if c.armed != 0 && c.armed <= at {
		return
	}
	c.armed = at
	c.t.Reset(time.Duration(max(at-now, 0)))
}

// tick wakes the Handles whose deadlines have passed, schedules again
// those whose deadlines moved, and sets the timer for the next.
func (c *clock) tick() {
	now := time.Now().UnixNano()
	var wake []*Handle
	c.mu.Lock()
	c.armed = 0
	for len(c.q) > 0 && c.q[0].at <= now {
		e := c.q.pop()
		h := e.h
		if h.sched.Load() != e.at || h.removed.Load() {
			continue // stale, or gone
		}
		// Unscheduled before the deadline is read: a SetDeadline that
		// stores after this load sees sched 0 and schedules itself.
		h.sched.Store(0)
		switch d := h.deadline.Load(); {
		case d == 0:
		case d > now:
			h.sched.Store(d)
			c.q.push(due{at: d, h: h})
		default:
			wake = append(wake, h)
		}
	}
	if len(c.q) > 0 && !c.stopped {
		c.armLocked(max(c.q[0].at, now+int64(lateBy)), now)
	}
	if len(c.q) == 0 {
		// A burst of sessions gone leaves a large array behind.
		c.q = nil
	}
	c.mu.Unlock()
	for _, h := range wake {
		h.fire()
	}
}

// init makes the clock's timer, stopped.
func (c *clock) init() {
	c.t = time.AfterFunc(time.Hour, c.tick)
	c.t.Stop()
}

// stop ends the clock: deadlines set from now on are not kept.
func (c *clock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.t.Stop()
	c.q = nil
}

// scheduled is the number of deadlines on the clock, stale entries
// included: memory the clock holds.
func (p *Poller) scheduled() int {
	p.clock.mu.Lock()
	defer p.clock.mu.Unlock()
	return len(p.clock.q)
}
