package probe

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/imcanary/imcanary/metrics"
)

// Options configures a Population.
type Options struct {
	Driver Driver
	Set    *metrics.Set
	Logger *slog.Logger
	// Run identifies this process in every message body.
	Run string
	// Prefix starts every user and group name.
	Prefix      string
	Users       int
	Ramp        time.Duration
	GroupSize   int
	Rate        float64 // messages per second per user
	Heartbeat   time.Duration
	Deadline    time.Duration
	LostAfter   time.Duration
	MessageSize int
	BackoffMin  time.Duration
	BackoffMax  time.Duration
	// Observer, if set, sees individual events (canary, soak).
	Observer Observer
	// StartPaused starts the population with sending paused: a soak run
	// ramps its users in before it sends.
	StartPaused bool
	// LateFraction of the users, spread evenly, log in only LateAfter
	// after the start: messages sent to them meanwhile test the server's
	// offline delivery.
	LateFraction float64
	LateAfter    time.Duration
	// SlowReaders makes a fraction of the users read deliberately slowly:
	// a slow-reader drill.
	SlowReaders SlowReaders
	// LagThreshold is how long a message the server acknowledged may go
	// unreceived by an online recipient, with nothing later of its stream
	// received either, before the recipient counts as lagging. 0 means
	// half the Deadline, so that a stalled session is flagged within one
	// deadline.
	LagThreshold time.Duration
	// Health, if set, records the prober's own send and receive lags and
	// says when it is saturated.
	Health Health
	// Reach, if set, hears the outcome of every connect, login and
	// provisioning attempt: whether the target takes logins right now.
	// Populations of one prober share it.
	Reach *Reach
	// SourceAddrs, if set, are the local addresses sessions connect from,
	// user i from SourceAddrs[i%len]: always the same one, so that a user
	// keeps its address across reconnects. Empty lets the kernel pick.
	SourceAddrs []netip.Addr
	// MaxConnectRate caps connect attempts per second across the whole
	// population, first logins and reconnects alike, so that a server
	// that dropped everyone is not stormed by them coming back at once
	// (the jittered backoff spreads them further). 0 is no limit.
	MaxConnectRate float64
	// SessionLifetime, if positive, is the mean of the exponentially
	// distributed time a session stays logged in before its user logs out
	// and back in (churn; disconnect reason "churn").
	SessionLifetime time.Duration
	// Limiter, if set, is the connect limiter to use instead of one of
	// MaxConnectRate: populations that share it share the rate, as the
	// blocks of one resized population must.
	Limiter *rate.Limiter
	// Offset and GroupOffset number the users and groups from these
	// instead of 0: PREFIX-u(Offset+i), PREFIX-g(GroupOffset+g). A
	// population grown at run time is made of blocks, each a Population
	// of its own, numbered on from the one before.
	Offset, GroupOffset int
	// Block marks such a block: its owner keeps the population's
	// wanted-sessions and ready gauges, which a block would set for
	// itself alone.
	Block bool
	// CrossPeer, if set, is a user of another shard (another process) to
	// whom user 0 sends direct messages with SendCross; CrossFrom is the
	// user of another shard who sends to user 0. Each process counts only
	// its half: the sender what the server acknowledged (expected), the
	// receiver what arrived, so Prometheus's sum over shards is the whole.
	CrossPeer, CrossFrom string
}

// SlowReaders configures a slow-reader drill. The slow readers are spread
// evenly over the users; they receive but do not send, since their acks
// would wait behind their own slow reads and measure imcanary, not the
// server.
type SlowReaders struct {
	// Fraction of the users, 0 to below 1, who read slowly.
	Fraction float64
	// ReadDelay is a pause after every delivery a slow reader reads.
	ReadDelay time.Duration
	// Pause stops a slow reader's reading for this long, at its first
	// delivery and then every PauseEvery (0: only once per session).
	Pause      time.Duration
	PauseEvery time.Duration
}

// Health is the prober's self-monitor (saturation.Monitor). Its
// methods are on the hot paths and must not block or allocate.
type Health interface {
	// SendLag records how late a message was written against its
	// intended send time.
	SendLag(time.Duration)
	// ReceiveLag records the time from a frame's read off the socket to
	// the ledger's record of it.
	ReceiveLag(time.Duration)
	// Saturated reports whether the prober's numbers are now suspect.
	Saturated() bool
}

// Population keeps Users sessions online, sends open-loop traffic between
// them and counts every delivery in a Ledger.
//
// Goroutines, all owned by Run and gone when it returns: one per user (its
// session's read loop, then its reconnect backoff), one sender per CPU, one
// heartbeat loop and one sweeper. Sending is not a goroutine per user: at
// tens of thousands of users a second stack per user would double the
// prober's memory.
type Population struct {
	opts    Options
	dialers *dialers
	log     *slog.Logger
	ledger  *Ledger
	users   []*user
	groups  []Group
	run     []byte

	refs   atomic.Uint64
	online atomic.Int64
	ready  atomic.Bool
	// paused stops sending while sessions stay online: a drain phase lets
	// every message in flight arrive before the counts are read.
	paused atomic.Bool
	// holdUntil (Unix ns) holds sending until the whole population is
	// online, or this time at the latest: a group message sent before
	// every member has logged in (joined the room, subscribed to the
	// channel) would be lost for the late members on protocols that keep
	// nothing for absent members, and counted as such.
	holdUntil atomic.Int64
	// ctx is Run's context: slow readers sleep on it, so that shutdown
	// does not wait out a pause.
	ctx context.Context
	// slowLag is the largest delivery lag of a slow reader at the last
	// sweep, for the drill report.
	slowLag atomic.Int64
	// sweepMu serialises sweeps: the sweeper's and a test's may overlap,
	// and the lag state of each link belongs to the sweep.
	sweepMu    sync.Mutex
	lagScratch []uint64

	// connects is the token bucket every connect attempt draws from; nil
	// when MaxConnectRate is 0.
	connects *rate.Limiter
	// held counts the attempts waiting for their token; heldLogged (Unix
	// ns) is when that was last logged.
	held       atomic.Int64
	heldLogged atomic.Int64
}

// readyGrace is how long after its ramp a population that is not fully
// online starts sending anyway: a user that never logs in must not stop
// the others from being measured.
const readyGrace = 30 * time.Second

// New builds a population; nothing runs until Run.
func New(o Options) (*Population, error) {
	switch {
	case o.Driver == nil:
		return nil, errors.New("population: no driver")
	case o.Users < 1:
		return nil, fmt.Errorf("population: users %d: must be at least 1", o.Users)
	case o.GroupSize < 2:
		return nil, fmt.Errorf("population: group_size %d: must be at least 2", o.GroupSize)
	case o.Deadline <= 0 || o.LostAfter < 2*o.Deadline:
		return nil, fmt.Errorf("population: lost_after %v must be at least twice deadline %v > 0", o.LostAfter, o.Deadline)
	case o.Heartbeat <= 0 || o.BackoffMin <= 0 || o.BackoffMax < o.BackoffMin:
		return nil, errors.New("population: heartbeat and backoff must be positive")
	case o.SlowReaders.Fraction < 0 || o.SlowReaders.Fraction >= 1:
		return nil, fmt.Errorf("population: slow_readers.fraction %v: must be at least 0 and below 1", o.SlowReaders.Fraction)
	case o.SlowReaders.ReadDelay < 0 || o.SlowReaders.Pause < 0 || o.SlowReaders.PauseEvery < 0:
		return nil, errors.New("population: slow_readers durations must not be negative")
	case o.LagThreshold < 0:
		return nil, fmt.Errorf("population: lag_threshold %v: must not be negative", o.LagThreshold)
	case o.Offset < 0 || o.GroupOffset < 0:
		return nil, fmt.Errorf("population: offsets %d, %d: must not be negative", o.Offset, o.GroupOffset)
	case !(o.MaxConnectRate >= 0):
		return nil, fmt.Errorf("population: max_connect_rate %v: must not be negative", o.MaxConnectRate)
	}
	if o.LagThreshold == 0 {
		o.LagThreshold = o.Deadline / 2
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Population{
		opts:   o,
		log:    o.Logger,
		ledger: NewLedger(o.Set, o.Run, time.Now(), o.Deadline, o.LostAfter),
		run:    []byte(o.Run),
	}
	p.ledger.obs = o.Observer
	p.ledger.health = o.Health
	switch {
	case o.Limiter != nil:
		p.connects = o.Limiter
	case o.MaxConnectRate > 0:
		p.connects = NewConnectLimiter(o.MaxConnectRate)
	}
	p.paused.Store(o.StartPaused)
	p.layout()
	return p, nil
}

// user is one simulated user: its session (when online), its two send
// streams and its inbox.
type user struct {
	p     *Population
	idx   int
	name  string
	nameB []byte
	inbox *Inbox
	// late users log in only LateAfter after the start.
	late bool
	// everOnline is set at the user's first login.
	everOnline atomic.Bool
	// slow users read deliberately slowly (a drill) and do not send.
	slow bool
	// nextPause (Unix ns) is when a slow reader next pauses; 0 is at its
	// next delivery. Owned by the read loop.
	nextPause int64
	// incoming are the streams that deliver to this user, with the state
	// of its lag on each; touched only by the sweep.
	incoming []link
	// sessStart (Unix ns) is when the current session logged in; guarded
	// by mu.
	sessStart int64

	// mu guards the fields below: the sender, the read loop (acks) and the
	// sweeper (ack timeouts) all touch them.
	mu       sync.Mutex
	sess     Session
	direct   *sendStream
	group    *sendStream
	cross    *sendStream // to Options.CrossPeer, user 0 only
	inflight []flight
	toggle   bool

	// next is the intended time of the next send, owned by the sender.
	next int64
}

// sendStream is one of a user's outgoing sequences. Its fields are guarded
// by the sending user's mu.
type sendStream struct {
	name   []byte // "d.PEER" or "g.GROUP"
	nameS  string // name, for Sent without an allocation per send
	to     string
	group  string
	kind   int
	fanout int
	// slowFanout is how many of the recipients are slow readers: their
	// expected deliveries are counted in the slow_reader cohort.
	slowFanout int
	// key is the inbox key of the stream ("RUN SENDER NAME"), from the
	// index of its sender.
	key  string
	from int
	// acked is the highest seq the server acknowledged; acks holds the
	// time of the last few acks, by seq modulo its length, so that a
	// recipient's lag is timed from the ack of the first message it misses.
	acked uint64
	acks  [ackRing]ackStamp
	// recipients are the indices of the users this stream delivers to.
	recipients []int
	seq        uint64
	// voids are the spans of seqs written but never acknowledged, sorted
	// and disjoint; voidTurn picks which one the next message carries.
	voids    []voidCarry
	voidTurn int
}

// flight is a message written and not yet acknowledged.
type flight struct {
	ref    uint64
	st     *sendStream
	seq    uint64
	sentAt int64
}

// ackRing is how many recent acks a stream remembers the time of. A
// recipient further behind than this is timed from the oldest one kept,
// which can only make its lag look shorter, never longer.
const ackRing = 8

type ackStamp struct {
	seq uint64
	at  int64
}

// link is a recipient's view of one stream that delivers to it: waitSeq is
// the first seq it is waiting for (0: none) and since when (Unix ns).
type link struct {
	st      *sendStream
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

// NewConnectLimiter returns the limiter of MaxConnectRate: a tenth of a
// second's worth of burst, enough that a ramp at the limit does not stutter
// on timer granularity, too little to be a storm.
func NewConnectLimiter(perSecond float64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/10)))
}

// layout names the users, pairs them for direct chats and groups them.
func (p *Population) layout() {
	o := p.opts
	p.users = make([]*user, o.Users)
	for i := range p.users {
		name := fmt.Sprintf("%s-u%d", o.Prefix, o.Offset+i)
		p.users[i] = &user{p: p, idx: i, name: name, nameB: []byte(name), inbox: p.ledger.NewInbox()}
		p.users[i].inbox.user = i
		// Half the users start with a group message: if all alternated
		// in phase, group fan-out would come in bursts every other
		// interval.
		p.users[i].toggle = i%2 == 1
		// Spread late users evenly: user i is late when the running
		// count of late users steps up at i.
		p.users[i].late = spread(i, o.LateFraction)
		// Offset by half a user, so that a run with both late users and
		// slow readers does not pick the same users for both.
		p.users[i].slow = spread(i+len(p.users)/2, o.SlowReaders.Fraction)
		p.users[i].inbox.cohort = metrics.CohortIndex(p.users[i].slow)
	}
	n := o.Users
	for i, u := range p.users {
		peer := i ^ 1
		if peer >= n {
			peer = i - 1
		}
		if peer >= 0 && peer != i {
			pn := p.users[peer].name
			u.direct = &sendStream{name: []byte("d." + pn), nameS: "d." + pn, to: pn, kind: 0, fanout: 1, recipients: []int{peer}}
		}
	}
	// Groups of GroupSize in order; a last group of one joins the one
	// before it, since a group of one delivers nothing.
	for start, g := 0, 0; start < n; g++ {
		end := min(start+o.GroupSize, n)
		if n-end == 1 {
			end = n
		}
		if end-start < 2 {
			break
		}
		grp := Group{Name: fmt.Sprintf("%s-g%d", o.Prefix, o.GroupOffset+g)}
		for _, u := range p.users[start:end] {
			grp.Members = append(grp.Members, u.name)
		}
		for _, u := range p.users[start:end] {
			var others []int
			for j := start; j < end; j++ {
				if j != u.idx {
					others = append(others, j)
				}
			}
			u.group = &sendStream{name: []byte("g." + grp.Name), nameS: "g." + grp.Name, group: grp.Name, kind: 1,
				fanout: len(grp.Members) - 1, recipients: others}
		}
		p.groups = append(p.groups, grp)
		start = end
	}
	if o.CrossPeer != "" {
		// No recipients here: the peer's own process receives it.
		peer := o.CrossPeer
		p.users[0].cross = &sendStream{name: []byte("d." + peer), nameS: "d." + peer, to: peer, fanout: 1}
	}
	for _, u := range p.users {
		for _, st := range []*sendStream{u.direct, u.group, u.cross} {
			if st == nil {
				continue
			}
			st.key, st.from = o.Run+" "+u.name+" "+st.nameS, u.idx
			for _, r := range st.recipients {
				rcpt := p.users[r]
				rcpt.incoming = append(rcpt.incoming, link{st: st})
				if rcpt.slow {
					st.slowFanout++
				}
			}
		}
	}
}

// spread reports whether user i is one of a fraction f of the users,
// spread evenly: it is when the running count of chosen users steps up at
// i.
func spread(i int, f float64) bool {
	return f > 0 && int(float64(i+1)*f) > int(float64(i)*f)
}

// Plan returns the users and groups the population needs on the server.
func (p *Population) Plan() Plan {
	users := make([]string, len(p.users))
	var direct []Pair
	for i, u := range p.users {
		users[i] = u.name
		if u.direct != nil {
			direct = append(direct, Pair{From: u.name, To: u.direct.to})
		}
	}
	if o := p.opts; o.CrossPeer != "" {
		direct = append(direct, Pair{From: p.users[0].name, To: o.CrossPeer})
	}
	if o := p.opts; o.CrossFrom != "" {
		direct = append(direct, Pair{From: o.CrossFrom, To: p.users[0].name})
	}
	return Plan{Users: users, Groups: p.groups, Direct: direct}
}

// Users returns the number of users.
func (p *Population) Users() int { return len(p.users) }

// Late reports whether user i logs in late.
func (p *Population) Late(i int) bool { return p.users[i].late }

// Slow reports whether user i is a slow reader.
func (p *Population) Slow(i int) bool { return p.users[i].slow }

// SlowReaderLag returns the largest delivery lag, in messages, of an online
// slow reader at the last sweep.
func (p *Population) SlowReaderLag() int64 { return p.slowLag.Load() }

// LoggedIn returns how many distinct users have logged in at least once.
func (p *Population) LoggedIn() int {
	n := 0
	for _, u := range p.users {
		if u.everOnline.Load() {
			n++
		}
	}
	return n
}

// Inflight returns how many messages await their ack.
func (p *Population) Inflight() int {
	n := 0
	for _, u := range p.users {
		u.mu.Lock()
		n += len(u.inflight)
		u.mu.Unlock()
	}
	return n
}

// Online returns the number of sessions online.
func (p *Population) Online() int { return int(p.online.Load()) }

// Ready reports whether the whole population has been online at once.
func (p *Population) Ready() bool { return p.ready.Load() }

// SetSending pauses (false) or resumes (true) sending. Intended send times
// keep advancing while paused, so resuming does not burst.
func (p *Population) SetSending(on bool) { p.paused.Store(!on) }

// Ledger returns the population's ledger.
func (p *Population) Ledger() *Ledger { return p.ledger }

// Run provisions the plan, then keeps the population online and sending
// until ctx ends. It returns after every session is closed and every
// goroutine it started has exited.
func (p *Population) Run(ctx context.Context) error {
	o := p.opts
	p.ctx = ctx
	if !o.Block {
		o.Set.Wanted.Set(float64(o.Users))
	}
	if err := p.provision(ctx); err != nil {
		return err
	}
	p.dialers = newDialers(ctx, maxDialers, dialerIdle)
	// The dialers exit when ctx ends, once the users (who wait for their
	// connects) have.
	defer p.dialers.wait()
	var wg sync.WaitGroup
	start := time.Now()
	if !o.StartPaused {
		p.holdUntil.Store(start.Add(p.Ramp() + o.LateAfter + readyGrace).UnixNano())
	}
	for _, u := range p.users {
		// Exits when ctx ends, after closing its session.
		wg.Go(func() { p.runUser(ctx, u, start) })
	}
	if o.Rate > 0 {
		shards := runtime.GOMAXPROCS(0)
		for s := range shards {
			// Exits when ctx ends.
			wg.Go(func() { p.sender(ctx, s, shards, start) })
		}
	}
	// Both exit when ctx ends.
	wg.Go(func() { p.heartbeat(ctx) })
	wg.Go(func() { p.sweeper(ctx) })
	wg.Wait()
	if !o.Block {
		o.Set.Ready.Set(0)
	}
	return nil
}

// Ramp returns how long the first logins take at the least: Options.Ramp,
// or longer when MaxConnectRate cannot log every user in within it.
func (p *Population) Ramp() time.Duration {
	o := p.opts
	if o.MaxConnectRate <= 0 {
		return o.Ramp
	}
	// Capped, so that a rate of one login an hour cannot overflow the
	// times built on it.
	d := min(float64(o.Users)/o.MaxConnectRate*float64(time.Second), float64(maxRamp))
	return max(o.Ramp, time.Duration(d))
}

// maxRamp bounds Ramp: a population that takes longer to log in is not
// meant to be all online.
const maxRamp = 365 * 24 * time.Hour

// provision retries until the server takes the plan: a daemon that starts
// before its target must wait for it, not exit.
func (p *Population) provision(ctx context.Context) error {
	plan := p.Plan()
	for attempt := 0; ; attempt++ {
		err := p.opts.Driver.Provision(ctx, plan)
		if err == nil {
			if attempt > 0 {
				// Only after a failure: provisioning that works says
				// nothing the first login will not.
				p.opts.Reach.Succeeded()
				p.log.Info("provisioned", "attempts", attempt+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		// A provisioning attempt is a connect attempt that failed
		// before any session: counted as one, under the reason it
		// could not connect for, or provisioning if it did connect.
		err = Provisioning(err)
		reason := p.failed(err)
		// Once per outage: each attempt is counted, and the daemon's
		// watch logs the target's state; a line per retry would bury it.
		log := p.log.Debug
		if attempt == 0 {
			log = p.log.Warn
		}
		log("provisioning failed, retrying", "reason", reason, "err", err)
		if !Sleep(ctx, p.backoff(attempt)) {
			return nil
		}
	}
}

// backoff is exponential with full jitter: uniform in [0, min(max, min·2^n)).
func (p *Population) backoff(attempt int) time.Duration {
	c := p.opts.BackoffMax
	// Shift only while it cannot overflow: a negative cap would panic.
	if attempt < 62 && p.opts.BackoffMin <= c>>attempt {
		c = p.opts.BackoffMin << attempt
	}
	return time.Duration(rand.Int64N(int64(c)) + 1)
}

func (p *Population) runUser(ctx context.Context, u *user, start time.Time) {
	o := p.opts
	var at time.Time
	if o.Users > 1 && o.Ramp > 0 {
		at = start.Add(time.Duration(int64(o.Ramp) * int64(u.idx) / int64(o.Users)))
	}
	if u.late && start.Add(o.LateAfter).After(at) {
		at = start.Add(o.LateAfter)
	}
	if !Sleep(ctx, time.Until(at)) {
		return
	}
	obs := o.Observer
	for attempt := 0; ctx.Err() == nil; attempt++ {
		// Before t0: the wait is imcanary's, not the server's login time.
		if !p.awaitConnect(ctx) {
			return
		}
		t0 := time.Now()
		sess, err := p.connect(ctx, u)
		if obs != nil && ctx.Err() == nil {
			obs.Login(u.idx, time.Since(t0), err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			reason := p.failed(err)
			p.log.Debug("connect failed", "user", u.name, "reason", reason, "err", err)
			if !Sleep(ctx, p.backoff(attempt)) {
				return
			}
			continue
		}
		o.Set.ConnectOK.Inc()
		o.Reach.Succeeded()
		began := time.Now()
		u.mu.Lock()
		u.sess = sess
		u.sessStart = time.Now().UnixNano()
		u.mu.Unlock()
		u.nextPause = 0
		u.everOnline.Store(true)
		o.Set.Online.Inc()
		if p.online.Add(1) == int64(o.Users) && !p.ready.Swap(true) {
			if !o.Block {
				o.Set.Ready.Set(1)
			}
			p.log.Info("population online", "users", o.Users, "took", time.Since(start).Round(time.Millisecond))
		}
		stop := context.AfterFunc(ctx, func() { _ = sess.Close() })
		var churned atomic.Bool
		var lifetime *time.Timer
		if o.SessionLifetime > 0 {
			life := time.Duration(rand.ExpFloat64() * float64(o.SessionLifetime))
			lifetime = time.AfterFunc(life, func() { churned.Store(true); _ = sess.Close() })
		}
		err = sess.Serve(u)
		if lifetime != nil {
			lifetime.Stop()
		}
		stop()
		_ = sess.Close()
		o.Set.Online.Dec()
		p.online.Add(-1)
		reason := ReasonOf(err)
		if churned.Load() && ctx.Err() == nil {
			reason = metrics.ReasonChurn
		}
		o.Set.Disconnects[reason].Inc()
		if obs != nil {
			obs.Disconnect(u.idx, reason, err)
		}
		u.endSession()
		if ctx.Err() != nil {
			return
		}
		p.log.Debug("session ended", "user", u.name, "reason", reason, "err", err)
		// A session that held for a while earns a fresh backoff; one the
		// server kills at once keeps backing off, so a flapping server
		// is not stormed.
		if time.Since(began) > o.BackoffMax || reason == metrics.ReasonChurn {
			attempt = 0
		}
		if !Sleep(ctx, p.backoff(attempt)) {
			return
		}
	}
}

// failed counts a failed connect, login or provisioning attempt under its
// reason and tells Reach; it returns the reason.
func (p *Population) failed(err error) string {
	reason := FailureReason(err)
	p.opts.Set.Failed(reason)
	p.opts.Reach.Failed(reason, err)
	return reason
}

// connect runs the driver's Connect on one of the population's dialers (see
// dialers).
func (p *Population) connect(ctx context.Context, u *user) (Session, error) {
	// Slow readers dial as a slow link; a user keeps its source address
	// across reconnects.
	link := Link{Slow: u.slow}
	if a := p.opts.SourceAddrs; len(a) > 0 {
		link.Source = a[u.idx%len(a)]
	}
	return p.dialers.do(ctx, func() (Session, error) { return p.opts.Driver.Connect(ctx, u.name, link) })
}

// awaitConnect takes the token of one connect attempt, waiting as long as
// MaxConnectRate requires, and reports whether ctx is still live.
func (p *Population) awaitConnect(ctx context.Context) bool {
	if p.connects == nil {
		return ctx.Err() == nil
	}
	r := p.connects.Reserve() // always OK: one token, burst at least 1
	d := r.Delay()
	if d <= 0 {
		return ctx.Err() == nil
	}
	p.held.Add(1)
	// Should ctx end, the token is not given back: the population ends
	// with it.
	live := Sleep(ctx, d)
	waiting := p.held.Add(-1)
	if live {
		p.noteHeldBack(d, waiting)
	}
	return live
}

// noteHeldBack logs, at most once a second, an attempt that the rate limit
// held back for d and how many still wait: a mass reconnect is held back
// by design, and an operator wondering why sessions come back slowly sees
// it at Debug, a line a second while it lasts.
func (p *Population) noteHeldBack(d time.Duration, waiting int64) {
	now := time.Now().UnixNano()
	last := p.heldLogged.Load()
	if now-last < int64(time.Second) || !p.heldLogged.CompareAndSwap(last, now) {
		return
	}
	p.log.Debug("connects held back by population.max_connect_rate",
		"max_connect_rate", p.opts.MaxConnectRate, "waited", d.Round(time.Millisecond), "waiting", waiting)
}

// endSession writes off every message of the ended session that the server
// never acknowledged.
func (u *user) endSession() {
	set := u.p.opts.Set
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sess = nil
	for _, f := range u.inflight {
		f.st.addVoid(f.seq)
		u.unacked(f.ref, metrics.SendDisconnected, "")
	}
	if n := len(u.inflight); n > 0 {
		set.SendErrors[metrics.SendDisconnected].Add(float64(n))
	}
	u.inflight = u.inflight[:0]
}

// OnAck implements Handler.
func (u *user) OnAck(ref uint64, _ Ack) {
	now := time.Now().UnixNano()
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		st := f.st
		st.acked = max(st.acked, f.seq)
		st.acks[f.seq%ackRing] = ackStamp{seq: f.seq, at: now}
	}
	u.mu.Unlock()
	if !ok {
		// Already written off after an ack timeout.
		return
	}
	ks := &u.p.opts.Set.Kind[f.st.kind]
	ks.AckLatency.Observe(float64(now-f.sentAt) / 1e9)
	if n := f.st.fanout - f.st.slowFanout; n > 0 {
		ks.Cohort[0].Expected.Add(float64(n))
	}
	if f.st.slowFanout > 0 {
		ks.Cohort[1].Expected.Add(float64(f.st.slowFanout))
	}
	if obs := u.p.opts.Observer; obs != nil {
		obs.Ack(ref, f.st.kind == 1, time.Duration(now-f.sentAt))
	}
}

// unacked tells the observer, if any, that ref was written off.
func (u *user) unacked(ref uint64, reason, code string) {
	if obs := u.p.opts.Observer; obs != nil {
		obs.Unacked(ref, reason, code)
	}
}

// OnReject implements Handler.
func (u *user) OnReject(ref uint64, reason string) {
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		f.st.addVoid(f.seq)
		u.unacked(ref, metrics.SendRejected, reason)
	}
	u.mu.Unlock()
	if ok {
		u.p.opts.Set.SendErrors[metrics.SendRejected].Inc()
		u.p.log.Debug("message rejected", "user", u.name, "reason", reason)
	}
}

// OnDelivery implements Handler. Latency is measured to when the frame was
// read off the socket when the adapter says so; the time from there to the
// ledger is the prober's own receive lag, recorded apart.
func (u *user) OnDelivery(d *Delivery) {
	at := d.At
	if at == 0 {
		at = time.Now().UnixNano()
	}
	u.inbox.Receive(d.Body, at)
	p := u.p
	if u.slow {
		u.readSlowly()
		return
	}
	if h := p.opts.Health; h != nil && d.At != 0 {
		h.ReceiveLag(time.Duration(time.Now().UnixNano() - d.At))
	}
}

// readSlowly holds a slow reader's read loop: the frames behind this one
// wait in the socket buffers, and then on the server.
func (u *user) readSlowly() {
	sr := u.p.opts.SlowReaders
	if sr.Pause > 0 && u.nextPause >= 0 && time.Now().UnixNano() >= u.nextPause {
		u.nextPause = -1
		if sr.PauseEvery > 0 {
			u.nextPause = time.Now().Add(sr.Pause + sr.PauseEvery).UnixNano()
		}
		Sleep(u.p.ctx, sr.Pause)
	}
	if sr.ReadDelay > 0 {
		Sleep(u.p.ctx, sr.ReadDelay)
	}
}

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
	i := st.voidTurn % len(st.voids)
	st.voidTurn++
	v := &st.voids[i]
	lo, hi = v.lo, v.hi
	if v.left--; v.left == 0 {
		st.voids = append(st.voids[:i], st.voids[i+1:]...)
	}
	return lo, hi
}

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
	interval := int64(float64(time.Second) / o.Rate)
	var h userHeap
	for i := shard; i < len(p.users); i += shards {
		u := p.users[i]
		if (u.direct == nil && u.group == nil) || u.slow {
			continue
		}
		// First send: after the user's ramp slot, at a random phase, so
		// that users do not send in lockstep.
		u.next = start.UnixNano() + int64(o.Ramp)*int64(u.idx)/int64(o.Users) + rand.Int64N(interval) + 1
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
		if wait := time.Until(time.Unix(0, u.next)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		if !p.paused.Load() && (p.ready.Load() || u.next > p.holdUntil.Load()) {
			if h := o.Health; h != nil {
				h.SendLag(time.Duration(time.Now().UnixNano() - u.next))
			}
			buf = p.send(u, u.next, buf)
		}
		u.next += interval
		heap.Fix(&h, 0)
	}
}

// send writes one message of u with the given intended time, alternating
// direct and group. buf is scratch space, returned for reuse.
func (p *Population) send(u *user, intended int64, buf []byte) []byte {
	u.mu.Lock()
	st := u.direct
	if u.group != nil && (u.toggle || st == nil) {
		st = u.group
	}
	u.toggle = !u.toggle
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
		st = u.group
	}
	if st == nil {
		return Sent{}, fmt.Errorf("user %s has no %s peer", u.name, map[bool]string{false: "direct", true: "group"}[group])
	}
	now := time.Now()
	u.mu.Lock()
	_, s, err := p.sendOn(u, st, now.UnixNano(), nil)
	s.Intended = now
	return s, err
}

// sendOn writes one message of u on st with the given intended time. It is
// called with u.mu held and releases it. buf is scratch space, returned for
// reuse.
func (p *Population) sendOn(u *user, st *sendStream, intended int64, buf []byte) ([]byte, Sent, error) {
	set := p.opts.Set
	sess := u.sess
	if sess == nil {
		u.mu.Unlock()
		set.SendErrors[metrics.SendOffline].Inc()
		return buf, Sent{}, errOffline
	}
	st.seq++
	h := Header{Run: p.run, Sender: u.nameB, Stream: st.name, Seq: st.seq, Intended: intended}
	h.VoidLo, h.VoidHi = st.takeVoid()
	ref := p.refs.Add(1)
	if len(u.inflight) >= maxInflight {
		old := u.inflight[0]
		u.inflight = u.inflight[1:]
		old.st.addVoid(old.seq)
		set.SendErrors[metrics.SendAckTimeout].Inc()
		u.unacked(old.ref, metrics.SendAckTimeout, "")
	}
	u.inflight = append(u.inflight, flight{ref: ref, st: st, seq: st.seq, sentAt: time.Now().UnixNano()})
	u.mu.Unlock()

	sent := Sent{Ref: ref, Sender: u.name, Stream: st.nameS, Seq: h.Seq, Group: st.kind == 1, Fanout: st.fanout, Recipients: st.recipients}
	buf = AppendBody(buf[:0], &h, p.opts.MessageSize)
	m := Message{Ref: ref, To: st.to, Group: st.group, Body: buf}
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

// heartbeat pings every online session once per Heartbeat, spread evenly
// over the interval so that pings do not arrive at the server in a burst.
func (p *Population) heartbeat(ctx context.Context) {
	tick := min(p.opts.Heartbeat/10, time.Second)
	// Rounded up, so that every session is pinged at least once per
	// Heartbeat.
	perTick := max(1, int((int64(len(p.users))*int64(tick)+int64(p.opts.Heartbeat)-1)/int64(p.opts.Heartbeat)))
	t := time.NewTicker(tick)
	defer t.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for range min(perTick, len(p.users)) {
			u := p.users[next]
			next = (next + 1) % len(p.users)
			u.mu.Lock()
			sess := u.sess
			u.mu.Unlock()
			if sess != nil {
				// A failed ping surfaces in Serve, which classifies it.
				_ = sess.Ping()
			}
		}
	}
}

// sweeper writes off acks that did not come within the deadline and
// deliveries missing past lost_after.
func (p *Population) sweeper(ctx context.Context) {
	// Often enough to write off losses on time and to flag a stalled
	// session within a deadline: the lag threshold is half of one.
	every := max(min(p.opts.LostAfter/4, p.opts.LagThreshold/2, time.Second), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.Sweep(time.Now())
	}
}

// Sweep runs one sweep at now; the sweeper calls it, and tests call it to
// settle the ledger at a moment of their choosing.
func (p *Population) Sweep(now time.Time) {
	set := p.opts.Set
	ns := now.UnixNano()
	deadline := int64(p.opts.Deadline)
	var lagging, slowLag int64
	p.sweepMu.Lock()
	defer p.sweepMu.Unlock()
	for _, u := range p.users {
		u.mu.Lock()
		n := 0
		for _, f := range u.inflight {
			if ns-f.sentAt > deadline {
				f.st.addVoid(f.seq)
				set.SendErrors[metrics.SendAckTimeout].Inc()
				u.unacked(f.ref, metrics.SendAckTimeout, "")
				continue
			}
			u.inflight[n] = f
			n++
		}
		u.inflight = u.inflight[:n]
		online := u.sess != nil
		sessStart := u.sessStart
		u.mu.Unlock()
		u.inbox.Sweep(ns)
		lag, stalled := p.lag(u, online, sessStart, ns)
		switch {
		case !online:
		case u.slow:
			slowLag = max(slowLag, lag)
		default:
			set.DeliveryLag.Observe(float64(lag))
			if stalled {
				lagging++
			}
		}
	}
	set.Streams.Set(float64(p.ledger.Streams()))
	set.SessionsLagging.Set(float64(lagging))
	p.slowLag.Store(slowLag)
}

// lag returns how many messages the server acknowledged to u's streams that
// u has not received, and whether one of them has waited, with nothing
// later of its stream received, longer than the lag threshold while u was
// online: a session the server has silently stopped serving. A message
// lost on the way is not lag once a later one of its stream arrives; the
// ledger counts it as lost.
func (p *Population) lag(u *user, online bool, sessStart, now int64) (lag int64, stalled bool) {
	if !online {
		for i := range u.incoming {
			u.incoming[i].waitSeq = 0
		}
		return 0, false
	}
	seen := p.lagScratch[:0]
	u.inbox.mu.Lock()
	for _, l := range u.incoming {
		var m uint64
		if st := u.inbox.streams[l.st.key]; st != nil {
			m = st.maxSeen
		}
		seen = append(seen, m)
	}
	u.inbox.mu.Unlock()
	p.lagScratch = seen
	threshold := int64(p.opts.LagThreshold)
	for i := range u.incoming {
		l := &u.incoming[i]
		sender := p.users[l.st.from]
		sender.mu.Lock()
		acked := l.st.acked
		want := seen[i] + 1
		var ackedAt int64
		if acked >= want {
			a := l.st.acks[want%ackRing]
			if a.seq != want {
				// Too far behind for the ring: time it from the
				// oldest ack kept, which is later than its own.
				a = l.st.acks[(acked+1)%ackRing]
			}
			ackedAt = a.at
		}
		sender.mu.Unlock()
		if acked < want {
			l.waitSeq = 0
			continue
		}
		lag += int64(acked - seen[i])
		if l.waitSeq != want {
			l.waitSeq, l.since = want, max(ackedAt, sessStart)
		}
		if now-l.since > threshold {
			stalled = true
		}
	}
	return lag, stalled
}

// Sleep waits for d or until ctx ends, and reports whether ctx is still
// live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
