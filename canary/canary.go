// Package canary runs canary rounds: a few fixed users, always online apart
// from the background population, send a direct and a group message each
// and check every one is acknowledged and delivered once, within the
// deadline. Each round is a pass/fail SLI event.
package canary

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/report"
)

// Options configures a Canary.
type Options struct {
	// Connection is the prober's, shared with its other populations. Its
	// Health is fed the canary's receive lag like every population's; a
	// nil Reach makes one of the canary's own.
	engine.Connection
	Metrics *metrics.Metrics
	Target  string
	// Prefix names the canary users, apart from every other cohort.
	Prefix string
	Users  int
	// Messages is how many messages of each kind each user sends a round.
	Messages int
	Deadline time.Duration
	Logger   *slog.Logger
	// CrossPeer and CrossFrom are the canary users of the neighbouring
	// shards (see engine.Options): each round also sends one direct message
	// to CrossPeer. Its receipt is counted by the peer's process, so it is
	// not part of this round's verdict; Prometheus's sum over shards
	// judges it.
	CrossPeer, CrossFrom string
	// CrossPeerShard and CrossFromShard are those users' shards, the
	// peer_shard label of the clock offsets the ring measures;
	// MaxClockUncertainty is canary.max_clock_uncertainty (see
	// engine.Options).
	CrossPeerShard, CrossFromShard string
	MaxClockUncertainty            time.Duration
}

// Canary keeps the canary users online and runs rounds on demand.
type Canary struct {
	o   Options
	pop *engine.Population
	set *metrics.Set

	// mu guards round; the observer methods record into it from the
	// population's goroutines.
	mu    sync.Mutex
	round *record
	// busy serialises rounds: a scheduler skips a round rather than stack
	// it on one still running.
	busy sync.Mutex
}

// New builds a canary; its users come online when Run runs.
func New(o Options) (*Canary, error) {
	if o.Users < 2 {
		return nil, fmt.Errorf("canary.New: Users %d, want at least 2 (a canary messages from one user to another)", o.Users)
	}
	if o.Messages < 1 {
		o.Messages = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Reach == nil {
		o.Reach = engine.NewReach(nil)
	}
	c := &Canary{o: o, set: o.Metrics.For(o.Target, metrics.SourceCanary)}
	for _, k := range metrics.Kinds {
		for _, r := range []string{metrics.ResultPass, metrics.ResultFail} {
			o.Metrics.CanaryRounds.WithLabelValues(o.Target, k, r)
		}
		for _, r := range metrics.CanaryReasons {
			o.Metrics.CanaryFailures.WithLabelValues(o.Target, k, r)
		}
	}
	o.Metrics.CanarySkipped.WithLabelValues(o.Target)
	var peerClock, fromClock *metrics.ClockPeer
	if o.CrossPeer != "" {
		peerClock = o.Metrics.Clock.ClockPeer(o.Target, metrics.SourceCanary, o.CrossPeerShard)
	}
	if o.CrossFrom != "" {
		fromClock = o.Metrics.Clock.ClockPeer(o.Target, metrics.SourceCanary, o.CrossFromShard)
	}
	var err error
	c.pop, err = engine.NewPopulation(engine.Options{
		Connection: o.Connection,
		Set:        c.set,
		Logger:     o.Logger,
		Prefix:     o.Prefix,
		// One group of every canary user; no background sending: a
		// canary sends only in rounds.
		Users:     o.Users,
		GroupSize: o.Users,
		Rate:      0,
		Deadline:  o.Deadline,
		LostAfter: 2 * o.Deadline,
		Observer:  c,
		CrossPeer: o.CrossPeer,
		CrossFrom: o.CrossFrom,

		CrossPeerClock:      peerClock,
		CrossFromClock:      fromClock,
		MaxClockUncertainty: o.MaxClockUncertainty,
	})
	if err != nil {
		return nil, fmt.Errorf("canary: %w", err)
	}
	return c, nil
}

// Run keeps the canary users online until ctx ends.
func (c *Canary) Run(ctx context.Context) error { return c.pop.Run(ctx) }

// Ready reports whether every canary user has been online at once.
func (c *Canary) Ready() bool { return c.pop.Ready() }

// WaitReady waits until Ready or ctx ends, and reports Ready.
func (c *Canary) WaitReady(ctx context.Context) bool { return c.pop.WaitReady(ctx) }

// Online returns how many canary users are online.
func (c *Canary) Online() int { return c.pop.Online() }

// ShardClock returns the clock offset (ns, how far ahead) of shard's
// process as the ring measured it, false while it is not known well
// enough, and for a shard that is not the ring's neighbour: the ring
// measures only those. It is engine.Options.ShardClock for a population
// laid out across the shards.
func (c *Canary) ShardClock(shard int, now int64) (int64, bool) {
	s := strconv.Itoa(shard)
	switch s {
	case c.o.CrossFromShard:
		return c.pop.ClockOffset(c.o.CrossFrom, now)
	case c.o.CrossPeerShard:
		return c.pop.ClockOffset(c.o.CrossPeer, now)
	}
	return 0, false
}

// ErrBusy is returned by TryRound while another round runs.
var ErrBusy = errors.New("canary: a round is already running")

// TryRound runs a round unless one is running; a scheduler calls it so that
// overlapping rounds are skipped and counted, never stacked.
func (c *Canary) TryRound(ctx context.Context) (*report.Round, error) {
	if !c.busy.TryLock() {
		c.o.Metrics.CanarySkipped.WithLabelValues(c.o.Target).Inc()
		return nil, ErrBusy
	}
	defer c.busy.Unlock()
	return c.round1(ctx), nil
}

// Round runs one round, waiting for a running one to end first.
func (c *Canary) Round(ctx context.Context) *report.Round {
	c.busy.Lock()
	defer c.busy.Unlock()
	return c.round1(ctx)
}

// record collects what the population observes during a round. Events may
// arrive before SendNow has returned the message's identity (an ack can
// beat the sender), so everything is recorded and joined at the end.
type record struct {
	acks    map[uint64]time.Duration
	unacked map[uint64]string
	recv    map[string][]received
}

type received struct {
	user    int
	latency time.Duration
	outcome engine.Outcome
}

// key identifies a message across processes: another process's canary
// (a pipeline's canary --once beside the daemon) has another run id.
func key(run, sender, stream string, seq uint64) string {
	return run + " " + sender + " " + stream + " " + strconv.FormatUint(seq, 10)
}

// checking is one message of the round and its identity.
type checking struct {
	sent engine.Sent
	err  error
}

func (c *Canary) round1(ctx context.Context) *report.Round {
	o := c.o
	start := time.Now()
	out := &report.Round{ID: report.NewRunID(start), Kind: "canary", Target: o.Target, Start: start}
	checks := map[bool]*report.Check{
		false: {Kind: metrics.KindDirect, Pass: true},
		true:  {Kind: metrics.KindGroup, Pass: true},
	}
	fail := func(group bool, reason string) {
		ch := checks[group]
		ch.Pass = false
		if !slices.Contains(ch.Reasons, reason) {
			ch.Reasons = append(ch.Reasons, reason)
		}
	}

	if online := c.pop.Online(); online < o.Users {
		fail(false, metrics.CanarySessionDown)
		fail(true, metrics.CanarySessionDown)
		// Nothing could be sent, but the round still owed every
		// delivery its messages would have made: 0/4, not 0/0.
		checks[false].Expected = o.Users * o.Messages * c.fanout(false)
		checks[true].Expected = o.Users * o.Messages * c.fanout(true)
		out.Cause = c.offlineCause(online)
	} else {
		rec := &record{acks: map[uint64]time.Duration{}, unacked: map[uint64]string{}, recv: map[string][]received{}}
		c.mu.Lock()
		c.round = rec
		c.mu.Unlock()
		var sent []checking
		for i := range o.Users {
			for range o.Messages {
				for _, group := range []bool{false, true} {
					s, err := c.pop.SendNow(i, group)
					s.Group = group
					sent = append(sent, checking{s, err})
				}
			}
		}
		if o.CrossPeer != "" {
			if _, err := c.pop.SendCross(); err != nil {
				o.Logger.Debug("cross-shard canary message not sent", "peer", o.CrossPeer, "err", err)
			}
		}
		c.wait(ctx, rec, sent, time.Now())
		c.mu.Lock()
		c.round = nil
		c.mu.Unlock()
		if ctx.Err() != nil {
			// Cut short by a shutdown: no verdict on the target, and
			// nothing counted.
			out.End, out.Result = time.Now(), metrics.ResultAborted
			return out
		}
		// rec is no longer written: the observer drops events once
		// c.round is nil.
		for _, m := range sent {
			c.judge(rec, m, checks[m.sent.Group], func(r string) { fail(m.sent.Group, r) })
		}
	}

	out.End = time.Now()
	out.Result = metrics.ResultPass
	for _, group := range []bool{false, true} {
		ch := checks[group]
		result := metrics.ResultPass
		if !ch.Pass {
			result = metrics.ResultFail
			out.Result = metrics.ResultFail
			for _, r := range ch.Reasons {
				o.Metrics.CanaryFailures.WithLabelValues(o.Target, ch.Kind, r).Inc()
			}
		}
		o.Metrics.CanaryRounds.WithLabelValues(o.Target, ch.Kind, result).Inc()
		out.Checks = append(out.Checks, *ch)
	}
	o.Metrics.CanaryLastTimestamp.WithLabelValues(o.Target).Set(float64(out.End.UnixNano()) / 1e9)
	success := 0.0
	if out.Result == metrics.ResultPass {
		success = 1
	}
	o.Metrics.CanaryLastSuccess.WithLabelValues(o.Target).Set(success)
	return out
}

// judge checks one message: acked within the deadline, and delivered once,
// within the deadline, to each of its recipients.
func (c *Canary) judge(rec *record, m checking, ch *report.Check, fail func(string)) {
	if m.err != nil {
		ch.Expected += c.fanout(m.sent.Group)
		fail(metrics.CanarySessionDown)
		return
	}
	ch.Expected += len(m.sent.Recipients)
	if lat, ok := rec.acks[m.sent.Ref]; !ok || lat > c.o.Deadline {
		fail(metrics.CanaryNoAck)
	}
	onTime, late, recovered := map[int]bool{}, map[int]bool{}, map[int]bool{}
	for _, r := range rec.recv[key(c.o.Run, m.sent.Sender, m.sent.Stream, m.sent.Seq)] {
		if !slices.Contains(m.sent.Recipients, r.user) {
			// Delivered to someone it was not for: it does not count
			// for anyone it was for.
			continue
		}
		switch {
		case r.outcome == engine.Duplicate:
			fail(metrics.CanaryDuplicated)
		case r.outcome == engine.Recovered && r.latency <= c.o.Deadline:
			recovered[r.user] = true
		case r.outcome != engine.Delivered:
		case r.latency > c.o.Deadline:
			late[r.user] = true
		default:
			onTime[r.user] = true
		}
		ch.MaxLatency = max(ch.MaxLatency, r.latency)
	}
	for _, u := range m.sent.Recipients {
		switch {
		case onTime[u]:
			ch.Delivered++
		case recovered[u]:
			// The canary's is the real-time SLI: the server did not
			// push it, however fast the client fetched it.
			ch.Recovered++
			fail(metrics.CanaryRecovered)
		case late[u]:
			fail(metrics.CanaryLate)
		default:
			fail(metrics.CanaryNotDelivered)
		}
	}
}

// offlineCause says why a round found canary users offline: how many, and
// the last failed attempt to reach the target that the prober knows of,
// the canary's own or another population's (provisioning included).
func (c *Canary) offlineCause(online int) string {
	cause := fmt.Sprintf("%d of %d canary users offline", c.o.Users-online, c.o.Users)
	st := c.o.Reach.State()
	switch {
	case st.LastFailure.IsZero():
		return cause + ": no connect attempt has failed; still logging in"
	case st.Known && !st.Reachable:
		return cause + ": target unreachable: " + st.Cause()
	}
	return cause + ": last failure " + st.Cause()
}

// fanout is the deliveries a message of the kind owes: used for a message
// that could not be sent, so a failed round still shows what it expected.
func (c *Canary) fanout(group bool) int {
	if group {
		return c.o.Users - 1
	}
	return 1
}

// wait observes the round until the deadline has passed since the last
// send, so that a duplicate within the deadline is seen, and longer while
// anything is missing: up to half a deadline more, so that a late delivery
// is told from a missing one.
func (c *Canary) wait(ctx context.Context, rec *record, sent []checking, sentAt time.Time) {
	atLeast := sentAt.Add(c.o.Deadline)
	atMost := sentAt.Add(c.o.Deadline + c.o.Deadline/2)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		if now.After(atMost) || now.After(atLeast) && c.complete(rec, sent) {
			return
		}
	}
}

func (c *Canary) complete(rec *record, sent []checking) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range sent {
		if m.err != nil {
			continue
		}
		if _, ok := rec.acks[m.sent.Ref]; !ok {
			if _, gone := rec.unacked[m.sent.Ref]; gone {
				continue
			}
			return false
		}
		got := 0
		for _, r := range rec.recv[key(c.o.Run, m.sent.Sender, m.sent.Stream, m.sent.Seq)] {
			if (r.outcome == engine.Delivered || r.outcome == engine.Recovered) && slices.Contains(m.sent.Recipients, r.user) {
				got++
			}
		}
		if got < len(m.sent.Recipients) {
			return false
		}
	}
	return true
}

var _ engine.Observer = (*Canary)(nil)

// Login implements engine.Observer.
func (c *Canary) Login(int, time.Duration, error) {}

// Disconnect implements engine.Observer.
func (c *Canary) Disconnect(user int, reason string, err error) {
	c.o.Logger.Debug("canary session ended", "user", user, "reason", reason, "err", err)
}

// Ack implements engine.Observer.
func (c *Canary) Ack(ref uint64, _ bool, latency time.Duration) {
	c.mu.Lock()
	if c.round != nil {
		c.round.acks[ref] = latency
	}
	c.mu.Unlock()
}

// Unacked implements engine.Observer.
func (c *Canary) Unacked(ref uint64, reason, _ string) {
	c.mu.Lock()
	if c.round != nil {
		c.round.unacked[ref] = reason
	}
	c.mu.Unlock()
}

// Received implements engine.Observer.
func (c *Canary) Received(user int, h *probe.Header, latency time.Duration, o engine.Outcome) {
	c.mu.Lock()
	if c.round != nil {
		k := key(string(h.Run), string(h.Sender), string(h.Stream), h.Seq)
		c.round.recv[k] = append(c.round.recv[k], received{user, latency, o})
	}
	c.mu.Unlock()
}
