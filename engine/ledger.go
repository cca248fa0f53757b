package engine

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
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
	// sends are this run's send streams, by inbox key: a receiving
	// stream takes its sender's ack record (fate) and, for a group, its
	// fan-out tracker from there. Written before the population runs,
	// only read after. A stream without one (another process's) counts
	// every first delivery.
	sends map[string]*sendStream
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
	// shards, for a population laid out across shards whose process
	// measures the other shards' clocks, corrects the latencies of their
	// senders' messages; nil corrects none.
	shards *shardClocks
}

// shardClocks maps another shard's sender to its shard's clock offset.
type shardClocks struct {
	offset    func(shard int, now int64) (int64, bool)
	untrusted prometheus.Counter
	slice     Slice
	// users is the population's size, first the number of its user 0
	// (Options.Offset): a sender is PREFIX-u(first+i).
	users, first int
}

// shardOf returns the shard of the sender named name, -1 for a name that
// is not one of the population's users.
func (c *shardClocks) shardOf(name []byte) int32 {
	i := bytes.LastIndex(name, []byte("-u"))
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(string(name[i+2:]))
	if err != nil || n < c.first || n-c.first >= c.users {
		return -1
	}
	return int32(c.slice.ShardOf(n-c.first, c.users))
}

// firstOwed is how long after a device's first login another shard's
// messages become owed to it. The shards' clocks differ (by milliseconds
// where they keep NTP time): a message sent just before the login, by a
// sender whose clock is ahead, would otherwise be owed though the server
// fanned it out before the device was there to receive it.
const firstOwed = time.Second

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
	user int32 // the receiving user's index, for the observer
	dev  int32 // the device's index among its user's, for the lost log
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
	// owedFrom (Unix ns), with Options.OwedAfterLogin, is when another
	// shard's streams are owed to the device from (firstOwed after its
	// first login), 0 before it: their senders count owed every delivery
	// to it, online or not, and what they sent before this process's
	// device was there to receive it (a shard's start, or its restart
	// while the others ran on) is counted by no one rather than as
	// missed. Without the option it stays 0: everything from the
	// ledger's start is owed, as in one process.
	owedFrom atomic.Int64
	// mu is held by the user's read loop for each delivery and by the
	// sweeper; it is uncontended but for a sweep.
	mu sync.Mutex
	// streams is made by the first stream: an idle device's inbox holds
	// no map (19,000 of them would hold about 2 MB of empty maps).
	streams map[string]*stream
}

// NewInbox returns an empty inbox.
func (l *Ledger) NewInbox() *Inbox {
	return &Inbox{l: l}
}

// fateOf is the ack record of this run's send stream of key, nil for
// another process's.
func (l *Ledger) fateOf(key string) *fate {
	if st := l.sends[key]; st != nil {
		return st.fate
	}
	return nil
}

// fanoutOf is the fan-out tracker of this run's group stream of key, nil
// for a direct stream or another process's.
func (l *Ledger) fanoutOf(key string) *fanout {
	if st := l.sends[key]; st != nil {
		return st.fan
	}
	return nil
}

// track adds st to the inbox's streams, making the map for the first.
func (in *Inbox) track(st *stream) {
	if in.streams == nil {
		in.streams = make(map[string]*stream)
	}
	in.streams[st.key] = st
	in.l.streams.Add(1)
}

// Receive records the push of body at now (Unix ns). It does not allocate
// once the stream exists.
func (in *Inbox) Receive(body []byte, now int64) { in.receive(body, now, false) }

// Recover records body as fetched by catch-up at now (Unix ns): recovered
// if the device lacked it, an overlap if it had it.
func (in *Inbox) Recover(body []byte, now int64) { in.receive(body, now, true) }

func (in *Inbox) receive(body []byte, now int64, fetched bool) {
	l := in.l
	var h probe.Header
	if err := probe.ParseBody(body, &h); err != nil {
		l.set.Ignored[metrics.IgnoredMalformed].Inc()
		return
	}
	h.Intended -= l.shift
	if h.HasResolved {
		h.Begun -= l.shift
	}
	own := bytes.Equal(h.Sender, in.self) && bytes.Equal(h.Run, l.run)
	if own && !in.ownOwed {
		l.set.Ignored[metrics.IgnoredOwn].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	mirrored := h.HasResolved && !bytes.Equal(h.Run, l.run)
	if h.Intended < l.start || mirrored && h.Intended < in.owedFrom.Load() {
		l.set.Ignored[metrics.IgnoredStale].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	// A sender can only write off messages it sent before this one; a
	// message from the future would hold its stream's gaps open for ever.
	if h.VoidHi >= h.Seq || h.VoidHi-h.VoidLo > maxGap || h.Intended > now+int64(maxSkew) || (h.HasResolved && h.Resolved >= h.Seq) {
		l.set.Ignored[metrics.IgnoredMalformed].Inc()
		in.observe(&h, now, Ignored)
		return
	}
	key := probe.StreamKey(body, &h)

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
		switch {
		case bytes.Equal(h.Run, l.run):
			st.base, st.own = 1, true
			st.fate = l.fateOf(st.key)
			if !own {
				st.fan = l.fanoutOf(st.key)
			}
		case mirrored:
			// Another shard's sender of a population laid out across
			// shards: its marks stand in for the ack record this
			// process does not have. A stream that began after this
			// device was first owed it is owed here from its first
			// message.
			st.mirror, st.fate = true, new(fate)
			if h.Begun >= max(l.start, in.owedFrom.Load()) {
				st.base = 1
			}
			if l.shards != nil {
				st.shard = l.shards.shardOf(h.Sender)
			}
		}
		in.track(st)
	}
	if st.mirror && h.HasResolved {
		st.takeMarks(&h)
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
		lat, trusted := in.latency(&h, st, now)
		outcome = Recovered
		st.maxSeen = max(st.maxSeen, s)
		st.hold(s, h.Intended, holdFetched)
		if st.fan != nil && h.Intended >= in.onlineSince.Load() {
			st.fan.arrived(s, now)
		}
		in.first(st, kset, ks, unsettled{seq: s, lat: lat, untrusted: !trusted, recovered: true})
	default:
		lat, trusted := in.latency(&h, st, now)
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

// latency is the latency of h, of stream st, received at now: now minus
// its intended time, and for a cross-shard delivery (the canary ring's,
// or another shard's sender of a population laid out across shards) plus
// the sender's clock offset. It is untrusted (false) for a cross-shard
// delivery whose sender's offset is not known well enough: then it is
// raw, counted as untrusted, and the caller does not observe it, so that
// no skew reaches the latency SLI.
// Whether it is late is still judged on it: a skew of the order of the
// bound moves only deliveries within it of the deadline.
func (in *Inbox) latency(h *probe.Header, st *stream, now int64) (int64, bool) {
	lat := now - h.Intended
	if sc := in.l.shards; sc != nil && st.mirror {
		if st.shard < 0 {
			sc.untrusted.Inc()
			return lat, false
		}
		off, ok := sc.offset(int(st.shard), now)
		if !ok {
			sc.untrusted.Inc()
			return lat, false
		}
		return lat + off, true
	}
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
		st = &stream{kind: kind, base: 1, own: true, key: key, fate: in.l.fateOf(key)}
		in.track(st)
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
		st = &stream{kind: kind, base: 1, own: true, fan: in.l.fanoutOf(key), key: key, fate: in.l.fateOf(key)}
		in.track(st)
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

func (in *Inbox) observe(h *probe.Header, now int64, o Outcome) {
	if in.l.obs != nil {
		// A copy, so that h does not escape to the heap on every
		// delivery: only populations with an observer pay for one.
		hc := *h
		in.l.obs.Received(int(in.user), &hc, time.Duration(now-h.Intended), o)
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
		if st.mirror && len(st.awaiting) > 0 && now-st.last > l.lostAfter {
			// No later message has come to say what became of the
			// last ones, and the sender has long since had its ack or
			// written them off: were they written off, its next
			// message would say so, and there was none. Taken as
			// acknowledged, the one guess of the marks (see takeMarks).
			st.resolveThrough(st.fate.sent.Load(), 0)
		}
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
