package probe

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
)

// Ledger limits. Each bounds memory by what is in flight, never by uptime.
const (
	// histBits is how far below a stream's base the ledger still tells a
	// duplicate from a late arrival of a message already written off.
	histBits = 256
	// maxPending bounds the out-of-order messages held above a gap. Past
	// it the oldest gap is declared lost at once, earlier than lost_after:
	// a stream that far behind has lost messages by any measure.
	maxPending = 4096
	// maxGap is the largest sequence jump accepted in one step. A larger
	// one is a corrupt or hostile body: counting it would book billions of
	// phantom losses.
	maxGap = 1 << 20
	// maxVoids bounds the unacknowledged spans remembered per stream.
	maxVoids = 8
	// minEvict is the least time a stream of another run with nothing
	// missing stays in memory after its last message. It is long on
	// purpose: a receiver that forgets a stream cannot count what the
	// stream lost meanwhile. Streams of this process's own run are never
	// evicted; the population's layout bounds them.
	minEvict = time.Hour
	// maxStreams bounds the streams of one inbox. A population user
	// receives from a handful of senders; only a server that invents
	// senders reaches this.
	maxStreams = 1024
	// maxSkew is how far in the future an intended send time may be, for
	// senders in other processes whose clocks differ from ours.
	maxSkew = time.Minute
)

// Ledger turns the deliveries of one population into counts: delivered, late,
// lost, duplicate, reordered. Each receiving user has an Inbox; the Ledger
// holds what they share.
type Ledger struct {
	set       *metrics.Set
	run       []byte
	start     int64 // Unix ns; messages intended earlier are an earlier run's
	deadline  int64
	lostAfter int64
	evict     int64
	streams   atomic.Int64
	// obs, if set, sees every received message; nil for the background.
	obs Observer
	// health, if set, says whether the prober is saturated: deliveries
	// recorded meanwhile are counted as such.
	health Health
	// fanouts are the fan-out trackers of this run's group streams, by
	// inbox key; written before the population runs, only read after.
	fanouts map[string]*fanout
	// fates are the ack records of this run's send streams, by inbox key;
	// written before the population runs, only read after. A stream
	// without one (another process's) counts every first delivery.
	fates map[string]*fate
	// slow (ns) is the latency above which a delivery's observation
	// carries an exemplar naming its message, through the gate of its
	// histogram.
	slow  int64
	gates [len(metrics.Kinds)][len(metrics.Cohorts)]exemplarGate
	// lost logs, at a bounded rate, the messages written off as lost; nil
	// logs nothing.
	lost *lostLog
	// clock, if set, corrects the latencies of cross-shard deliveries
	// by the sender's clock offset; shift is Connection.TestClockOffset,
	// by which every intended time read is ahead of the local clock.
	clock *crossClock
	shift int64
}

// NewLedger returns a ledger that records into set. run is this process's
// run id: streams of the same run are known to start at sequence 1, so a
// loss of their first messages is counted too.
func NewLedger(set *metrics.Set, run string, start time.Time, deadline, lostAfter time.Duration) *Ledger {
	return &Ledger{
		set:       set,
		run:       []byte(run),
		start:     start.UnixNano(),
		deadline:  int64(deadline),
		lostAfter: int64(lostAfter),
		evict:     int64(max(minEvict, 10*lostAfter)),
		slow:      int64(slowAfter(deadline)),
	}
}

// Owe counts the deliveries the server owes for one message it accepted:
// normal and slow of its recipients, by cohort, of kind kind.
// Unlike every other count of the ledger, it is counted on the sender's
// side, at the ack: a delivery becomes owed when the server accepts the
// message, which only the sender sees, and its recipients may be users of
// another process (a shard) that never hears of the send. Summed over the
// processes, owed and received meet.
func (l *Ledger) Owe(kind metrics.Kind, normal, slow int) {
	ks := &l.set.Kind[kind]
	if normal > 0 {
		ks.Cohort[metrics.Normal].Expected.Add(float64(normal))
	}
	if slow > 0 {
		ks.Cohort[metrics.SlowReader].Expected.Add(float64(slow))
	}
}

// Streams returns how many streams all inboxes of the ledger track.
func (l *Ledger) Streams() int64 { return l.streams.Load() }

// Inbox is the receive-side ledger of one device of one user. It outlives
// the device's sessions, so a reconnect neither forgets what is missing nor
// counts it twice.
type Inbox struct {
	l    *Ledger
	user int // the receiving user's index, for the observer
	dev  int // the device's index among its user's, for the lost log
	// cohort is the receiving user's.
	cohort metrics.Cohort
	// self is the receiving user's name: its own messages are owed to
	// this device only when ownOwed, the protocol syncing what one device
	// sends to the user's others.
	self    []byte
	ownOwed bool
	// onlineSince (Unix ns) is when the device's current session logged
	// in, 0 while it is offline: a group message intended before it was
	// not owed to the device's fan-out.
	onlineSince atomic.Int64
	// mu is held by the user's read loop for each delivery and by the
	// sweeper; it is uncontended but for a sweep.
	mu      sync.Mutex
	streams map[string]*stream
}

// NewInbox returns an empty inbox.
func (l *Ledger) NewInbox() *Inbox {
	return &Inbox{l: l, streams: make(map[string]*stream)}
}

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

// Receive records the push of body at now (Unix ns). It does not allocate
// once the stream exists.
func (in *Inbox) Receive(body []byte, now int64) { in.receive(body, now, false) }

// Recover records body as fetched by catch-up at now (Unix ns): recovered
// if the device lacked it, an overlap if it had it.
func (in *Inbox) Recover(body []byte, now int64) { in.receive(body, now, true) }

func (in *Inbox) receive(body []byte, now int64, fetched bool) {
	l := in.l
	var h Header
	if err := ParseBody(body, &h); err != nil {
		l.set.Ignored[metrics.IgnoredMalformed].Inc()
		return
	}
	h.Intended -= l.shift
	own := bytes.Equal(h.Sender, in.self) && bytes.Equal(h.Run, l.run)
	if own && !in.ownOwed {
		l.set.Ignored[metrics.IgnoredOwn].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	if h.Intended < l.start {
		l.set.Ignored[metrics.IgnoredStale].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	// A sender can only write off messages it sent before this one; a
	// message from the future would hold its stream's gaps open for ever.
	if h.VoidHi >= h.Seq || h.VoidHi-h.VoidLo > maxGap || h.Intended > now+int64(maxSkew) {
		l.set.Ignored[metrics.IgnoredMalformed].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	// The key is the body's "RUN SENDER STREAM" prefix, which ParseBody
	// found contiguous; indexing the map with string(key) does not allocate.
	key := body[len(bodyMagic)+1 : len(bodyMagic)+1+len(h.Run)+1+len(h.Sender)+1+len(h.Stream)]

	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.streams[string(key)]
	if st == nil {
		if len(in.streams) >= maxStreams {
			l.set.Ignored[metrics.IgnoredStreamLimit].Inc()
			in.observe(&h, now, Ignored)
			return
		}
		st = &stream{kind: metrics.KindOf(h.Stream[0] == 'g'), base: h.Seq, key: string(key)}
		if bytes.Equal(h.Run, l.run) {
			st.base, st.own = 1, true
			st.fate = l.fates[st.key]
			if !own {
				st.fan = l.fanouts[st.key]
			}
		}
		in.streams[st.key] = st
		l.streams.Add(1)
	}
	kset := &l.set.Kind[st.kind]
	ks := &kset.Cohort[in.cohort]
	if len(st.awaiting) > 0 {
		in.settle(st, kset, ks)
	}
	st.last = now
	if h.VoidHi != 0 {
		st.addVoid(h.VoidLo, h.VoidHi)
	}
	s := h.Seq
	outcome := Delivered
	switch {
	case s < st.base:
		switch {
		case st.base-s > histBits:
			l.set.Ignored[metrics.IgnoredTooOld].Inc()
			outcome = Ignored
		case st.received(s):
			outcome = in.again(ks, own, fetched, st.wasFetched(s), st.wasExcused(s))
		default:
			l.set.Ignored[metrics.IgnoredAfterLost].Inc()
			outcome = Ignored
		}
	case s-st.base > maxGap:
		l.set.Ignored[metrics.IgnoredMalformed].Inc()
		in.observe(&h, now, Ignored)
		return
	case st.isPending(s):
		how := st.pendingHow(s)
		outcome = in.again(ks, own, fetched, how == holdFetched, how == holdExcused)
	case fetched:
		lat, trusted := in.latency(&h, now)
		outcome = Recovered
		st.maxSeen = max(st.maxSeen, s)
		st.hold(s, h.Intended, holdFetched)
		if st.fan != nil && h.Intended >= in.onlineSince.Load() {
			st.fan.arrived(s, now)
		}
		in.first(st, kset, ks, unsettled{seq: s, lat: lat, untrusted: !trusted, recovered: true})
	default:
		lat, trusted := in.latency(&h, now)
		a := unsettled{seq: s, lat: lat, untrusted: !trusted, saturated: l.health != nil && l.health.Saturated()}
		if s < st.maxSeen {
			a.reordered = true
		} else {
			st.maxSeen = s
		}
		if st.fan != nil && h.Intended >= in.onlineSince.Load() {
			st.fan.arrived(s, now)
		}
		if s == st.base && len(st.pending) == 0 {
			// The common case: the next message in order.
			st.mark(s, true, holdPush)
			st.base++
		} else {
			st.hold(s, h.Intended, holdPush)
			if len(st.pending) > maxPending {
				in.writeOff(st, st.pending[0].seq, st.pending[0].intended)
			}
		}
		in.first(st, kset, ks, a)
	}
	st.advance()
	in.observe(&h, now, outcome)
}

// first counts a first delivery by what became of its message: delivered
// (or recovered) once the server acknowledged it, unowed if its sender
// wrote it off, and nothing yet while the sender waits for the ack, which
// a delivery often beats. A message of another process has no record here
// and counts as delivered: its sender's process owes it or not.
func (in *Inbox) first(st *stream, kset *metrics.KindSet, ks *metrics.RecvSet, a unsettled) {
	switch st.fate.of(a.seq) {
	case fatePending:
		if len(st.awaiting) < maxAwaiting {
			st.awaiting = append(st.awaiting, a)
			return
		}
	case fateOff:
		ks.Unowed.Inc()
		return
	}
	in.count(st, kset, ks, a)
}

// settle counts the deliveries of st awaiting an ack that has come, or a
// write-off.
func (in *Inbox) settle(st *stream, kset *metrics.KindSet, ks *metrics.RecvSet) {
	n := 0
	for _, a := range st.awaiting {
		switch st.fate.of(a.seq) {
		case fatePending:
			st.awaiting[n] = a
			n++
		case fateOff:
			ks.Unowed.Inc()
		default:
			in.count(st, kset, ks, a)
		}
	}
	st.awaiting = st.awaiting[:n]
}

// count counts a first delivery of an owed message.
func (in *Inbox) count(st *stream, kset *metrics.KindSet, ks *metrics.RecvSet, a unsettled) {
	lat := float64(a.lat) / 1e9
	if a.recovered {
		ks.Recovered.Inc()
		if !a.untrusted {
			ks.RecoveryLatency.Observe(lat)
		}
		return
	}
	ks.Delivered.Inc()
	if a.untrusted {
		// Not observed: no skew reaches the latency SLI.
	} else if eo, ok := ks.DeliveryLatency.(prometheus.ExemplarObserver); ok && a.lat > in.l.slow && in.l.gates[st.kind][in.cohort].allow(lat, time.Now().UnixNano()) {
		eo.ObserveWithExemplar(lat, exemplar(st.key, a.seq))
	} else {
		ks.DeliveryLatency.Observe(lat)
	}
	if a.saturated {
		kset.Saturated.Inc()
	}
	if a.lat > in.l.deadline {
		ks.Late.Inc()
	}
	if a.reordered {
		ks.Reordered.Inc()
	}
}

// latency is the latency of h received at now: now minus its intended
// time, and for a cross-shard delivery plus the sender's clock offset. It
// is untrusted (false) for a cross-shard delivery whose sender's offset is
// not known well enough: then it is raw, counted as untrusted, and the
// caller does not observe it, so that no skew reaches the latency SLI.
// Whether it is late is still judged on it: a skew of the order of the
// bound moves only deliveries within it of the deadline.
func (in *Inbox) latency(h *Header, now int64) (int64, bool) {
	lat := now - h.Intended
	c := in.l.clock
	if c == nil || bytes.Equal(h.Run, in.l.run) {
		return lat, true
	}
	off, cross, ok := c.correction(h.Sender, now)
	if !cross {
		return lat, true
	}
	if !ok {
		c.untrusted.Inc()
		return lat, false
	}
	return lat + off, true
}

// again classifies a message the device already holds, fetched telling
// whether this copy came by catch-up and heldFetched whether the one held
// did: a duplicate if both were pushes; a late push if the server pushed
// what catch-up had already fetched, which tells a slow push from a
// missing one; an overlap otherwise (a fetch of what was pushed, the echo
// of a device's own send), which a real client drops by id and the server
// did nothing wrong by.
func (in *Inbox) again(ks *metrics.RecvSet, own, fetched, heldFetched, excused bool) Outcome {
	switch {
	case excused:
		in.l.set.Ignored[metrics.IgnoredLeftGroup].Inc()
		return Ignored
	case own:
		in.l.set.Ignored[metrics.IgnoredOwn].Inc()
		return Ignored
	case !fetched && heldFetched:
		ks.LatePush.Inc()
		return LatePush
	case fetched || heldFetched:
		in.l.set.Ignored[metrics.IgnoredCatchUp].Inc()
		return Ignored
	}
	ks.Duplicate.Inc()
	return Duplicate
}

// Sent records that this device itself sent seq on the stream of key: the
// device holds it without a push, so that where the protocol syncs a
// user's messages to its other devices, this one's inbox, which receives
// what the others send, sees no gap at its own sends.
//
// voidLo and voidHi are the span of unacknowledged seqs the sent body
// carries (0, 0 for none): the device never receives its own body, and a
// sibling's failed send it would otherwise learn of only from a later
// message of the stream, which may be its own.
func (in *Inbox) Sent(key string, kind metrics.Kind, seq uint64, intended int64, voidLo, voidHi uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.streams[key]
	if st == nil {
		if len(in.streams) >= maxStreams {
			return
		}
		st = &stream{kind: kind, base: 1, own: true, key: key, fate: in.l.fates[key]}
		in.streams[key] = st
		in.l.streams.Add(1)
	}
	if voidHi != 0 {
		st.addVoid(voidLo, voidHi)
	}
	if seq < st.base || st.isPending(seq) {
		st.advance()
		return
	}
	st.maxSeen = max(st.maxSeen, seq)
	st.hold(seq, intended, holdFetched)
	st.advance()
}

// Excuse records that seq of the group stream of key is not owed to this
// device: its user was out of the group, or changing, when the server
// accepted it. It reports false if the device had it already, in which
// case it is owed after all. A copy that arrives later is ignored
// (left_group), neither a delivery nor a fault.
func (in *Inbox) Excuse(key string, kind metrics.Kind, seq uint64, intended int64) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.streams[key]
	if st == nil {
		if len(in.streams) >= maxStreams {
			return true
		}
		st = &stream{kind: kind, base: 1, own: true, fan: in.l.fanouts[key], key: key, fate: in.l.fates[key]}
		in.streams[key] = st
		in.l.streams.Add(1)
	}
	switch {
	case seq < st.base:
		return !st.received(seq) || st.wasExcused(seq)
	case st.isPending(seq):
		return st.pendingHow(seq) == holdExcused
	}
	// Resolved, as far as the lag is concerned: nothing of it is owed.
	st.maxSeen = max(st.maxSeen, seq)
	st.hold(seq, intended, holdExcused)
	st.advance()
	return true
}

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

func (in *Inbox) observe(h *Header, now int64, o Outcome) {
	if in.l.obs != nil {
		// A copy, so that h does not escape to the heap on every
		// delivery: only populations with an observer pay for one.
		hc := *h
		in.l.obs.Received(in.user, &hc, time.Duration(now-h.Intended), o)
	}
}

// Sweep declares lost every message still missing lostAfter past its
// intended send time, and forgets streams long idle with nothing missing.
// The intended time of a missing message is not known, but it is no later
// than that of the first message received after it: a gap is written off
// once that one is lostAfter old, never before the missing one is.
func (in *Inbox) Sweep(now int64) {
	l := in.l
	in.mu.Lock()
	defer in.mu.Unlock()
	for key, st := range in.streams {
		kset := &l.set.Kind[st.kind]
		ks := &kset.Cohort[in.cohort]
		if len(st.awaiting) > 0 {
			in.settle(st, kset, ks)
		}
		for len(st.pending) > 0 && now-st.pending[0].intended > l.lostAfter {
			in.writeOff(st, st.pending[0].seq, st.pending[0].intended)
		}
		if !st.own && len(st.pending) == 0 && now-st.last > l.evict {
			delete(in.streams, key)
			l.streams.Add(-1)
		}
	}
}

// Forget drops every stream of the inbox, for a user removed from the
// population.
func (in *Inbox) Forget() {
	in.mu.Lock()
	in.l.streams.Add(-int64(len(in.streams)))
	clear(in.streams)
	in.mu.Unlock()
}

// writeOff resolves every seq below upTo as lost, but for those not owed,
// then advances past what is resolved. before (Unix ns) is the intended
// time of seq upTo, which the lost ones were sent before.
func (in *Inbox) writeOff(st *stream, upTo uint64, before int64) {
	if upTo <= st.base {
		return
	}
	// The voids are sorted and disjoint: the missing seqs are the runs
	// between them and the runs they cover.
	next := st.base
	for _, v := range st.voids {
		lo, hi := max(v.lo, st.base), min(v.hi, upTo-1)
		if lo <= hi {
			if next < lo {
				in.missing(st, next, lo-1, false, before)
			}
			in.missing(st, lo, hi, true, before)
			next = hi + 1
		}
	}
	if next < upTo {
		in.missing(st, next, upTo-1, false, before)
	}
	// Only the last histBits seqs need their history bit cleared.
	for s := max(st.base, upTo-min(upTo, histBits)); s < upTo; s++ {
		st.mark(s, false, holdPush)
	}
	st.base = upTo
	st.advance()
}

// missing counts as lost those of the missing seqs lo through hi that were
// owed, and logs them. void says the sender declared them void in its
// bodies. Where this process has the sender's ack record, the record
// decides: a message written off before its void reached this device is
// not owed, and an acknowledged one that a sender's merged void span covers
// is. Below the record's window, or for another process's stream, the
// voids decide.
func (in *Inbox) missing(st *stream, lo, hi uint64, void bool, before int64) {
	ks := &in.l.set.Kind[st.kind].Cohort[in.cohort]
	lose := func(lo, hi uint64) {
		ks.Lost.Add(float64(hi - lo + 1))
		in.l.lost.note(in, st.key, lo, hi, before)
	}
	win, top := hi+1, hi // the record decides win through top
	if st.fate != nil {
		sent := st.fate.sent.Load()
		win = lo
		if sent >= fateRing {
			win = max(lo, sent-fateRing+1)
		}
		win, top = min(win, hi+1), min(hi, sent)
	}
	if !void && lo < win {
		lose(lo, win-1)
	}
	runLo, run := uint64(0), false
	for s := win; s <= top && s >= win; s++ {
		owed := !void
		switch st.fate.of(s) {
		case fateAcked:
			owed = true
		case fateOff:
			owed = false
		}
		switch {
		case owed && !run:
			runLo, run = s, true
		case !owed && run:
			lose(runLo, s-1)
			run = false
		}
	}
	if run {
		lose(runLo, top)
	}
	if t := max(top+1, win); !void && top < hi && t <= hi {
		// Above what the sender wrote: seqs no message of this
		// process had, which only a lying server announces.
		lose(t, hi)
	}
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
