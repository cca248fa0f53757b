package engine

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Open-loop sending: each user's next intended send time on a heap per
// sender goroutine, and the messages written on a user's streams.

// userHeap orders a sender's users by their next intended send time.
type userHeap []*user

func (h userHeap) Len() int           { return len(h) }
func (h userHeap) Less(i, j int) bool { return h[i].next < h[j].next }
func (h userHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *userHeap) Push(x any)        { *h = append(*h, x.(*user)) }
func (h *userHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	*h = old[:len(old)-1]
	return u
}

// sender sends for every user with idx%shards == shard, each at its own
// open-loop schedule: intended times advance by 1/rate whatever the server
// does, and each message carries its intended time.
func (p *Population) sender(ctx context.Context, shard, shards int, start time.Time) {
	o := p.opts
	var h userHeap
	for i := shard; i < len(p.users); i += shards {
		u := p.users[i]
		if (u.direct == nil && len(u.groups) == 0) || u.slow || u.interval == 0 {
			continue
		}
		// First send: after the user's ramp slot, at a random phase, so
		// that users do not send in lockstep.
		u.next = start.UnixNano() + int64(o.Ramp)*int64(int(u.idx)-p.Slice().Lo)/int64(p.localUsers()) + rand.Int64N(u.interval) + 1
		h = append(h, u)
	}
	heap.Init(&h)
	if len(h) == 0 {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var buf []byte
	for {
		u := h[0]
		if !waitUntil(ctx, timer, u.next) {
			return
		}
		p.sending.Add(1)
		if !p.paused.Load() && (p.ready.Load() || u.next > p.holdUntil.Load()) {
			if h := o.Health; h != nil {
				h.SendLag(time.Duration(time.Now().UnixNano() - u.next))
			}
			buf = p.send(u, u.next, buf)
		}
		p.sending.Add(-1)
		u.next += u.interval
		heap.Fix(&h, 0)
	}
}

// send writes one message of u with the given intended time, alternating
// direct and group, and taking the user's groups in turn. buf is scratch
// space, returned for reuse.
func (p *Population) send(u *user, intended int64, buf []byte) []byte {
	u.mu.Lock()
	st := u.direct
	if len(u.groups) > 0 && (u.toggle || st == nil) {
		// Not to a group the user has left: the server would refuse
		// it, and rightly.
		for range len(u.groups) {
			g := u.groups[int(u.groupTurn)%len(u.groups)]
			u.groupTurn = uint32((int(u.groupTurn) + 1) % len(u.groups))
			if g.inGroup() {
				st = g
				break
			}
		}
	}
	u.toggle = !u.toggle
	if st == nil {
		u.mu.Unlock()
		return buf
	}
	buf, _, _ = p.sendOn(u, st, intended, buf)
	return buf
}

// errOffline is SendNow's error for a user without a session.
var errOffline = errors.New("sender offline")

// SendCross sends one direct message from user 0 to Options.CrossPeer, a
// user of another shard, at once.
func (p *Population) SendCross() (Sent, error) {
	u := p.users[0]
	if u.cross == nil {
		return Sent{}, errors.New("no cross-shard peer")
	}
	now := time.Now()
	u.mu.Lock()
	_, s, err := p.sendOn(u, u.cross, now.UnixNano(), nil)
	s.Intended = now
	return s, err
}

// SendNow sends one message from user i at once, direct or to its group,
// and returns what identifies it. A canary round sends this way.
func (p *Population) SendNow(i int, group bool) (Sent, error) {
	u := p.users[i]
	st := u.direct
	if group {
		st = nil
		if len(u.groups) > 0 {
			st = u.groups[0]
		}
	}
	if st == nil {
		return Sent{}, fmt.Errorf("user %s has no %s peer", u.name, map[bool]string{false: "direct", true: "group"}[group])
	}
	now := time.Now()
	u.mu.Lock()
	_, s, err := p.sendOn(u, st, now.UnixNano(), nil)
	s.Intended, s.Recipients = now, st.recipientList()
	return s, err
}

// sendOn writes one message of u on st with the given intended time. It is
// called with u.mu held and releases it. buf is scratch space, returned for
// reuse.
func (p *Population) sendOn(u *user, st *sendStream, intended int64, buf []byte) ([]byte, Sent, error) {
	set := p.opts.Set
	dev := u.sender()
	if dev == nil {
		u.mu.Unlock()
		set.SendErrors[metrics.SendOffline].Inc()
		return buf, Sent{}, errOffline
	}
	sess := dev.sess
	st.seq++
	st.fate.write(st.seq)
	h := probe.Header{Run: p.run, Sender: u.nameB, Stream: st.name, Seq: st.seq, Intended: intended + int64(p.opts.TestClockOffset)}
	h.VoidLo, h.VoidHi = st.takeVoid()
	if p.opts.Slice.Across() {
		st.marks(&h)
	}
	ref := p.refs.Add(1)
	if len(u.inflight) >= maxInflight {
		old := u.inflight[0]
		u.inflight = u.inflight[1:]
		old.st.addVoid(old.seq)
		set.SendErrors[metrics.SendAckTimeout].Inc()
		u.unacked(old.ref, metrics.SendAckTimeout, "")
	}
	u.inflight = append(u.inflight, flight{ref: ref, st: st, dev: dev, seq: st.seq, sentAt: time.Now().UnixNano(), intended: intended})
	u.mu.Unlock()
	if p.mirror {
		// Before the write: the other devices' copies may come back
		// before Send returns, and this device must not see its own
		// send as a gap.
		dev.inbox.Sent(st.key, st.kind, h.Seq, intended, h.VoidLo, h.VoidHi)
	}
	if st.fan != nil {
		st.fan.start(h.Seq, intended, p.onlineDevices(st))
	}

	sent := Sent{Ref: ref, Sender: u.name, Stream: st.nameS, Seq: h.Seq, Group: st.kind == metrics.Group, Fanout: int(st.fanout)}
	buf = probe.AppendBody(buf[:0], &h, p.bodySize(u))
	m := probe.Message{Ref: ref, Body: buf}
	if st.kind == metrics.Group {
		m.Group = st.peer()
	} else {
		m.To = st.peer()
	}
	if err := sess.Send(&m); err != nil {
		u.mu.Lock()
		if f, ok := u.take(ref); ok {
			f.st.addVoid(f.seq)
			set.SendErrors[metrics.SendWrite].Inc()
			u.unacked(ref, metrics.SendWrite, "")
		}
		u.mu.Unlock()
		return buf, sent, err
	}
	set.Kind[st.kind].Sent.Inc()
	return buf, sent, nil
}

// sender returns the device the user's next message goes out on: the
// user's online devices take turns, as a person picks up one or another,
// so that each device's inbox sees the others' messages mirrored. nil if
// none is online. Called with u.mu held.
func (u *user) sender() *device {
	n := len(u.devices)
	for k := range n {
		dev := u.devices[(int(u.devTurn)+k)%n]
		if dev.sess != nil {
			u.devTurn = uint32((int(u.devTurn) + k + 1) % n)
			return dev
		}
	}
	return nil
}

// onlineDevices counts the online devices of the members st delivers to:
// a group message's fan-out ends when the last of them has it. A few atomic
// loads per device and nothing allocated, so that a message to a large
// group costs the sender time linear in its members and no garbage.
func (p *Population) onlineDevices(st *sendStream) int {
	n := 0
	for i, pos := range st.recipients() {
		if p.churn && !st.grp.present[pos].Load() {
			continue
		}
		for _, dev := range p.users[i].devices {
			if dev.online.Load() {
				n++
			}
		}
	}
	return n
}

// waitUntil waits on timer, which has fired or been stopped, until at
// (Unix ns), and reports whether ctx is still live: the loops that keep
// their users' next events on a heap (the senders, the regroup loop)
// share it.
func waitUntil(ctx context.Context, timer *time.Timer, at int64) bool {
	if wait := time.Until(time.Unix(0, at)); wait > 0 {
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	return ctx.Err() == nil
}
