package probe

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/imcanary/imcanary/metrics"
)

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
	// readyC is closed when ready is first set, for WaitReady.
	readyC chan struct{}
	// waiters counts WaitOnline's callers; while there are any, a change
	// of online closes onlineC (and makes a new one) to wake them. With
	// none, a login pays one atomic load for it.
	waiters  atomic.Int32
	onlineMu sync.Mutex
	onlineC  chan struct{}
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

// NewPopulation builds a population; nothing runs until Run. The
// configuration's rules are config's, checked when it is loaded; what
// NewPopulation refuses is only what its own code cannot run with (a
// ticker of no period, a group of one, a ledger that writes a message off
// before it is late), named by the Options field.
func NewPopulation(o Options) (*Population, error) {
	bad := func(format string, args ...any) (*Population, error) {
		return nil, fmt.Errorf("probe.NewPopulation: "+format, args...)
	}
	switch {
	case o.Driver == nil:
		return bad("no Driver")
	case o.Users < 1:
		return bad("Users %d, want at least 1", o.Users)
	case o.GroupSize < 2:
		return bad("GroupSize %d, want at least 2", o.GroupSize)
	case o.Deadline <= 0 || o.LostAfter < 2*o.Deadline:
		return bad("Deadline %v, LostAfter %v: want a positive Deadline and LostAfter at least twice it", o.Deadline, o.LostAfter)
	case o.Heartbeat <= 0 || o.BackoffMin <= 0 || o.BackoffMax < o.BackoffMin:
		return bad("Heartbeat %v, BackoffMin %v, BackoffMax %v: want all positive, BackoffMax at least BackoffMin", o.Heartbeat, o.BackoffMin, o.BackoffMax)
	case o.SlowReaders.Fraction < 0 || o.SlowReaders.Fraction >= 1:
		return bad("SlowReaders.Fraction %v, want at least 0 and below 1", o.SlowReaders.Fraction)
	case o.SlowReaders.ReadDelay < 0 || o.SlowReaders.Pause < 0 || o.SlowReaders.PauseEvery < 0:
		return bad("SlowReaders %+v: want no negative duration", o.SlowReaders)
	case o.LagThreshold < 0:
		return bad("LagThreshold %v, want at least 0", o.LagThreshold)
	case o.Offset < 0 || o.GroupOffset < 0:
		return bad("Offset %d, GroupOffset %d: want at least 0", o.Offset, o.GroupOffset)
	case !(o.MaxConnectRate >= 0):
		return bad("MaxConnectRate %v, want at least 0", o.MaxConnectRate)
	}
	if o.LagThreshold == 0 {
		o.LagThreshold = o.Deadline / 2
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Population{
		opts:    o,
		log:     o.Logger,
		ledger:  NewLedger(o.Set, o.Run, time.Now(), o.Deadline, o.LostAfter),
		run:     []byte(o.Run),
		readyC:  make(chan struct{}),
		onlineC: make(chan struct{}),
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
		p.users[i].inbox.cohort = metrics.CohortOf(p.users[i].slow)
	}
	n := o.Users
	for i, u := range p.users {
		peer := i ^ 1
		if peer >= n {
			peer = i - 1
		}
		if peer >= 0 && peer != i {
			pn := p.users[peer].name
			u.direct = &sendStream{name: []byte("d." + pn), nameS: "d." + pn, to: pn, kind: metrics.Direct, fanout: 1, recipients: []int{peer}}
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
			u.group = &sendStream{name: []byte("g." + grp.Name), nameS: "g." + grp.Name, group: grp.Name, kind: metrics.Group,
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

// WaitReady waits until the whole population has been online at once, or
// ctx ends, and reports Ready.
func (p *Population) WaitReady(ctx context.Context) bool {
	select {
	case <-p.readyC:
	case <-ctx.Done():
	}
	return p.Ready()
}

// WaitOnline waits until at least n sessions are online, or ctx ends, and
// reports whether they are.
func (p *Population) WaitOnline(ctx context.Context, n int) bool {
	p.waiters.Add(1)
	defer p.waiters.Add(-1)
	for {
		// The channel is taken before online is read: a change after
		// the read closes this channel, so none is missed.
		p.onlineMu.Lock()
		c := p.onlineC
		p.onlineMu.Unlock()
		if p.Online() >= n {
			return true
		}
		select {
		case <-c:
		case <-ctx.Done():
			return p.Online() >= n
		}
	}
}

// addOnline counts a session in (+1) or out (-1), waking WaitOnline's
// callers, and returns how many are online.
func (p *Population) addOnline(d int64) int64 {
	n := p.online.Add(d)
	if p.waiters.Load() > 0 {
		p.onlineMu.Lock()
		close(p.onlineC)
		p.onlineC = make(chan struct{})
		p.onlineMu.Unlock()
	}
	return n
}

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
