package engine

import (
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// A receive stream is what one device's Inbox knows of one sender's
// stream (run, sender, stream): which seqs it holds, and how it came to
// hold them (pushed, fetched, excused), which it lacks, and which the
// sender wrote off (voids). The Inbox (ledger.go) judges each delivery
// against it.

// pend is a seq received above a stream's base, waiting for those below it.
type pend struct {
	seq      uint64
	intended int64
	how      holdKind
}

// holdKind is how a device came to hold a seq.
type holdKind uint8

const (
	holdPush    holdKind = iota // pushed to it
	holdFetched                 // fetched by catch-up, or sent by the device itself
	holdExcused                 // not owed to it: a group it was out of, or changing
)

type span struct{ lo, hi uint64 }

// stream is the receive state of one (run, sender, stream) sequence: every
// seq below base is resolved (received, lost or void); pending holds the
// received seqs above base, ascending; hist remembers which of the last
// histBits resolved seqs were received.
type stream struct {
	kind    metrics.Kind
	own     bool // of this process's run: starts at 1, never evicted
	base    uint64
	maxSeen uint64
	last    int64
	hist    [histBits / 64]uint64
	// fetched marks which of the seqs of hist the device holds without a
	// push: recovered by catch-up, or its own sends; excused those not
	// owed to it. A push of one of these is an overlap, not a duplicate.
	fetched [histBits / 64]uint64
	excused [histBits / 64]uint64
	pending []pend
	voids   []span
	// fan, for a group stream of this run, times its messages' fan-out.
	fan *fanout
	// key is the stream's inbox key, "RUN SENDER STREAM".
	key string
	// fate, for a stream of this run, says whether the server acknowledged
	// each message; awaiting holds the first deliveries of messages whose
	// sender was still waiting for the ack, counted once it has it or has
	// written them off. At most the sender's messages in flight.
	fate     *fate
	awaiting []unsettled
	// mirror marks another shard's stream of a population laid out
	// across shards: fate is then this stream's own copy of the sender's
	// record, filled from the marks its messages carry, and resolved the
	// highest resolved mark seen.
	mirror   bool
	resolved uint64
	// shard is a mirror stream's sender's shard, for its clock offset
	// (Ledger.shards); -1 unknown.
	shard int32
}

// takeMarks copies what h's marks say into the stream's copy of its
// sender's ack record: h's seq, and every seq below it, written; every
// seq up to h.Resolved resolved, written off where the off mask says and
// acknowledged otherwise. A seq resolved more than 64 below the first
// mark that covers it, whose fate no mask this device saw carried, is
// taken as acknowledged: a sender writes a message off within its ack
// deadline, so that takes a stream sending 64 messages within one.
func (st *stream) takeMarks(h *probe.Header) {
	st.fate.extend(max(h.Seq, h.Resolved))
	if h.Resolved > st.resolved {
		st.resolveThrough(h.Resolved, h.OffMask)
	}
}

// resolveThrough resolves the seqs above st.resolved up to top: written
// off where bit top-seq of off is set, acknowledged otherwise.
func (st *stream) resolveThrough(top, off uint64) {
	f := st.fate
	from := st.resolved + 1
	if top >= fateRing {
		from = max(from, top-fateRing+1)
	}
	for s := from; s <= top; s++ {
		if d := top - s; d < 64 && off&(1<<d) != 0 {
			f.writeOff(s)
		} else {
			f.ack(s)
		}
	}
	st.resolved = max(st.resolved, top)
}

// unsettled is a first delivery not yet counted: what counting it needs.
type unsettled struct {
	seq       uint64
	lat       int64 // ns from the intended send time
	recovered bool  // fetched by catch-up, not pushed
	reordered bool  // after a later message of its stream
	saturated bool  // while the prober was saturated
	// untrusted: a cross-shard latency whose sender's clock offset is not
	// known well enough to correct it (Inbox.latency); counted, not
	// observed.
	untrusted bool
}

// maxAwaiting bounds a stream's deliveries awaiting their ack; the sender
// has at most maxInflight messages in flight, so it is never reached but by
// a server that invents seqs of this run.
const maxAwaiting = maxInflight

// hold records s as received: at once if it is the next in order, else in
// pending.
func (st *stream) hold(s uint64, intended int64, how holdKind) {
	if s == st.base && len(st.pending) == 0 {
		st.mark(s, true, how)
		st.base++
		return
	}
	st.insert(s, intended, how)
}

// advance moves base past every seq that is received or void.
func (st *stream) advance() {
	for {
		if len(st.pending) > 0 && st.pending[0].seq == st.base {
			st.mark(st.base, true, st.pending[0].how)
			st.base++
			n := copy(st.pending, st.pending[1:])
			st.pending = st.pending[:n]
			continue
		}
		hi, ok := st.voidAt(st.base)
		if !ok || st.fate.of(st.base) == fateAcked {
			return
		}
		// Jump over the void span at once, up to the next received seq:
		// a span is sent by a peer and may be long. Not past a seq the
		// server acknowledged, which a sender's merged span may cover:
		// that one is owed, and stays missing until it comes or is lost.
		end := hi + 1
		if len(st.pending) > 0 && st.pending[0].seq < end {
			end = st.pending[0].seq
		}
		end = st.ackedFrom(st.base, end)
		for s := max(st.base, end-min(end, histBits)); s < end; s++ {
			st.mark(s, false, holdPush)
		}
		st.base = end
	}
}

// ackedFrom returns the first seq from lo below end that the sender's ack
// record says was acknowledged, or end.
func (st *stream) ackedFrom(lo, end uint64) uint64 {
	if st.fate == nil {
		return end
	}
	sent := st.fate.sent.Load()
	if sent >= fateRing {
		lo = max(lo, sent-fateRing+1)
	}
	for s := lo; s < end && s <= sent; s++ {
		if st.fate.of(s) == fateAcked {
			return s
		}
	}
	return end
}

func (st *stream) voidAt(s uint64) (hi uint64, ok bool) {
	for _, v := range st.voids {
		if v.lo <= s && s <= v.hi {
			return v.hi, true
		}
	}
	return 0, false
}

// addVoid remembers a span of unacknowledged seqs, merged with the spans it
// overlaps or touches so that the spans stay disjoint and sorted: writeOff
// subtracts them from a count and must not subtract a seq twice. Senders
// repeat a span on several messages, so a span already known is the common
// case.
func (st *stream) addVoid(lo, hi uint64) {
	if hi < st.base {
		return
	}
	// Drop spans already passed, and fold every span that overlaps or
	// touches [lo, hi] into it.
	n := 0
	for _, v := range st.voids {
		switch {
		case v.hi < st.base:
		case v.lo <= hi+1 && lo <= v.hi+1:
			lo, hi = min(lo, v.lo), max(hi, v.hi)
		default:
			st.voids[n] = v
			n++
		}
	}
	st.voids = st.voids[:n]
	if len(st.voids) == maxVoids {
		// Forget the oldest: its seqs, if missing, are then counted lost,
		// which a sender that voids this much has earned.
		copy(st.voids, st.voids[1:])
		st.voids = st.voids[:maxVoids-1]
	}
	i := len(st.voids)
	for i > 0 && st.voids[i-1].lo > lo {
		i--
	}
	st.voids = append(st.voids, span{})
	copy(st.voids[i+1:], st.voids[i:])
	st.voids[i] = span{lo, hi}
}

func (st *stream) isPending(s uint64) bool {
	i := st.find(s)
	return i < len(st.pending) && st.pending[i].seq == s
}

// pendingHow returns how the pending s is held (holdPush if it is not
// pending).
func (st *stream) pendingHow(s uint64) holdKind {
	i := st.find(s)
	if i < len(st.pending) && st.pending[i].seq == s {
		return st.pending[i].how
	}
	return holdPush
}

// find returns the index of the first pending seq at least s.
func (st *stream) find(s uint64) int {
	p := st.pending
	// Binary search: pending is ascending.
	lo, hi := 0, len(p)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p[m].seq < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// insert adds s to pending, keeping it ascending. Arrivals are nearly in
// order, so the insertion point is almost always the end.
func (st *stream) insert(s uint64, intended int64, how holdKind) {
	i := len(st.pending)
	for i > 0 && st.pending[i-1].seq > s {
		i--
	}
	st.pending = append(st.pending, pend{})
	copy(st.pending[i+1:], st.pending[i:])
	st.pending[i] = pend{seq: s, intended: intended, how: how}
}

func (st *stream) mark(s uint64, received bool, how holdKind) {
	w, b := (s%histBits)/64, uint64(1)<<(s%64)
	set := func(m *[histBits / 64]uint64, on bool) {
		if on {
			m[w] |= b
		} else {
			m[w] &^= b
		}
	}
	set(&st.hist, received)
	set(&st.fetched, received && how == holdFetched)
	set(&st.excused, received && how == holdExcused)
}

// wasFetched reports whether s, within histBits below base, was held
// without a push.
func (st *stream) wasFetched(s uint64) bool {
	return st.fetched[(s%histBits)/64]&(1<<(s%64)) != 0
}

// wasExcused reports whether s, within histBits below base, was not owed.
func (st *stream) wasExcused(s uint64) bool {
	return st.excused[(s%histBits)/64]&(1<<(s%64)) != 0
}

// received reports whether s, within histBits below base, was received.
func (st *stream) received(s uint64) bool {
	return st.hist[(s%histBits)/64]&(1<<(s%64)) != 0
}
