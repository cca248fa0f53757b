package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Population keeps Users × Devices sessions online, sends open-loop traffic
// between the users and counts every delivery in a Ledger.
//
// Goroutines, all owned by Run and gone when it returns: one per device
// (its session's read loop, then its reconnect backoff), one sender per
// CPU, one heartbeat loop, one sync loop with catch-up, one regroup loop
// with membership churn, and one sweeper. Sending is not a goroutine per
// user: at tens of thousands of users a second stack per user would double
// the prober's memory.
type Population struct {
	opts    Options
	dialers *dialers
	// devices counts the devices still running: a device's connects and
	// sessions run on a goroutine while it connects or is served, and on
	// none while its session is watched or it waits to reconnect after
	// one.
	devices sync.WaitGroup
	// poller watches the sessions that can be read without a goroutine
	// of their own (Options.Reactor); nil without.
	poller *netpoll.Poller
	// started is when Run began.
	started time.Time
	// served counts the sessions read by a goroutine of their own
	// (Serve), as opposed to watched by the poller.
	served atomic.Int64
	log    *slog.Logger
	ends   *endLog
	ledger *Ledger
	users  []*user
	groups []probe.Group
	run    []byte

	refs   atomic.Uint64
	online atomic.Int64
	ready  atomic.Bool
	// provisioned is set once the plan is provisioned and sessions
	// start to log in.
	provisioned atomic.Bool
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
	// sending counts the sends past their check of paused and not yet on
	// record (in flight, or failed): a pause waits for it to reach zero.
	// Without that, a drain could read the counts between a send's check
	// and its record, find everything accounted for, and miss the message
	// whose ack (and the deliveries it makes owed) came a moment later.
	// An atomic and not a lock, so that a pause waiting on a send held
	// in its write stays a durable wait under testing/synctest.
	sending atomic.Int64
	// holdUntil (Unix ns) holds sending until the whole population is
	// online, or this time at the latest: a group message sent before
	// every member has logged in (joined the room, subscribed to the
	// channel) would be lost for the late members on protocols that keep
	// nothing for absent members, and counted as such.
	holdUntil atomic.Int64
	// ctx is Run's context: slow readers sleep on it, so that shutdown
	// does not wait out a pause.
	ctx context.Context
	// mirror is set when the server delivers what a user sends to the
	// user's other devices too, and the population owes it to them.
	mirror bool
	// classes is the behaviour mix, empty without one; churn is set when
	// one of its classes leaves and rejoins groups.
	classes []class
	churn   bool
	// slowLag is the largest delivery lag of a slow reader at the last
	// sweep, for the drill report.
	slowLag atomic.Int64
	// sweepMu serialises sweeps: the sweeper's and a test's may overlap,
	// and the lag state of each link belongs to the sweep.
	sweepMu    sync.Mutex
	lagScratch []uint64

	// connects is the token bucket every connect attempt draws from; nil
	// when MaxConnectRate is 0.
	connects *ConnectLimiter
	// held counts the attempts waiting for their token; heldLogged (Unix
	// ns) is when that was last logged.
	held       atomic.Int64
	heldLogged atomic.Int64

	// clock estimates the cross-shard peers' clock offsets; nil without
	// a cross-shard peer.
	clock *crossClock
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
		return nil, fmt.Errorf("engine.NewPopulation: "+format, args...)
	}
	switch {
	case o.Driver == nil:
		return bad("no Driver")
	case o.Users < 1:
		return bad("Users %d, want at least 1", o.Users)
	case o.GroupSize < 2 && len(o.Groups) == 0:
		return bad("GroupSize %d, want at least 2", o.GroupSize)
	case o.Devices < 0 || o.Devices > MaxDevices:
		return bad("Devices %d, want 1 to %d", o.Devices, MaxDevices)
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
	case o.MaxClockUncertainty < 0:
		return bad("MaxClockUncertainty %v, want at least 0", o.MaxClockUncertainty)
	case o.Slice.Across() && (o.Slice.Lo < 0 || o.Slice.Lo >= o.Slice.Hi || o.Slice.Hi > o.Users):
		return bad("Slice %+v of %d users: want 0 ≤ Lo < Hi ≤ Users", o.Slice, o.Users)
	case o.Slice.Across() && o.CrossPeer != "":
		return bad("Slice and CrossPeer: a population laid out across shards has no cross-shard peer of its own")
	}
	for _, g := range o.Groups {
		if g.Size < 2 || g.Count < 0 {
			return bad("Groups %+v: want Size at least 2 and Count at least 0", g)
		}
	}
	if o.LagThreshold == 0 {
		o.LagThreshold = o.Deadline / 2
	}
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Population{
		opts:    o,
		log:     o.Logger,
		ends:    newEndLog(o.Logger),
		ledger:  NewLedger(o.Set, o.Run, time.Now(), o.Deadline, o.LostAfter),
		run:     []byte(o.Run),
		readyC:  make(chan struct{}),
		onlineC: make(chan struct{}),
	}
	p.ledger.obs = o.Observer
	p.ledger.health = o.Health
	p.ledger.lost = newLostLog(o.Logger.With("ledger", "lost"))
	p.clock = newCrossClock(p)
	p.ledger.clock, p.ledger.shift = p.clock, int64(o.TestClockOffset)
	if o.Slice.Across() && o.ShardClock != nil {
		untrusted := o.ShardClockUntrusted
		if untrusted == nil {
			untrusted = prometheus.NewCounter(prometheus.CounterOpts{Name: "unexported"})
		}
		p.ledger.shards = &shardClocks{offset: o.ShardClock, untrusted: untrusted, slice: o.Slice, users: o.Users, first: o.Offset}
	}
	switch {
	case o.Limiter != nil:
		p.connects = o.Limiter
	case o.MaxConnectRate > 0:
		p.connects = NewConnectLimiter(o.MaxConnectRate)
	}
	p.paused.Store(o.StartPaused)
	var err error
	if p.classes, err = classesOf(o.Behaviours); err != nil {
		return bad("%v", err)
	}
	for _, c := range p.classes {
		p.churn = p.churn || c.churn > 0
	}
	if _, ok := o.Driver.(probe.Regrouper); p.churn && !ok {
		return bad("a behaviour class churns group membership, which this protocol's driver cannot change at run time")
	}
	if p.churn && o.Slice.Across() {
		// A sender owes a group message to the members present when
		// the server accepted it; it cannot see the membership changes
		// of members in other shards.
		return bad("a behaviour class churns group membership, which a population laid out across shards cannot follow yet")
	}
	p.layout()
	return p, nil
}

// layout names the users and their devices, pairs the users for direct
// chats and groups them, and tells the ledger who is owed each stream.
func (p *Population) layout() {
	o := p.opts
	mirror := false
	if m, ok := o.Driver.(probe.Mirror); ok && o.Devices > 1 {
		mirror = m.MirrorsOwn()
	}
	p.mirror = mirror
	p.layoutUsers()
	p.layoutDirect()
	p.layoutGroups()
	if o.CrossPeer != "" {
		// No recipients here: the peer's own process receives it, on
		// however many devices it has; each process has the same.
		peer := o.CrossPeer
		p.users[0].cross = &sendStream{name: []byte("d." + peer), nameS: "d." + peer, fanout: int32(o.Devices), dst: -1}
	}
	p.layoutOwed()
}

// layoutUsers makes the users and their devices, each device with its
// inbox (and catch-up position, with catch-up on).
func (p *Population) layoutUsers() {
	o, mirror := p.opts, p.mirror
	p.users = make([]*user, o.Users)
	for i := range p.users {
		name := fmt.Sprintf("%s-u%d", o.Prefix, o.Offset+i)
		u := &user{p: p, idx: int32(i), name: name, nameB: []byte(name), remote: !p.local(i)}
		// Half the users start with a group message: if all alternated
		// in phase, group fan-out would come in bursts every other
		// interval.
		u.toggle = i%2 == 1
		// Spread late users evenly: user i is late when the running
		// count of late users steps up at i.
		u.late = spread(i, o.LateFraction)
		// Offset by half a user, so that a run with both late users and
		// slow readers does not pick the same users for both.
		u.slow = spread(i+o.Users/2, o.SlowReaders.Fraction)
		u.class = -1
		if o.Rate > 0 {
			u.interval = int64(float64(time.Second) / o.Rate)
		}
		if len(o.Behaviours) > 0 {
			u.class = int32(classOf(i, o.Behaviours))
			u.interval = p.classes[u.class].interval
		}
		if u.remote {
			// Another shard's: named, and owed deliveries by this
			// shard's senders, but it neither logs in nor sends here.
			u.interval = 0
			p.users[i] = u
			continue
		}
		for d := range o.Devices {
			in := p.ledger.NewInbox()
			in.user, in.cohort, in.self, in.ownOwed = int32(i), metrics.CohortOf(u.slow), u.nameB, mirror
			in.dev = int32(d)
			dev := &device{u: u, idx: int32(d), inbox: in}
			if o.CatchUp {
				dev.catchup = probe.NewCatchup(p.catchupGrace())
			}
			u.devices = append(u.devices, dev)
		}
		p.users[i] = u
	}
}

// layoutDirect pairs each user with a neighbour for direct chats.
func (p *Population) layoutDirect() {
	n := p.opts.Users
	for i, u := range p.users {
		peer := i ^ 1
		if peer >= n {
			peer = i - 1
		}
		if peer >= 0 && peer != i && !u.remote {
			// The pair is one conversation either way: a peer in
			// another shard sends to u as well.
			u.remoteIn = p.users[peer].remote
			pn := p.users[peer].name
			u.direct = &sendStream{name: []byte("d." + pn), nameS: "d." + pn, kind: metrics.Direct, dst: int32(peer)}
		}
	}
}

// layoutGroups makes the groups (groupLayout) and each member's send
// stream in each.
func (p *Population) layoutGroups() {
	o := p.opts
	for _, members := range p.groupLayout() {
		grp := probe.Group{Name: fmt.Sprintf("%s-g%d", o.Prefix, o.GroupOffset+len(p.groups))}
		for _, m := range members {
			grp.Members = append(grp.Members, p.users[m].name)
		}
		gs := newGroupState(len(p.groups), members)
		nameS := "g." + grp.Name
		name := []byte(nameS)
		spans := slices.ContainsFunc(members, func(m int) bool { return p.users[m].remote })
		for pos, m := range members {
			if p.users[m].remote {
				continue
			}
			p.users[m].remoteIn = p.users[m].remoteIn || spans
			st := &sendStream{name: name, nameS: nameS, kind: metrics.Group,
				fan: &fanout{obs: o.Set.Fanout[metrics.SizeClassOf(len(members))]}, grp: gs, pos: int32(pos), dst: -1}
			p.users[m].groups = append(p.users[m].groups, st)
		}
		p.groups = append(p.groups, grp)
	}
}

// layoutOwed registers every send stream with the ledger (its fan-out
// tracker and ack record) and links it to each device owed its messages:
// every device of each recipient, and with mirroring the sender's own
// other devices.
func (p *Population) layoutOwed() {
	o, mirror := p.opts, p.mirror
	p.ledger.sends = make(map[string]*sendStream)
	gates := map[prometheus.Observer]*exemplarGate{}
	for _, u := range p.users {
		for _, st := range u.streams() {
			st.key, st.from = o.Run+" "+u.name+" "+st.nameS, u.idx
			if st.fan != nil {
				if gates[st.fan.obs] == nil {
					gates[st.fan.obs] = &exemplarGate{}
				}
				st.fan.key, st.fan.slow, st.fan.gate = st.key, p.ledger.slow, gates[st.fan.obs]
			}
			st.fate = &fate{}
			p.ledger.sends[st.key] = st
			owe := func(dev *device, pos int) {
				dev.incoming = append(dev.incoming, link{st: st, pos: pos})
				st.fanout++
				if dev.u.slow {
					st.slowFanout++
				}
			}
			for r, pos := range st.recipients() {
				if ru := p.users[r]; ru.remote {
					// Counted here, checked there.
					st.fanout += int32(o.Devices)
					if ru.slow {
						st.slowFanout += int32(o.Devices)
					}
					continue
				}
				for _, dev := range p.users[r].devices {
					owe(dev, pos)
				}
			}
			if mirror && st != u.cross {
				pos := -1
				if st.grp != nil {
					pos = int(st.pos)
				}
				// Every device of the sender may send, so every
				// one receives the stream; each message is owed to
				// all but the one that sent it.
				for _, dev := range u.devices {
					dev.incoming = append(dev.incoming, link{st: st, pos: pos})
				}
				st.fanout += int32(len(u.devices) - 1)
				st.mirrored = int32(len(u.devices) - 1)
			}
		}
	}
	// Each device's links were grown by appends, to up to twice what
	// they hold; they are kept for the run, so at their size.
	for _, u := range p.users {
		for _, dev := range u.devices {
			dev.incoming = slices.Clone(dev.incoming)
		}
	}
}

// streams returns the user's send streams.
func (u *user) streams() []*sendStream {
	out := make([]*sendStream, 0, 2+len(u.groups))
	if u.direct != nil {
		out = append(out, u.direct)
	}
	out = append(out, u.groups...)
	if u.cross != nil {
		out = append(out, u.cross)
	}
	return out
}

// groupLayout returns the members of each group, as user indices: groups
// of GroupSize in order, or the mix of Options.Groups. A mix places each
// group on the users after the last group's, wrapping around, so that
// with more places than users each user is in several groups and every
// user in about as many.
func (p *Population) groupLayout() [][]int {
	o := p.opts
	n := o.Users
	var out [][]int
	if len(o.Groups) == 0 {
		// A last group of one joins the one before it, since a group
		// of one delivers nothing.
		for start := 0; start < n; {
			end := min(start+o.GroupSize, n)
			if n-end == 1 {
				end = n
			}
			if end-start < 2 {
				break
			}
			g := make([]int, 0, end-start)
			for i := start; i < end; i++ {
				g = append(g, i)
			}
			out = append(out, g)
			start = end
		}
		return out
	}
	next := 0
	for _, spec := range o.Groups {
		size := min(spec.Size, n)
		if size < 2 {
			continue
		}
		for range spec.Count {
			g := make([]int, size)
			for k := range g {
				g[k] = (next + k) % n
			}
			next = (next + size) % n
			out = append(out, g)
		}
	}
	return out
}

// catchupGrace is how long a device lets a gap in a conversation stand
// before it fetches it: a third of the deadline, so that a push up to a
// quarter of the deadline slower than a later one of its conversation, or
// than the sync answer that named it, still arrives as a push, with a
// twelfth of the deadline to spare for the fetch's own way. A fixed cap
// (it was a second) made a slow but healthy server's pushes recoveries
// once the deadline was past four seconds.
func (p *Population) catchupGrace() time.Duration {
	return p.opts.Deadline / 3
}

// spread reports whether user i is one of a fraction f of the users,
// spread evenly: it is when the running count of chosen users steps up at
// i.
func spread(i int, f float64) bool {
	return f > 0 && int(float64(i+1)*f) > int(float64(i)*f)
}

// Plan returns the users and groups the population needs on the server.
func (p *Population) Plan() probe.Plan {
	if p.opts.Slice.Across() {
		return p.slicePlan()
	}
	users := make([]string, len(p.users))
	var direct []probe.Pair
	for i, u := range p.users {
		users[i] = u.name
		if u.direct != nil {
			direct = append(direct, probe.Pair{From: u.name, To: u.direct.peer()})
		}
	}
	if o := p.opts; o.CrossPeer != "" {
		direct = append(direct, probe.Pair{From: p.users[0].name, To: o.CrossPeer})
	}
	if o := p.opts; o.CrossFrom != "" {
		direct = append(direct, probe.Pair{From: o.CrossFrom, To: p.users[0].name})
	}
	return probe.Plan{Users: users, Groups: p.groups, Direct: direct}
}

// slicePlan is the plan of a slice of a population laid out across
// shards: its own users, every group one of them is in, with all its
// members, and the direct pairs one of them is in, either way (a
// recipient may have to subscribe). Each shard provisions what its users
// need; a group that spans shards is provisioned by each, which
// Provision's idempotence allows.
func (p *Population) slicePlan() probe.Plan {
	sl := p.opts.Slice
	var plan probe.Plan
	for i := sl.Lo; i < sl.Hi; i++ {
		plan.Users = append(plan.Users, p.users[i].name)
	}
	for g, members := range p.groupLayout() {
		if slices.ContainsFunc(members, p.local) {
			plan.Groups = append(plan.Groups, p.groups[g])
		}
	}
	n := p.opts.Users
	for i, u := range p.users {
		peer := i ^ 1
		if peer >= n {
			peer = i - 1
		}
		if peer >= 0 && peer != i && (p.local(i) || p.local(peer)) {
			plan.Direct = append(plan.Direct, probe.Pair{From: u.name, To: p.users[peer].name})
		}
	}
	return plan
}

// OwnGroups returns how many groups this process counts as its own: all,
// but in a population laid out across shards, where a group is the
// shard's of its first member, so that summed over the shards each group
// counts once.
func (p *Population) OwnGroups() int {
	if !p.opts.Slice.Across() {
		return len(p.groups)
	}
	n := 0
	for _, members := range p.groupLayout() {
		if p.local(members[0]) {
			n++
		}
	}
	return n
}

// local reports whether user i is this process's to run: all are, but in
// a population laid out across shards.
func (p *Population) local(i int) bool {
	sl := p.opts.Slice
	return !sl.Across() || (sl.Lo <= i && i < sl.Hi)
}

// localUsers is how many users this process logs in.
func (p *Population) localUsers() int {
	if sl := p.opts.Slice; sl.Across() {
		return sl.Hi - sl.Lo
	}
	return p.opts.Users
}

// Users returns the number of users: of the whole population, where it is
// laid out across shards (see Slice for this process's).
func (p *Population) Users() int { return len(p.users) }

// Slice returns the users this process runs: all of them but in a
// population laid out across shards.
func (p *Population) Slice() Slice {
	if sl := p.opts.Slice; sl.Across() {
		return sl
	}
	return Slice{Lo: 0, Hi: len(p.users)}
}

// Devices returns the number of devices of each user.
func (p *Population) Devices() int { return p.opts.Devices }

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

// Provisioned reports whether the plan has been provisioned: until then
// no session logs in, however long a server takes to make its accounts.
func (p *Population) Provisioned() bool { return p.provisioned.Load() }

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
// keep advancing while paused, so resuming does not burst. A pause returns
// once no send is under way: every message sent before it awaits its ack
// (Inflight) or has been acked or failed. A send blocked on a stalled
// write holds it up to the send deadline.
func (p *Population) SetSending(on bool) {
	p.paused.Store(!on)
	// The sender counts itself before it reads paused, and this reads
	// the count after the store: a send either saw the pause or is
	// counted here.
	for !on && p.sending.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
}

// Ledger returns the population's ledger.
func (p *Population) Ledger() *Ledger { return p.ledger }

// Run provisions the plan, then keeps the population online and sending
// until ctx ends. It returns after every session is closed and every
// goroutine it started has exited.
func (p *Population) Run(ctx context.Context) error {
	o := p.opts
	p.ctx = ctx
	if !o.Block {
		o.Set.Wanted.Set(float64(o.Users * o.Devices))
	}
	if err := p.provision(ctx); err != nil {
		return err
	}
	p.provisioned.Store(true)
	p.dialers = newDialers(ctx, maxDialers, dialerIdle)
	// The dialers exit when ctx ends, once the users (who wait for their
	// connects) have.
	defer p.dialers.wait()
	if o.Reactor {
		switch pl, err := netpoll.New(); {
		case errors.Is(err, netpoll.ErrUnsupported):
			p.log.Info("population.reactor: no epoll on this system; every session is read by a goroutine of its own")
		case err != nil:
			return fmt.Errorf("population.reactor: %w", err)
		default:
			p.poller = pl
			// Closed once every device has ended, and with it every
			// watch.
			defer pl.Close()
		}
	}
	// Every session is closed when ctx ends; its device's loop then
	// sees ctx ended and stops.
	stopClosing := context.AfterFunc(ctx, p.closeSessions)
	defer stopClosing()
	var wg sync.WaitGroup
	start := time.Now()
	p.started = start
	if !o.StartPaused {
		p.holdUntil.Store(start.Add(p.Ramp() + o.LateAfter + readyGrace).UnixNano())
	}
	for _, u := range p.users {
		for _, dev := range u.devices {
			// Done once ctx has ended and its session is closed:
			// devices.Wait below waits for it.
			p.devices.Add(1)
			p.startDevice(ctx, dev, start)
		}
	}
	if p.sends() {
		shards := runtime.GOMAXPROCS(0)
		for s := range shards {
			// Exits when ctx ends.
			wg.Go(func() { p.sender(ctx, s, shards, start) })
		}
	}
	// Each exits when ctx ends.
	wg.Go(func() { p.every(ctx, p.opts.Heartbeat, func(_ *device, s probe.Session) error { return s.Ping() }) })
	wg.Go(func() { p.sweeper(ctx) })
	if o.CatchUp {
		wg.Go(func() { p.every(ctx, p.SyncEvery(), p.syncSession) })
	}
	if p.churn {
		wg.Go(func() { p.regroup(ctx) })
	}
	if p.clock != nil {
		// Exits when ctx ends.
		wg.Go(func() { p.clock.loop(ctx) })
	}
	wg.Wait()
	p.devices.Wait()
	if !o.Block {
		o.Set.Ready.Set(0)
	}
	return nil
}

// Watched is how many sessions the population's poller reads, without a
// goroutine each (Options.Reactor); 0 without one.
func (p *Population) Watched() int {
	if p.poller == nil {
		return 0
	}
	return p.poller.Len()
}

// Served is how many sessions a goroutine of their own reads (Serve):
// every online one without Options.Reactor, those the poller cannot
// watch with it.
func (p *Population) Served() int { return int(p.served.Load()) }

// Ramp returns how long the first logins take at the least: Options.Ramp,
// or longer when MaxConnectRate cannot log every user in within it.
func (p *Population) Ramp() time.Duration {
	o := p.opts
	if o.MaxConnectRate <= 0 {
		return o.Ramp
	}
	// Capped, so that a rate of one login an hour cannot overflow the
	// times built on it.
	d := min(float64(p.localUsers())/o.MaxConnectRate*float64(time.Second), float64(maxRamp))
	return max(o.Ramp, time.Duration(d))
}

// maxRamp bounds Ramp: a population that takes longer to log in is not
// meant to be all online.
const maxRamp = 365 * 24 * time.Hour

// every calls do on every online session once per period, spread evenly
// over it so that the requests do not arrive at the server in a burst:
// the heartbeat's pings, catch-up's syncs.
func (p *Population) every(ctx context.Context, period time.Duration, do func(*device, probe.Session) error) {
	// The devices are walked in place, user by user, rather than listed
	// in a slice of their own: a list per loop was 60 bytes a session.
	n := 0
	for _, u := range p.users {
		n += len(u.devices)
	}
	if n == 0 {
		return
	}
	tick := min(period/10, time.Second)
	// Rounded up, so that every session is served at least once per
	// period.
	perTick := max(1, int((int64(n)*int64(tick)+int64(period)-1)/int64(period)))
	t := time.NewTicker(tick)
	defer t.Stop()
	ui, di := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for range min(perTick, n) {
			for di >= len(p.users[ui].devices) {
				ui, di = (ui+1)%len(p.users), 0
			}
			dev := p.users[ui].devices[di]
			di++
			dev.u.mu.Lock()
			sess := dev.sess
			dev.u.mu.Unlock()
			if sess != nil {
				// A failure surfaces in Serve, which classifies it.
				_ = do(dev, sess)
			}
		}
	}
}

// syncSession asks sess's server what dev missed, if its protocol can and
// something may be missing.
//
// Why the check: a sync is a request and an answer on every online
// session, several per lost_after, and an idle population is owed
// nothing, so it would find nothing. Skipping those keeps an idle
// session's cost at its heartbeat (syncs were about half of an idle
// prober's CPU, 2026-12-04).
func (p *Population) syncSession(dev *device, sess probe.Session) error {
	s, ok := sess.(probe.Syncer)
	if !ok || !p.owes(dev) {
		return nil
	}
	return s.Sync()
}

// owes reports whether a sync of dev could find or fetch anything: dev
// lacks a message it knows of (an open gap, which the answer's frame
// fetches once due), or a stream to it holds a message its server
// acknowledged past the newest dev received, the gap at the end of a
// conversation that only a sync finds. It reads the acks as they are now,
// not as the last sweep saw them, so that a sync is never skipped for a
// message acknowledged since. A stream from a peer shard, whose acks this
// process never sees, is always owed: the canary ring's, and in a
// population laid out across shards, the other shards' senders'.
func (p *Population) owes(dev *device) bool {
	if dev.u.idx == 0 && p.opts.CrossFrom != "" || dev.u.remoteIn || dev.catchup.Lacks() {
		return true
	}
	for i := range dev.incoming {
		// Only st: the sweep owns the rest of the link.
		st := dev.incoming[i].st
		sender := p.users[st.from]
		sender.mu.Lock()
		acked := st.acked
		sender.mu.Unlock()
		if acked == 0 {
			continue
		}
		var seen uint64
		dev.inbox.mu.Lock()
		if in := dev.inbox.streams[st.key]; in != nil {
			seen = in.maxSeen
		}
		dev.inbox.mu.Unlock()
		if acked > seen {
			return true
		}
	}
	return false
}

// SyncEvery is how often each online session asks its server what it
// missed: four times per lost_after, so that a gap no later push reveals
// is found and fetched before it would be counted lost.
func (p *Population) SyncEvery() time.Duration { return p.opts.LostAfter / 4 }

// sends reports whether any user sends.
func (p *Population) sends() bool {
	for _, u := range p.users {
		if u.interval > 0 {
			return true
		}
	}
	return false
}
