package engine

import (
	"iter"
	"sync"
	"sync/atomic"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// A user's send streams: what each has sent, what the server acknowledged,
// and the seqs written but never acknowledged (voids), which the next
// messages carry so that receivers do not count them lost.

// user is one simulated user: its devices, its send streams and what it
// has in flight.
type user struct {
	p *Population
	// idx is the user's place in the population. class is its behaviour
	// class, -1 without a mix; interval is the time between its sends
	// (ns), 0 for a user who does not send.
	idx, class int32
	name       string
	nameB      []byte
	// devices are the user's sessions' owners, population.devices of
	// them, each logged in on its own.
	devices  []*device
	interval int64
	// everOnline is set at the user's first login on any device.
	everOnline atomic.Bool
	// late users log in only LateAfter after the start.
	late bool
	// slow users read deliberately slowly (a drill) and do not send.
	slow bool
	// remote users are another shard's, in a population laid out across
	// shards: they have no devices and no send streams here. remoteIn
	// users are this shard's and receive from another's.
	remote, remoteIn bool
	// toggle, guarded by mu, alternates direct and group messages.
	toggle bool
	// outOf is the group stream of the group whose membership the user
	// changes next: the one it has left, or one whose change failed; nil
	// while it is in all of its groups. Owned by the regroup loop.
	outOf *sendStream

	// mu guards the fields below, toggle, and each device's sess and
	// sessStart: the sender, the read loops (acks) and the sweeper (ack
	// timeouts) all touch them.
	mu       sync.Mutex
	direct   *sendStream
	groups   []*sendStream
	cross    *sendStream // to Options.CrossPeer, user 0 only
	inflight []flight
	// groupTurn picks the group of the next group message; devTurn the
	// device that sends the next message. Both are kept below the
	// number they pick among.
	groupTurn, devTurn uint32

	// next is the intended time of the next send, owned by the sender.
	next int64
}

// device is one of a user's devices: a session when online, its inbox in
// the ledger and its place in its conversations (catch-up), which outlive
// the sessions.
type device struct {
	u     *user
	inbox *Inbox
	// catchup is nil when catch-up is off.
	catchup *probe.Catchup
	// online is set while the device has a session, for the sender's
	// count of the member devices a group message is owed to at once.
	online atomic.Bool
	// idx is the device's among the user's; beside online, so that the
	// two share a word (a device is held per session).
	idx int32
	// nextPause (Unix ns) is when a slow reader next pauses; 0 is at its
	// next delivery. Owned by the read loop.
	nextPause int64
	// incoming are the streams that deliver to this device, with the
	// state of its lag on each; touched only by the sweep.
	incoming []link
	// sess and sessStart (Unix ns, when the session logged in) are
	// guarded by u.mu.
	sess      probe.Session
	sessStart int64
	// storm is set while a reconnect-storm drill waits for this device's
	// dropped session to come back (see Population.Drop).
	storm atomic.Pointer[stormMark]
}

// peer is the user a direct stream sends to, or the group a group stream
// sends to: its name without the "d." or "g.", which holds no copy.
func (st *sendStream) peer() string { return st.nameS[len("d."):] }

// sendStream is one of a user's outgoing sequences. Its fields are guarded
// by the sending user's mu.
type sendStream struct {
	// name is "d.PEER" or "g.GROUP", and nameS the same as a string; a
	// group's members share them, since nothing writes them.
	name  []byte
	nameS string
	kind  metrics.Kind
	// fanout is how many devices the server owes each message to: every
	// device of every recipient, and the sender's other devices where
	// the protocol mirrors a user's messages to them.
	fanout int32
	// slowFanout is how many of those devices are slow readers': their
	// expected deliveries are counted in the slow_reader cohort.
	slowFanout int32
	// fan times the fan-out of a group stream's messages; nil for direct
	// streams.
	fan *fanout
	// mirrored is how much of fanout is the sender's own other devices.
	mirrored int32
	// grp is the group's membership and pos the sender's place in it;
	// nil for direct streams. A group stream's recipients are the other
	// members (see recipients).
	pos int32
	grp *groupState
	// dst is a direct stream's recipient, as a user index: -1 for one
	// whose recipient is another process's (the cross-shard stream).
	dst int32
	// from is the index of the stream's sender.
	from int32
	// key is the inbox key of the stream ("RUN SENDER NAME").
	key      string
	voidTurn uint32
	// acked is the highest seq the server acknowledged; acks holds the
	// time of the last few acks, by seq modulo its length, so that a
	// recipient's lag is timed from the ack of the first message it misses.
	// acks is made by the first ack: a stream that never sends holds none.
	acked uint64
	acks  *[ackRing]ackStamp
	seq   uint64
	// voids are the spans of seqs written but never acknowledged, sorted
	// and disjoint; voidTurn (beside from, where it packs) picks which
	// one the next message carries.
	voids []voidCarry
	// fate tells this process's recipients which messages the server
	// acknowledged and which were written off.
	fate *fate
	// For recipients in other shards (Options.Slice), the marks each
	// message carries: resolved is the highest seq at and below which
	// every seq is acknowledged or written off, lastOff the highest seq
	// written off, and begun the intended time of seq 1.
	resolved, lastOff uint64
	begun             int64
}

// marks writes into h, the body of the message st.seq just written, what
// a receiver in another shard needs to tell an owed delivery from one
// the sender wrote off: the resolved mark, which of the 64 seqs at and
// below it were written off, and when the stream began. Called with the
// sending user's lock held.
func (st *sendStream) marks(h *probe.Header) {
	if st.begun == 0 {
		st.begun = h.Intended
	}
	for st.resolved+1 < st.seq && st.fate.of(st.resolved+1) != fatePending {
		st.resolved++
	}
	h.HasResolved, h.Resolved, h.Begun, h.OffMask = true, st.resolved, st.begun, 0
	if st.lastOff == 0 || st.lastOff+64 <= st.resolved {
		// The common case, and no scan: nothing written off in reach.
		return
	}
	for d := range min(uint64(64), st.resolved) {
		if st.fate.of(st.resolved-d) == fateOff {
			h.OffMask |= 1 << d
		}
	}
}

// recipients yields the user index of each user st delivers to, the
// sender not among them, with its place in the group (-1 on a direct
// stream). A group's are its other members, derived rather than kept: a
// list per member would cost each member the whole group again.
func (st *sendStream) recipients() iter.Seq2[int, int] {
	return func(yield func(user, pos int) bool) {
		if st.grp == nil {
			if st.dst >= 0 {
				yield(int(st.dst), -1)
			}
			return
		}
		for pos, m := range st.grp.members {
			if pos != int(st.pos) && !yield(m, pos) {
				return
			}
		}
	}
}

// recipientList is recipients as a new slice of user indices.
func (st *sendStream) recipientList() []int {
	var out []int
	for r := range st.recipients() {
		out = append(out, r)
	}
	return out
}

// ackedAt records the server's ack of seq at now (Unix ns). Called with the
// sending user's lock held.
func (st *sendStream) ackedAt(seq uint64, now int64) {
	st.acked = max(st.acked, seq)
	if st.acks == nil {
		st.acks = new([ackRing]ackStamp)
	}
	st.acks[seq%ackRing] = ackStamp{seq: seq, at: now}
}

// flight is a message written and not yet acknowledged, by the device
// that wrote it.
type flight struct {
	ref      uint64
	st       *sendStream
	dev      *device
	seq      uint64
	sentAt   int64
	intended int64
}

// ackRing is how many recent acks a stream remembers the time of. A
// recipient further behind than this is timed from the oldest one kept,
// which can only make its lag look shorter, never longer.
const ackRing = 8

type ackStamp struct {
	seq uint64
	at  int64
}

// link is a receiving device's view of one stream that delivers to it: waitSeq is
// the first seq it is waiting for (0: none) and since when (Unix ns).
type link struct {
	st *sendStream
	// pos is the receiving user's place in the stream's group, -1 for a
	// direct stream.
	pos     int
	waitSeq uint64
	since   int64
}

type voidCarry struct {
	lo, hi uint64
	left   int
}

// voidRepeats is how many later messages carry a void span, so that one
// lost message does not also lose the news that its predecessor was void.
const voidRepeats = 8

// maxInflight bounds a user's unacknowledged messages; past it the oldest is
// written off as an ack timeout.
const maxInflight = 1024

// take removes the flight with ref. Acks come nearly in order, so the
// search ends at the first element.
func (u *user) take(ref uint64) (flight, bool) {
	for i, f := range u.inflight {
		if f.ref == ref {
			u.inflight = append(u.inflight[:i], u.inflight[i+1:]...)
			return f, true
		}
	}
	return flight{}, false
}

// addVoid records seq as written but unacknowledged, to be carried in the
// stream's next messages. Spans stay sorted and disjoint, and a seq that
// touches a span extends it: an inverted or overlapping span would be
// rejected or double-counted by receivers.
func (st *sendStream) addVoid(seq uint64) {
	// Every write-off comes here: its delivery, if any, is not owed.
	st.fate.writeOff(seq)
	st.lastOff = max(st.lastOff, seq)
	i := 0
	for i < len(st.voids) && st.voids[i].hi+1 < seq {
		i++
	}
	switch {
	case i < len(st.voids) && st.voids[i].lo <= seq+1:
		v := &st.voids[i]
		v.lo, v.hi, v.left = min(v.lo, seq), max(v.hi, seq), voidRepeats
		// Extending upwards may now touch the next span.
		if i+1 < len(st.voids) && st.voids[i+1].lo <= v.hi+1 {
			v.hi = max(v.hi, st.voids[i+1].hi)
			st.voids = append(st.voids[:i+1], st.voids[i+2:]...)
		}
		return
	case len(st.voids) == maxVoids:
		// Merge the two closest neighbours rather than forget one: a wider
		// span can only hide a loss between them, never invent one.
		j := 0
		for k := 1; k+1 < len(st.voids); k++ {
			if st.voids[k+1].lo-st.voids[k].hi < st.voids[j+1].lo-st.voids[j].hi {
				j = k
			}
		}
		st.voids[j].hi, st.voids[j].left = st.voids[j+1].hi, voidRepeats
		st.voids = append(st.voids[:j+1], st.voids[j+2:]...)
		st.addVoid(seq)
		return
	}
	st.voids = append(st.voids, voidCarry{})
	copy(st.voids[i+1:], st.voids[i:])
	st.voids[i] = voidCarry{lo: seq, hi: seq, left: voidRepeats}
}

// takeVoid returns the span the next message carries. Spans take turns, so
// each reaches receivers within len(voids) messages, well before its gap is
// written off.
func (st *sendStream) takeVoid() (lo, hi uint64) {
	if len(st.voids) == 0 {
		return 0, 0
	}
	i := int(st.voidTurn % uint32(len(st.voids)))
	st.voidTurn++
	v := &st.voids[i]
	lo, hi = v.lo, v.hi
	if v.left--; v.left == 0 {
		st.voids = append(st.voids[:i], st.voids[i+1:]...)
	}
	return lo, hi
}
