package engine

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Connection is what every population of one prober shares: the target's
// driver and how the users reach it. The daemon makes one and hands it to
// the background population, the canary and soak runs alike.
type Connection struct {
	Driver probe.Driver
	// Run identifies this process in every message body.
	Run string
	// Heartbeat is each session's keepalive interval.
	Heartbeat time.Duration
	// BackoffMin and BackoffMax cap the first and every reconnect delay
	// (exponential with full jitter).
	BackoffMin, BackoffMax time.Duration
	// SourceAddrs, if set, are the local addresses sessions connect from,
	// user i from SourceAddrs[i%len]: always the same one, so that a user
	// keeps its address across reconnects. Empty lets the kernel pick.
	SourceAddrs []netip.Addr
	// MaxConnectRate caps connect attempts per second across the whole
	// population, first logins and reconnects alike, so that a server
	// that dropped everyone is not stormed by them coming back at once
	// (the jittered backoff spreads them further). 0 is no limit.
	MaxConnectRate float64
	// Limiter, if set, is the connect limiter every connect attempt
	// draws from instead of one of MaxConnectRate for this population
	// alone: the process makes one (NewConnectLimiter) and gives it to
	// every population it runs, the background's blocks, the canary and
	// each soak run, so that MaxConnectRate caps the process, not each
	// population.
	Limiter *ConnectLimiter
	// Reactor reads the sessions that can be (probe.Watcher: a plain
	// WebSocket, not on a slow link) on a poller each population starts,
	// without a goroutine each while they are online
	// (population.reactor).
	Reactor bool
	// Health, if set, records the prober's own send and receive lags and
	// says when it is saturated.
	Health Health
	// Reach, if set, hears the outcome of every connect, login and
	// provisioning attempt: whether the target takes logins right now.
	// Populations of one prober share it.
	Reach *Reach
	// CatchUp gives every device a Catchup, so that drivers whose
	// servers keep history fetch what a device missed, and has the
	// population ask each session to sync once per SyncEvery.
	CatchUp bool
	// TestClockOffset shifts this prober's clock, as other processes see
	// it, by this much: every time it writes into a body is ahead by it,
	// and every time it reads from one is taken as such. Only tests set
	// it, to be a shard on a node whose clock is off; no configuration
	// key reaches it.
	TestClockOffset time.Duration
}

// Options configures a Population.
type Options struct {
	Connection
	Set    *metrics.Set
	Logger *slog.Logger
	// Prefix starts every user and group name.
	Prefix string
	Users  int
	// Devices is how many sessions each user keeps online, each with its
	// own connection, churn and backoff; 0 is 1.
	Devices   int
	Ramp      time.Duration
	GroupSize int
	// Behaviours, if set, makes the population a mix of behaviour
	// classes (see behaviour.go): each user sends at its class's rate and
	// sizes instead of Rate and MessageSize, and leaves and rejoins its
	// groups at its class's pace, which needs a Regrouper driver.
	Behaviours []config.Behaviour
	// Groups, if set, lays the groups out as a mix of sizes instead of
	// GroupSize: see Population.groupLayout.
	Groups      []config.GroupSpec
	Rate        float64 // messages per second per user
	Deadline    time.Duration
	LostAfter   time.Duration
	MessageSize int
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
	// SessionLifetime, if positive, is the mean of the exponentially
	// distributed time a session stays logged in before its user logs out
	// and back in (churn; disconnect reason "churn").
	SessionLifetime time.Duration
	// Offset and GroupOffset number the users and groups from these
	// instead of 0: PREFIX-u(Offset+i), PREFIX-g(GroupOffset+g). A
	// population grown at run time is made of blocks, each a Population
	// of its own, numbered on from the one before.
	Offset, GroupOffset int
	// Slice, when set (Hi above 0), lays the population out across
	// shards: Users, the groups and the direct pairs describe the whole
	// population, the same in every shard, and this process logs in,
	// sends for and receives for users Lo to Hi-1 alone. A message is
	// owed to every device of its recipients wherever they live, and the
	// sender's process counts it so; each receiving process checks what
	// it gets by the marks the sender writes into the body (see
	// probe.Header.Resolved), since no other channel joins the shards.
	Slice Slice
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
	// CrossPeerClock and CrossFromClock export the clock offset to
	// CrossPeer's and CrossFrom's shards (one shard, on a ring of two),
	// which the ring measures through the target (see clock.go);
	// CrossFromClock's Untrusted counts CrossFrom's deliveries whose
	// latency is not observed. Either may be nil, exporting nothing.
	CrossPeerClock, CrossFromClock *metrics.ClockPeer
	// ShardClock, for a population laid out across shards (Slice),
	// returns the clock offset of another shard as another population of
	// this process measures it (the canary's ring: Population.ClockOffset),
	// to correct the latencies of its senders' messages by; false when
	// it is not known well enough, or not measured at all (a shard that
	// is not the ring's neighbour), and their latency is then untrusted:
	// counted in ShardClockUntrusted, not observed. Nil corrects nothing.
	ShardClock func(shard int, now int64) (offset int64, ok bool)
	// OwedAfterLogin, for a population laid out across shards that runs
	// for ever (the daemon's background), owes a device other shards'
	// messages only from a second after its first login: its shards
	// start and restart apart, and what the others sent before one's
	// devices were there (the server's offline backlog pushes some of
	// it at the login) would otherwise count late at every restart.
	// Those deliveries are then counted by no one. A soak run's shards
	// start together and its sums must balance, so it owes a device
	// everything from the run's start, as one process does: a login
	// the server makes slow is the server's.
	OwedAfterLogin      bool
	ShardClockUntrusted prometheus.Counter
	// MaxClockUncertainty is the uncertainty of CrossFrom's clock offset
	// above which its deliveries' latencies are untrusted: counted, but
	// not observed. 0 is DefaultMaxClockUncertainty.
	MaxClockUncertainty time.Duration
}

// MaxDevices bounds Options.Devices: a person has a phone, a laptop, a
// tablet and a browser tab or two, and each device is a connection of its
// own.
const MaxDevices = 16

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

// Slice is the users Lo to Hi-1 of a population laid out across shards,
// those of shard Index of Count: see Options.Slice.
type Slice struct{ Lo, Hi, Index, Count int }

// Across reports whether s lays a population out across shards.
func (s Slice) Across() bool { return s.Hi > 0 }

// SliceOf returns the slice shard i of n runs of a population of users
// users: consecutive, and as even as can be; the zero Slice (all of
// them) for one shard or none.
func SliceOf(i, n, users int) Slice {
	if n <= 1 {
		return Slice{}
	}
	return Slice{Lo: i * users / n, Hi: (i + 1) * users / n, Index: i, Count: n}
}

// ShardOf returns the shard that runs user u of a population of users
// users laid out as s is: the i with SliceOf(i, n, users).Lo <= u, the
// highest such. Lo(i) = floor(i×users/n) <= u holds exactly when
// i < (u+1)×n/users.
func (s Slice) ShardOf(u, users int) int {
	return ((u+1)*s.Count+users-1)/users - 1
}
