package engine

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Behaviour mixes and group membership churn. A population may be a mix of
// classes of users (config.Behaviour), each with its own send rate, message
// sizes and pace of leaving and rejoining its groups. Who is owed a group
// message then changes while the population runs: the ledger owes it to
// the members at the moment the server accepted it, and a message the
// server acknowledged during a membership change, or within a deadline
// after the server confirmed the change, is not judged either way for the
// member that changed (counted as ignored, left_group, if it arrives).

// class is one behaviour class as the population runs it.
type class struct {
	name         string
	interval     int64 // ns between sends; 0 sends nothing
	minSize      int
	maxSize      int
	churn        time.Duration
	sizesAreMine bool // false: the population's MessageSize
}

// classes turns a validated mix into the classes the users are spread over.
func classesOf(mix []config.Behaviour) ([]class, error) {
	var out []class
	for _, b := range mix {
		lo, hi, err := config.ParseSize(b.MessageSize)
		if err != nil {
			return nil, fmt.Errorf("behaviour %s: message_size %q: %w", b.Name, b.MessageSize, err)
		}
		c := class{name: b.Name, minSize: lo, maxSize: hi, churn: b.MembershipChurn, sizesAreMine: b.MessageSize != ""}
		if b.Rate > 0 {
			c.interval = int64(float64(time.Second) / b.Rate)
		}
		out = append(out, c)
	}
	return out, nil
}

// classOf picks user i's class: the fractional parts of i·φ spread the
// users over the shares evenly and interleaved, so that a group laid out
// over consecutive users gets each class in its share rather than all of
// one.
func classOf(i int, mix []config.Behaviour) int {
	x := math.Mod(float64(i)*(math.Sqrt(5)-1)/2, 1)
	sum := 0.0
	for c, b := range mix {
		if sum += b.Share; x < sum {
			return c
		}
	}
	return len(mix) - 1
}

// bodySize returns the size to pad u's next message to.
func (p *Population) bodySize(u *user) int {
	if u.class < 0 || !p.classes[u.class].sizesAreMine {
		return p.opts.MessageSize
	}
	c := p.classes[u.class]
	if c.maxSize > c.minSize {
		return c.minSize + rand.IntN(c.maxSize-c.minSize+1)
	}
	return c.minSize
}

// groupState is who is in one group right now. Members are by position
// in the group's planned member list.
type groupState struct {
	idx     int
	members []int // user indices
	present []atomic.Bool
	// changeStart and changeDone (Unix ns) bound each member's last
	// change: from when it was asked of the server until the server
	// confirmed it. 0: never changed.
	changeStart, changeDone []atomic.Int64
}

func newGroupState(idx int, members []int) *groupState {
	g := &groupState{idx: idx, members: members, present: make([]atomic.Bool, len(members)),
		changeStart: make([]atomic.Int64, len(members)), changeDone: make([]atomic.Int64, len(members))}
	for i := range g.present {
		g.present[i].Store(true)
	}
	return g
}

// Membership of a member at a moment, as the ledger judges it.
type membership int

const (
	member   membership = iota // owed the message
	outsider                   // not in the group: not owed
	inFlux                     // within a change's window: not judged
)

// at judges member pos for a message in flight from sentAt until ackAt
// (Unix ns): the server accepted it somewhere in between, and may fan it
// out up to a deadline later. A change whose window, from when it was asked
// of the server until a deadline after the server confirmed it, overlaps
// that flight leaves the member in flux. So does a change that began after
// ackAt: the judgement races it, and the presence read may already be the
// change's.
//
// Presence is read before the change's bounds: toggleMembership stores a
// change's start before its new presence, so a new presence read here
// comes with its own start (or a later change's), never with the previous
// change's bounds alone.
func (g *groupState) at(pos int, sentAt, ackAt, deadline int64) membership {
	present := g.present[pos].Load()
	start, done := g.changeStart[pos].Load(), g.changeDone[pos].Load()
	if start != 0 && (done == 0 || sentAt <= done+deadline) {
		return inFlux
	}
	if present {
		return member
	}
	return outsider
}

// settled reports whether member pos is in the group and out of any
// change's window at now: only then is a delivery's lag its server's.
func (g *groupState) settled(pos int, now, deadline int64) bool {
	return g.at(pos, now, now, deadline) == member
}

// oweGroup counts what the ack of seq on the group stream st owes, by
// cohort, and tells each recipient device not owed it (an outsider, or a
// member in flux that has not had it yet) that the seq is not its to
// miss. Without membership churn every member is owed, at no cost.
func (p *Population) oweGroup(st *sendStream, seq uint64, intended, sentAt, ackAt int64) (normal, slow int) {
	if !p.churn {
		return int(st.fanout - st.slowFanout), int(st.slowFanout)
	}
	deadline := int64(p.opts.Deadline)
	g := st.grp
	for r, pos := range st.recipients() {
		ru := p.users[r]
		judged := g.at(pos, sentAt, ackAt, deadline)
		for _, dev := range ru.devices {
			owed := judged == member
			if judged != member && !dev.inbox.Excuse(st.key, st.kind, seq, intended) {
				// In flux and already delivered: owed after all,
				// so that what was delivered was expected.
				owed = judged == inFlux
			}
			switch {
			case !owed:
			case ru.slow:
				slow++
			default:
				normal++
			}
		}
	}
	// The sender's other devices, where the server mirrors: the sender
	// is in the group, since it sends to it.
	return normal + int(st.mirrored), slow
}

// membershipEvent is a user's next leave or rejoin.
type membershipEvent struct {
	u  *user
	at int64
}

type eventHeap []membershipEvent

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(membershipEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// regroup runs the membership churn until ctx ends: each user of a class
// with churn leaves one of its groups after a random time of the class's
// mean, and rejoins it after another. One goroutine for all, on a heap of
// the next events, like the senders.
func (p *Population) regroup(ctx context.Context) {
	rg := p.opts.Driver.(probe.Regrouper)
	var h eventHeap
	now := time.Now().UnixNano()
	for _, u := range p.users {
		if u.class >= 0 && p.classes[u.class].churn > 0 && len(u.groups) > 0 {
			h = append(h, membershipEvent{u: u, at: now + p.churnDelay(u)})
		}
	}
	heap.Init(&h)
	if len(h) == 0 {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		e := h[0]
		if !waitUntil(ctx, timer, e.at) {
			return
		}
		if p.ready.Load() {
			p.toggleMembership(ctx, rg, e.u)
		}
		h[0].at = time.Now().UnixNano() + p.churnDelay(e.u)
		heap.Fix(&h, 0)
	}
}

func (p *Population) churnDelay(u *user) int64 {
	return int64(rand.ExpFloat64()*float64(p.classes[u.class].churn)) + 1
}

// toggleMembership has u leave one of its groups, or rejoin the one it
// left. SetMembers sends the group's whole member list, so a change that
// succeeds confirms every member of the group; one that fails leaves what
// the server did unknown, and the member in flux until a later change of
// the group succeeds. The user's next event retries it.
func (p *Population) toggleMembership(ctx context.Context, rg probe.Regrouper, u *user) {
	st := u.groups[rand.IntN(len(u.groups))]
	if u.outOf != nil {
		st = u.outOf
	}
	g, pos := st.grp, st.pos
	join := !g.present[pos].Load()
	// In this order: at reads them in the reverse one.
	g.changeDone[pos].Store(0)
	g.changeStart[pos].Store(time.Now().UnixNano())
	g.present[pos].Store(join)
	cctx, cancel := context.WithTimeout(ctx, p.opts.Deadline)
	err := rg.SetMembers(cctx, p.groupNow(g))
	cancel()
	p.opts.Set.MembershipChanges.Inc()
	if err != nil {
		// The member's sends and the lag sweep go by its last known
		// presence; the ledger owes it nothing while in flux.
		g.present[pos].Store(!join)
		u.outOf = st
		p.log.Warn("membership change failed", "user", u.name, "group", p.groups[g.idx].Name, "join", join, "err", err)
		return
	}
	if join {
		u.outOf = nil
	} else {
		u.outOf = st
	}
	now := time.Now().UnixNano()
	for i := range g.members {
		if g.changeStart[i].Load() != 0 && g.changeDone[i].Load() == 0 {
			g.changeDone[i].Store(now)
		}
	}
}

// groupNow is group g with its present members.
func (p *Population) groupNow(g *groupState) probe.Group {
	grp := probe.Group{Name: p.groups[g.idx].Name}
	for i, m := range g.members {
		if g.present[i].Load() {
			grp.Members = append(grp.Members, p.users[m].name)
		}
	}
	return grp
}

// inGroup reports whether u is in the group of st now, for the sender: a
// user does not send to a group it has left.
func (st *sendStream) inGroup() bool {
	return st.grp == nil || st.grp.present[st.pos].Load()
}
