package engine

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Clock offsets between shards. Shards on different nodes do not share a
// clock, and a cross-shard delivery's latency is the receiver's clock minus
// the sender's intended time: the skew between the two goes straight into
// it. The target is the only path between shards that always exists, so
// the offset is measured through it, NTP-style, on the cross-shard canary
// ring:
//
//	A ──canary message (t1)──▶ B               B stamps t2 on receipt
//	A ◀──answer (t1 t2 t3)──── B               A stamps t4: A's sample
//	A ──return (t3 t4 t5)────▶ B               B stamps t6: B's sample
//
// Each side gets four timestamps of an exchange it started: A from its
// canary message (t1..t4), B from its answer (t3..t6). For either, with T1
// and T4 its own clock and T2 and T3 the peer's, the peer is ahead by
// offset = ((T2-T1)+(T3-T4))/2, and the true offset lies within
// uncertainty = ((T4-T1)-(T3-T2))/2 of it, whatever the two legs' delays,
// since neither can be negative. B, the receiver of A's canary messages, is
// the side that corrects their latencies; the return leg gives it a
// measurement of its own in the same round, rather than A's result relayed
// or one a round old.
//
// The answer and the return are not probe messages: they carry their own
// magic, never reach the ledger, and are neither owed nor counted, so no
// SLI changes. They are sent from user 0 on the direct conversation the
// ring already has.
//
// A clock body is plain ASCII like the probe body:
//
//	imt1 KIND TO_RUN TO_USER FROM_RUN FROM_USER TX TY TZ
//
// KIND is "answer" or "return"; TO is the user and run the body is for
// (the one that stamped TX), FROM the one that wrote it; TX is the
// recipient's send time of the message answered, TY the writer's receipt
// of it and TZ the writer's own send time, all Unix nanoseconds.

const clockMagic = "imt1"

// Kinds of clock body.
const (
	clockAnswer = "answer"
	clockReturn = "return"
)

// clockWindow is how many of the last exchanges with a peer the estimate
// is the median of: an odd number, so that the median is one exchange,
// whose own uncertainty is then a true bound; five rides out two
// exchanges with one slow leg each.
const clockWindow = 5

// clockMaxAge is the age past which an exchange no longer counts. The
// canary runs every 30 s by default, so the window spans minutes; past
// this no exchange has completed for many rounds, and the drift of a
// clock (tens of µs a second undisciplined) may have outgrown the bound.
const clockMaxAge = 10 * time.Minute

// DefaultMaxClockUncertainty is the uncertainty above which cross-shard
// latencies are untrusted when Options leaves it 0: canary.max_clock_uncertainty's default.
const DefaultMaxClockUncertainty = 50 * time.Millisecond

// clockQueue bounds the answers and returns waiting for their send: one
// per cross-shard message in flight, of which a canary has one a round.
const clockQueue = 8

// clockSample is one exchange: when it completed (local Unix ns), the
// peer's offset and its uncertainty (ns).
type clockSample struct {
	at, offset, unc int64
}

// peerClock is the estimate of one peer's clock.
type peerClock struct {
	name []byte
	exp  *metrics.ClockPeer
	// samples is a ring of the last exchanges, next its write position,
	// n how many it holds.
	samples [clockWindow]clockSample
	next, n int
	// est is the estimate from the samples, valid when ok; newest is the
	// last sample, which a trusted estimate must agree with.
	est, newest clockSample
	ok          bool
	// snap is est, newest and ok as of the last sample, for the readers:
	// every delivery from another shard of a population laid out across
	// the shards reads it, and must not queue on mu for it.
	snap atomic.Pointer[clockSnap]
}

// clockSnap is a peerClock's estimate, as one value.
type clockSnap struct {
	est, newest clockSample
	ok          bool
}

// crossClock estimates this process's clock offset to the processes of
// the population's cross-shard peers (CrossPeer and CrossFrom, one peer on
// a ring of two), and corrects the latency of CrossFrom's deliveries by it.
type crossClock struct {
	p         *Population
	maxUnc    int64
	shift     int64
	from      []byte
	untrusted prometheus.Counter
	out       chan clockSend
	// mu guards peers' samples and estimates, written by the read loop of
	// user 0; the deliveries read each peer's snap without it. peers is
	// fixed once the clock is made.
	mu    sync.Mutex
	peers []*peerClock
}

// clockSend is an answer or a return waiting to be written.
type clockSend struct {
	kind          string
	toRun, toUser []byte
	tx, ty        int64
}

func newCrossClock(p *Population) *crossClock {
	o := p.opts
	if o.CrossPeer == "" && o.CrossFrom == "" {
		return nil
	}
	c := &crossClock{
		p: p, maxUnc: int64(o.MaxClockUncertainty), shift: int64(o.TestClockOffset),
		from: []byte(o.CrossFrom), out: make(chan clockSend, clockQueue),
	}
	if c.maxUnc == 0 {
		c.maxUnc = int64(DefaultMaxClockUncertainty)
	}
	add := func(name string, exp *metrics.ClockPeer) {
		if name == "" || slices.ContainsFunc(c.peers, func(pc *peerClock) bool { return string(pc.name) == name }) {
			return
		}
		c.peers = append(c.peers, &peerClock{name: []byte(name), exp: exp})
	}
	add(o.CrossFrom, o.CrossFromClock)
	add(o.CrossPeer, o.CrossPeerClock)
	if o.CrossFromClock != nil {
		c.untrusted = o.CrossFromClock.Untrusted
	} else {
		// Nothing exports it: a population built without metrics
		// for the clock still counts, for its tests.
		c.untrusted = prometheus.NewCounter(prometheus.CounterOpts{Name: "unexported"})
	}
	return c
}

func (c *crossClock) peer(name []byte) *peerClock {
	for _, pc := range c.peers {
		if bytes.Equal(pc.name, name) {
			return pc
		}
	}
	return nil
}

// wire is a local Unix ns time as this process's clock reads it: the
// local clock, shifted by Options.TestClockOffset in tests.
func (c *crossClock) wire(local int64) int64 { return local + c.shift }

// correction returns what to add to the latency of a delivery from sender
// of another run, measured as our clock minus its intended time: the
// sender's offset. fromPeer is false for a delivery that is not
// cross-shard (nothing to correct); ok is false for one whose sender's
// offset is not known well enough, whose latency is untrusted.
func (c *crossClock) correction(sender []byte, now int64) (off int64, fromPeer, ok bool) {
	if len(c.from) == 0 || !bytes.Equal(sender, c.from) {
		return 0, false, true
	}
	off, ok = c.offset(c.peer(c.from), now)
	return off, true, ok
}

// offset returns the estimated clock offset of pc's process, false while
// it is not known well enough: no estimate, one the newest exchange
// contradicts, one past the uncertainty bound, or none recent.
func (c *crossClock) offset(pc *peerClock, now int64) (int64, bool) {
	if pc == nil {
		return 0, false
	}
	sn := pc.snap.Load()
	if sn == nil || !sn.ok || sn.est.unc > c.maxUnc || now-sn.newest.at > int64(clockMaxAge) {
		return 0, false
	}
	return sn.est.offset, true
}

// ClockOffset returns the clock offset (ns, how far ahead) of the process
// of peer, one of Options.CrossPeer and CrossFrom, as the ring's exchanges
// measured it at now (local Unix ns): what to add to a latency measured
// against an intended time of that process. It is false while not known
// well enough, and for any other peer. Another population of the process,
// laid out across the shards, corrects its latencies by it
// (Options.ShardClock).
func (p *Population) ClockOffset(peer string, now int64) (int64, bool) {
	c := p.clock
	if c == nil || peer == "" {
		return 0, false
	}
	// peers is fixed once the clock is made.
	for _, pc := range c.peers {
		if string(pc.name) == peer {
			return c.offset(pc, now)
		}
	}
	return 0, false
}

// add records one exchange with pc completed at local time at, and
// updates the estimate: the median of the exchanges of the last
// clockMaxAge, at most clockWindow of them. The estimate is ok only while
// the newest exchange agrees with it (their bounds overlap): a clock that
// was stepped makes the median wrong until most of the window has seen
// the step, and its latencies untrusted meanwhile.
func (c *crossClock) add(pc *peerClock, s clockSample) {
	c.mu.Lock()
	pc.samples[pc.next] = s
	pc.next = (pc.next + 1) % clockWindow
	pc.n = min(pc.n+1, clockWindow)
	var live []clockSample
	for _, x := range pc.samples[:pc.n] {
		if s.at-x.at <= int64(clockMaxAge) {
			live = append(live, x)
		}
	}
	slices.SortFunc(live, func(a, b clockSample) int { return cmpInt64(a.offset, b.offset) })
	// The lower middle of an even count: one exchange, not an average,
	// so that its uncertainty still bounds the true offset.
	pc.est = live[(len(live)-1)/2]
	pc.newest = s
	d := pc.est.offset - s.offset
	pc.ok = max(d, -d) <= pc.est.unc+s.unc
	pc.snap.Store(&clockSnap{est: pc.est, newest: pc.newest, ok: pc.ok})
	est := pc.est
	c.mu.Unlock()
	if pc.exp != nil {
		pc.exp.Samples.Inc()
		pc.exp.Estimate(float64(est.offset)/1e9, float64(est.unc)/1e9)
	}
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// onDelivery handles what user 0's device received at (local Unix ns), a
// push: a clock body is taken here and reports true, never reaching the
// ledger; a canary message from CrossFrom is answered.
func (c *crossClock) onDelivery(dev *device, body []byte, at int64) bool {
	if dev.u.idx != 0 {
		return false
	}
	if bytes.HasPrefix(body, []byte(clockMagic+" ")) {
		c.onClock(dev, body, at)
		return true
	}
	if len(c.from) == 0 {
		return false
	}
	var h probe.Header
	if probe.ParseBody(body, &h) != nil || !bytes.Equal(h.Sender, c.from) || bytes.Equal(h.Run, c.p.run) {
		return false
	}
	c.queue(clockSend{kind: clockAnswer, toRun: bytes.Clone(h.Run), toUser: c.from, tx: h.Intended, ty: c.wire(at)})
	return false
}

// onClock takes an answer or a return: the exchange it closes is a sample,
// and an answer is returned.
func (c *crossClock) onClock(dev *device, body []byte, at int64) {
	f := bytes.Fields(body)
	if len(f) != 9 {
		return
	}
	kind, toRun, toUser, fromRun, fromUser := string(f[1]), f[2], f[3], f[4], f[5]
	// Only what is for this user of this run: the echo of our own
	// answer, or one to an earlier run of ours, measures nothing.
	if !bytes.Equal(toRun, c.p.run) || !bytes.Equal(toUser, dev.u.nameB) || (kind != clockAnswer && kind != clockReturn) {
		return
	}
	pc := c.peer(fromUser)
	if pc == nil {
		return
	}
	var t [3]int64
	for i := range t {
		n, err := strconv.ParseInt(string(f[6+i]), 10, 64)
		if err != nil {
			return
		}
		t[i] = n
	}
	t1, t2, t3, t4 := t[0], t[1], t[2], c.wire(at)
	rtt, held := t4-t1, t3-t2
	// A round trip longer than the deadline is a message the ledger
	// would call late: no bound worth keeping.
	if rtt < 0 || held < 0 || held > rtt || rtt > int64(c.p.opts.Deadline) {
		return
	}
	c.add(pc, clockSample{at: at, offset: ((t2 - t1) + (t3 - t4)) / 2, unc: (rtt - held) / 2})
	if kind == clockAnswer {
		c.queue(clockSend{kind: clockReturn, toRun: bytes.Clone(fromRun), toUser: pc.name, tx: t3, ty: t4})
	}
}

// queue hands s to the clock loop, or drops it if the loop is behind: a
// missed exchange only leaves the estimate one sample older.
func (c *crossClock) queue(s clockSend) {
	select {
	case c.out <- s:
	default:
		c.p.log.Debug("clock exchange dropped: queue full", "to", string(s.toUser))
	}
}

// loop writes the answers and returns from user 0, apart from the read
// loop that asks for them, so that a protocol whose send waits on its
// session never waits on itself. It exits when ctx ends.
func (c *crossClock) loop(ctx context.Context) {
	u := c.p.users[0]
	var buf []byte
	for {
		var s clockSend
		select {
		case <-ctx.Done():
			return
		case s = <-c.out:
		}
		u.mu.Lock()
		dev := u.sender()
		var sess probe.Session
		if dev != nil {
			sess = dev.sess
		}
		u.mu.Unlock()
		if sess == nil {
			continue
		}
		buf = append(buf[:0], clockMagic+" "+s.kind+" "...)
		buf = append(buf, s.toRun...)
		buf = append(buf, ' ')
		buf = append(buf, s.toUser...)
		buf = append(buf, ' ')
		buf = append(buf, c.p.run...)
		buf = append(buf, ' ')
		buf = append(buf, u.nameB...)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, s.tx, 10)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, s.ty, 10)
		buf = append(buf, ' ')
		// Stamped last, just before the write: any delay after it is
		// the leg's, which the uncertainty covers.
		buf = strconv.AppendInt(buf, c.wire(time.Now().UnixNano()), 10)
		// Its ack finds no flight and is dropped: a clock body is not
		// a probe message and owes nothing.
		m := probe.Message{Ref: c.p.refs.Add(1), To: string(s.toUser), Body: buf}
		if err := sess.Send(&m); err != nil {
			c.p.log.Debug("clock exchange not sent", "to", string(s.toUser), "err", err)
		}
	}
}
