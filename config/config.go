// Package config holds imcanary's typed configuration: its defaults, how it is
// loaded (YAML file, then IMCANARY_* environment, then flags) and how it is
// validated. Every error names the key and the value that are wrong.
package config

import (
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// Config is the whole configuration of one imcanary daemon.
type Config struct {
	HTTP       HTTP       `koanf:"http"`
	Target     Target     `koanf:"target"`
	Population Population `koanf:"population"`
	// DataDir is the directory that keeps the run history: soak reports
	// and canary rounds.
	DataDir string  `koanf:"data_dir"`
	History History `koanf:"history"`
	Canary  Canary  `koanf:"canary"`
	Soak    Soak    `koanf:"soak"`
	// Saturation sets when imcanary declares itself saturated.
	Saturation Saturation `koanf:"saturation"`
	// SLO is the service level objective the status page judges the
	// SLIs against.
	SLO SLO `koanf:"slo"`
	// Shard makes this daemon one shard of several (see ParseShard): ""
	// (one daemon), "I/N", or "auto/N" for the ordinal that ends the host
	// name, as a StatefulSet's pods have.
	Shard string `koanf:"shard"`
	// Deprecated says what the configuration used that is deprecated, in
	// words, for the caller to log: the Loader fills it in.
	Deprecated []string `koanf:"-"`
}

// HTTP configures the daemon's own HTTP server (/metrics, /healthz, /readyz).
type HTTP struct {
	// Listen is the address of the HTTP server.
	Listen string `koanf:"listen"`
}

// Target names the IM server under test and how to reach it.
type Target struct {
	// Name is the value of the target label on every series; by default
	// the default protocol's name.
	Name string `koanf:"name"`
	// Protocol names the protocol of the target: one the Loader was made
	// with, by default its first.
	Protocol string `koanf:"protocol"`
	// URL is the WebSocket URL. Empty with a protocol that can run
	// in-process (Protocol.InProcess) means: start a reference server in
	// this process on a free loopback port.
	URL string `koanf:"url"`
	// SecretFile holds the secret that signs login tokens. The environment
	// variable IMCANARY_TARGET_SECRET is used when it is empty. The secret
	// itself never appears in the configuration tree, logs or metrics.
	SecretFile string `koanf:"secret_file"`
	// CatchUp is "on" or "off": on, a device fetches what it missed
	// (after a reconnect, or at a gap in a conversation's sequence) from
	// the server's store, where its protocol can, as a real client does;
	// off, what a device misses is lost.
	CatchUp string `koanf:"catch_up"`
	// Sections holds each protocol's own section, target.NAME, by the
	// protocol's name, as its adapter defines it (Protocol.Section): the
	// Loader fills it in. A Config built in code may leave it empty, and
	// the adapters then take their defaults (see Section).
	Sections map[string]any `koanf:"-"`
	// Headers are extra HTTP request headers for every request to the
	// target, the WebSocket upgrade included: an auth proxy in front of a
	// staging server wants its own. Only the file can set the list.
	Headers []Header `koanf:"headers"`
}

// Header is one extra request header. Its value is given inline or, when it
// is a credential, read from ValueFile (never logged, never shown).
type Header struct {
	// Name is the header's name, such as "X-Staging-Auth".
	Name string `koanf:"name"`
	// Value is the header's value; exactly one of Value and ValueFile is
	// set.
	Value string `koanf:"value"`
	// ValueFile holds the value, trailing newlines trimmed.
	ValueFile string `koanf:"value_file"`
}

// Read returns the header's value: Value, or the contents of ValueFile.
// An error names the file, never its content.
func (h Header) Read() (string, error) {
	if h.ValueFile == "" {
		return h.Value, nil
	}
	b, err := os.ReadFile(h.ValueFile)
	if err != nil {
		return "", err
	}
	// Trimmed as the target secret is: a value of spaces is a mistake,
	// not a header.
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s is empty", h.ValueFile)
	}
	if !validHeaderValue(v) {
		return "", fmt.Errorf("%s holds a line break or a control character, which a header value cannot", h.ValueFile)
	}
	return v, nil
}

// Population is the background population of simulated users.
type Population struct {
	// Users is how many users are kept online.
	Users int `koanf:"users"`
	// Ramp spreads the users' first logins evenly over this duration.
	Ramp time.Duration `koanf:"ramp"`
	// GroupSize is the size of each chat group; users are grouped in order.
	GroupSize int `koanf:"group_size"`
	// Groups, if not empty, lays the groups out as a mix instead of
	// GroupSize: comma-separated COUNTxSIZE entries (see ParseGroups).
	Groups string `koanf:"groups"`
	// Devices is how many sessions each user keeps online at once.
	Devices int `koanf:"devices"`
	// Rate is messages per second per user, alternating direct and group.
	Rate float64 `koanf:"rate"`
	// Heartbeat is the interval between keepalive pings of each session.
	Heartbeat time.Duration `koanf:"heartbeat"`
	// Deadline is the delivery deadline measured from the intended send
	// time: a delivery after it is late. It is also the ack timeout.
	Deadline time.Duration `koanf:"deadline"`
	// LostAfter is how long after its intended send time a missing message
	// is declared lost. It must be at least twice Deadline: a message that
	// arrives between the two is late, not lost, and a message the server
	// never acknowledged is known as such only a Deadline after its send.
	LostAfter time.Duration `koanf:"lost_after"`
	// Prefix starts every user and group name, so that provisioning is
	// idempotent across restarts and never collides with other data.
	Prefix string `koanf:"prefix"`
	// MessageSize pads probe message bodies to at least this many bytes.
	MessageSize int `koanf:"message_size"`
	// Backoff bounds the reconnect delay (exponential with full jitter).
	Backoff Backoff `koanf:"backoff"`
	// MaxConnectRate caps the connect attempts per second of the process:
	// one limiter shared by all its populations (the background one, the
	// canary, every soak run), first logins and reconnects alike, so that
	// a server coming back is not stormed by everyone it dropped at once.
	MaxConnectRate float64 `koanf:"max_connect_rate"`
	// SourceAddrs is a comma-separated list of local IP addresses and
	// inclusive IPv4 ranges ("127.0.0.1-127.0.0.16") the sessions connect
	// from, spread over them round-robin by user (see ParseSourceAddrs);
	// "" lets the kernel pick. One address holds only as many connections
	// to one server port as there are ephemeral ports, about 28,000.
	SourceAddrs string `koanf:"source_addrs"`
	// LagThreshold is how long a message the server acknowledged may go
	// unreceived by an online recipient (nothing later of its stream
	// received either) before the session counts as lagging: a silent
	// stall. 0 means half of Deadline.
	LagThreshold time.Duration `koanf:"lag_threshold"`
	// SessionLifetime, if positive, is the mean time a session stays
	// logged in before its user logs out and back in (churn): lifetimes
	// are drawn from an exponential distribution, as independent users'
	// would be. 0 keeps sessions until something ends them.
	SessionLifetime time.Duration `koanf:"session_lifetime"`
	// Reactor reads each online session that can be (a WebSocket, ws://
	// or wss://, of an adapter that can be watched; a slow reader's
	// pauses then hold its reading on a timer)
	// without a goroutine of its own: an epoll poller hands its frames to
	// a worker as they come. On by default: where there is no epoll
	// (not Linux), every session is read by a goroutine as with false.
	Reactor bool `koanf:"reactor"`
	// Behaviours, if not empty, makes the population a mix of behaviour
	// classes, each with its own rate, message sizes and group churn, in
	// place of Rate and MessageSize. Only the file can set the list.
	Behaviours []Behaviour `koanf:"behaviours"`
	// SlowReaders turns part of the population into slow readers: an
	// always-on slow-reader drill.
	SlowReaders SlowReaders `koanf:"slow_readers"`
	// AcrossShards lays the population out over all the shards (see
	// Config.Shard) instead of giving each shard users of its own:
	// Users, the groups and the direct pairs describe the whole
	// population, each shard logs in its slice of the users, and groups
	// and conversations span shards. The same holds for each soak
	// profile's users. Every shard must set it alike.
	AcrossShards bool `koanf:"across_shards"`
}

// SlowReaders configures a slow-reader drill: a fraction of the users read
// deliberately slowly, to see what the server does to them and whether the
// other users suffer. Slow readers receive but do not send.
type SlowReaders struct {
	// Fraction of the users, 0 to below 1, spread evenly; 0 turns the
	// drill off.
	Fraction float64 `koanf:"fraction"`
	// ReadDelay is a pause after each delivery a slow reader reads.
	ReadDelay time.Duration `koanf:"read_delay"`
	// Pause stops a slow reader from reading for this long at its first
	// delivery, then every PauseEvery (0: once per session).
	Pause      time.Duration `koanf:"pause"`
	PauseEvery time.Duration `koanf:"pause_every"`
}

// Saturation sets when imcanary declares itself saturated: its own delays
// or resources past these limits mean its numbers may be its own, so SLO
// alerts are inhibited and soak verdicts that fail become inconclusive.
type Saturation struct {
	// Interval is how often the prober samples its own health.
	Interval time.Duration `koanf:"interval"`
	// Window is the span each limit is judged over: a whole number of
	// intervals.
	Window time.Duration `koanf:"window"`
	// MaxSendLag is the highest 99th percentile of send lag (actual minus
	// intended send time).
	MaxSendLag time.Duration `koanf:"max_send_lag"`
	// MaxReceiveLag is the highest 99th percentile of receive lag (frame
	// read off the socket to the ledger's record).
	MaxReceiveLag time.Duration `koanf:"max_receive_lag"`
	// MaxSchedLatency is the highest 99th percentile of the Go scheduler's
	// latency (runnable goroutines waiting for a CPU).
	MaxSchedLatency time.Duration `koanf:"max_sched_latency"`
	// MaxGCPause is the longest stop-the-world GC pause.
	MaxGCPause time.Duration `koanf:"max_gc_pause"`
	// MaxCPU is the highest CPU use per core the process may use, 0 to 1.
	MaxCPU float64 `koanf:"max_cpu"`
	// MaxFDs is the highest ratio of open files to the file limit.
	MaxFDs float64 `koanf:"max_fds"`
	// MaxPorts is the highest ratio of used to available ephemeral ports
	// from a local address toward one destination the prober connects to
	// (every program's sockets count: they share the range).
	MaxPorts float64 `koanf:"max_ports"`
}

// SLO is the service level objective of both SLIs, completeness and
// latency. The alert rules have their own copy
// (imcanary:slo_objective:ratio in deploy/prometheus): keep the two equal.
type SLO struct {
	// Objective is the fraction of good events, such as 0.999.
	Objective float64 `koanf:"objective"`
}

// Backoff is a capped exponential backoff with full jitter.
type Backoff struct {
	// Initial is the cap of the first retry's delay.
	Initial time.Duration `koanf:"initial"`
	// Max is the cap of every retry's delay.
	Max time.Duration `koanf:"max"`
}

// History bounds the run history under DataDir. Whichever limit is reached
// first prunes the oldest entries, so the directory cannot grow without end
// on a daemon that runs for months.
type History struct {
	// MaxRuns is how many soak run reports are kept.
	MaxRuns int `koanf:"max_runs"`
	// MaxAge is how long a soak report is kept; canary rounds are kept
	// by count (MaxCanaryRounds).
	MaxAge time.Duration `koanf:"max_age"`
	// MaxCanaryRounds is how many canary rounds are kept. Rounds are small
	// and frequent (one every 30s by default is 2,880 a day), hence a
	// separate, larger limit.
	MaxCanaryRounds int `koanf:"max_canary_rounds"`
}

// Canary is the scheduled canary round: a few fully tracked users who
// exchange messages on top of the background population and are measured
// precisely (OpenIM's "sampled users"). It is small so that it can run often.
type Canary struct {
	// Schedule is a cron spec (robfig/cron v3 standard syntax: five fields
	// or a descriptor such as "@every 30s" or "@hourly"); "" disables the
	// canary.
	Schedule string `koanf:"schedule"`
	// Deadline is how long a round waits for each expected delivery,
	// measured from the message's send time.
	Deadline time.Duration `koanf:"deadline"`
	// Users is how many users take part in each round.
	Users int `koanf:"users"`
	// Messages is how many messages each user sends per round.
	Messages int `koanf:"messages"`
	// Jitter delays each round's start by a random duration up to this, so
	// that several canaries on one schedule do not hit the target at the
	// same instant.
	Jitter time.Duration `koanf:"jitter"`
	// RetryAfter, when positive, brings the next round this soon after a
	// failed one, instead of at the schedule's next time, so that a
	// failure is confirmed or cleared within seconds on a slow schedule;
	// after a round that passes the schedule is followed again. 0 is off.
	RetryAfter time.Duration `koanf:"retry_after"`
	// MaxClockUncertainty is the uncertainty of a peer shard's clock
	// offset (measured through the target by the cross-shard canary
	// ring) above which the latencies of its cross-shard deliveries are
	// untrusted: counted, but kept out of the latency histograms.
	MaxClockUncertainty time.Duration `koanf:"max_clock_uncertainty"`
}

// Soak holds the soak profiles: named load tests run on demand or on their
// own schedule. The list can only be given in the configuration file, never
// through the environment or flags, which hold one scalar value each.
type Soak struct {
	// Profiles are the soak profiles in the order the file gives them;
	// their names are unique.
	Profiles []Profile `koanf:"profiles"`
}

// Profile is one soak test: a cohort of users ramped in on top of the
// background population, open-loop traffic for Duration, a Drain in which
// late deliveries can still arrive, and a verdict against Thresholds.
//
// Keys a profile leaves out in the file take the values of the unexported
// profileDefaults; Deadline and LostAfter are derived after loading instead,
// as they follow population.deadline.
type Profile struct {
	// Name identifies the profile in commands, reports and metrics: 1 to 32
	// characters of a-z, 0-9 and "-", unique among the profiles.
	Name string `koanf:"name"`
	// Schedule is a cron spec like canary.schedule; "" runs the profile
	// only when asked to.
	Schedule string `koanf:"schedule"`
	// Users is the size of the cohort.
	Users int `koanf:"users"`
	// GroupSize is the size of each chat group; users are grouped in order.
	GroupSize int `koanf:"group_size"`
	// Groups, if not empty, lays the groups out as a mix instead of
	// GroupSize, as population.groups.
	Groups string `koanf:"groups"`
	// Devices is how many sessions each user keeps online at once.
	Devices int `koanf:"devices"`
	// Rate is messages per second per user, alternating direct and group.
	Rate float64 `koanf:"rate"`
	// Ramp spreads the cohort's logins evenly over this duration.
	Ramp time.Duration `koanf:"ramp"`
	// Duration is how long the cohort sends, after the ramp.
	Duration time.Duration `koanf:"duration"`
	// Settle is how long the cohort sends before what it sends is judged
	// on latency: the first Settle of Duration fills the server's queues
	// and caches, and the latency figures and thresholds count the
	// messages sent after it (counts and loss still count every message).
	// 0 judges the whole send phase; it must be below Duration.
	Settle time.Duration `koanf:"settle"`
	// Drain is how long the run keeps listening after the last send, so
	// that late deliveries are counted as late rather than lost.
	Drain time.Duration `koanf:"drain"`
	// Deadline is the delivery deadline as in population.deadline. 0 (or
	// left out) means population.deadline; Load fills it in.
	Deadline time.Duration `koanf:"deadline"`
	// LostAfter is as in population.lost_after, at least twice Deadline.
	// 0 (or left out) means twice Deadline; Load fills it in.
	LostAfter time.Duration `koanf:"lost_after"`
	// LateLogins is the fraction of users, 0 to below 1, who log in only
	// LateAfter after the run starts, so that messages sent to them
	// meanwhile test offline delivery.
	LateLogins float64 `koanf:"late_logins"`
	// LateAfter is how long after the start of the run the late users log
	// in; it must fall within Duration when LateLogins is above 0.
	LateAfter time.Duration `koanf:"late_after"`
	// Behaviours makes the cohort a behaviour mix, as
	// population.behaviours.
	Behaviours []Behaviour `koanf:"behaviours"`
	// SlowReaders makes the run a slow-reader drill, as
	// population.slow_readers.
	SlowReaders SlowReaders `koanf:"slow_readers"`
	// Storm makes the run a reconnect-storm drill.
	Storm Storm `koanf:"storm"`
	// Search makes the profile a search for the server's limit: a run
	// per step of one varied value, each judged by Thresholds.
	Search Search `koanf:"search"`
	// Thresholds are the limits the run must stay within to pass.
	Thresholds Thresholds `koanf:"thresholds"`
}

// Search configures a search for the server's limit, the knee: the
// profile is run once per step with Vary set to the step's value, from
// the profile's own value up by Factor until a step fails a threshold,
// then by bisection between the last step that passed and the first that
// failed until the two are within Precision of each other. A step during
// which imcanary itself was saturated ends the search as inconclusive.
type Search struct {
	// Vary is the value searched: "" (no search), "rate" (messages per
	// second per user), "users" or "group_size".
	Vary string `koanf:"vary"`
	// Max is the most the search tries; a pass there ends it: no limit
	// within reach.
	Max float64 `koanf:"max"`
	// Factor is the growth from one step to the next before a step fails,
	// above 1.
	Factor float64 `koanf:"factor"`
	// Precision is the fraction the failing step may be above the passing
	// one when the search ends, between 0 and 1.
	Precision float64 `koanf:"precision"`
}

// Values of Search.Vary.
const (
	SearchRate      = "rate"
	SearchUsers     = "users"
	SearchGroupSize = "group_size"
)

// MostUsers is the most users a run of the profile has at once: its
// users, or for a search of users the most it tries.
func (p Profile) MostUsers() int {
	if p.Search.Vary == SearchUsers {
		return max(p.Users, int(math.Ceil(p.Search.Max)))
	}
	return p.Users
}

// SearchStart returns the profile's own value of what its search varies:
// the first step.
func (p Profile) SearchStart() float64 {
	switch p.Search.Vary {
	case SearchUsers:
		return float64(p.Users)
	case SearchGroupSize:
		return float64(p.GroupSize)
	}
	return p.Rate
}

// AtStep returns the profile with what its search varies set to v, and no
// search of its own: one step's run.
func (p Profile) AtStep(v float64) Profile {
	switch p.Search.Vary {
	case SearchUsers:
		p.Users = int(v)
	case SearchGroupSize:
		p.GroupSize = int(v)
	default:
		p.Rate = v
	}
	p.Search = Search{}
	return p
}

// Storm configures a reconnect-storm drill: Fraction of a population's
// sessions dropped at once, After into the send phase, without a clean
// close (as a load balancer restart drops them), and the time until they
// are back measured. In the daemon the drop is the background
// population's, in soak --profile the run's own cohort's.
type Storm struct {
	// Fraction of the sessions online at the drop, above 0 and at most 1,
	// spread evenly; 0 is no drill.
	Fraction float64 `koanf:"fraction"`
	// After is how long into the send phase the drop comes: less than
	// duration, so that the run sends while the sessions come back.
	After time.Duration `koanf:"after"`
}

// Thresholds are the pass/fail limits of a soak run. Ratios are fractions
// (0.001 is 0.1%), not percentages.
type Thresholds struct {
	// MaxLoss is the highest ratio of lost to expected deliveries; a group
	// message to n others is n expected deliveries.
	MaxLoss float64 `koanf:"max_loss"`
	// MinRealtimeCompleteness is the lowest ratio of expected deliveries
	// pushed within the deadline: the real-time completeness SLI, where
	// MaxLoss judges the eventual one (a message a device fetched by
	// catch-up is complete eventually, not in real time). 0 (the
	// default) does not judge it.
	MinRealtimeCompleteness float64 `koanf:"min_realtime_completeness"`
	// MaxLate is the highest ratio of late deliveries to deliveries.
	MaxLate float64 `koanf:"max_late"`
	// MaxRefused is the highest ratio of sends the server refused (a
	// rejection with a code) or never acknowledged within the ack
	// timeout, to the sends it answered or should have: a refused message
	// is owed to no one, so without it a server that sheds load by
	// refusing sends loses nothing and passes. Sends cut short by a
	// disconnect are the disconnect's, not counted here.
	MaxRefused float64 `koanf:"max_refused"`
	// P99Ack is the highest 99th percentile of the server's ack latency.
	P99Ack time.Duration `koanf:"p99_ack"`
	// P99Delivery is the highest 99th percentile of delivery latency, from
	// the intended send time to receipt.
	P99Delivery time.Duration `koanf:"p99_delivery"`
	// MinOnlineRatio is the lowest acceptable ratio of online users to the
	// users meant to be online.
	MinOnlineRatio float64 `koanf:"min_online_ratio"`
	// MaxDisconnects is the most disconnects the server may cause (our own
	// shutdown at the end of the run is not counted).
	MaxDisconnects int64 `koanf:"max_disconnects"`
	// Recovery99 and Recovery100 are the longest a reconnect-storm drill
	// may take, from the drop, until 99% and until all of the dropped
	// sessions are back (logged in again); both must be positive in a
	// drill, and are not judged without one.
	Recovery99  time.Duration `koanf:"recovery_99"`
	Recovery100 time.Duration `koanf:"recovery_100"`
}

// Profile returns the soak profile named name, and whether there is one.
func (c Config) Profile(name string) (Profile, bool) {
	for _, p := range c.Soak.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// profileDefaults holds the value of every key a profile leaves out, except
// name and users, which it must give, and deadline and lost_after, which
// follow population.deadline (see Profile). Load merges these into each
// profile's map before decoding, so an explicit 0 (max_loss: 0) stays 0.
var profileDefaults = Profile{
	GroupSize: 5,
	Devices:   1,
	Rate:      1,
	Ramp:      10 * time.Second,
	Duration:  time.Minute,
	Drain:     30 * time.Second,
	Search:    Search{Factor: 2, Precision: 0.05},
	Thresholds: Thresholds{
		MaxLoss:        0.001,
		MaxLate:        0.01,
		MaxRefused:     0.001,
		P99Ack:         time.Second,
		P99Delivery:    2 * time.Second,
		MinOnlineRatio: 1.0,
		MaxDisconnects: 0,
	},
}

// defaults returns the configuration used for every key a source leaves
// unset, but for what depends on the protocols: Loader.Default fills in
// the default protocol, the target's name and the protocols' sections.
func defaults() Config {
	return Config{
		HTTP:   HTTP{Listen: "127.0.0.1:9464"},
		Target: Target{CatchUp: CatchUpOn},
		Population: Population{
			Users:       100,
			Ramp:        10 * time.Second,
			GroupSize:   5,
			Devices:     1,
			Rate:        0.5,
			Heartbeat:   30 * time.Second,
			Deadline:    10 * time.Second,
			Reactor:     true,
			LostAfter:   30 * time.Second,
			Prefix:      "imcanary",
			MessageSize: 0,
			Backoff:     Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second},
			// A thousand logins a second is well within what a server
			// sized for thousands of users takes, and brings 10,000
			// users back in ten seconds.
			MaxConnectRate: 1000,
			SourceAddrs:    "",
		},
		DataDir: "./imcanary-data",
		History: History{
			MaxRuns:         200,
			MaxAge:          720 * time.Hour, // 30 days
			MaxCanaryRounds: 2000,
		},
		Canary: Canary{
			Schedule: "@every 30s",
			Deadline: 5 * time.Second,
			Users:    4,
			Messages: 1,
			Jitter:   5 * time.Second,
			// 5% of the latency SLI's 1 s: a corrected latency is
			// off by at most this, and the bound is about a one-way
			// delivery through the target, which a healthy server
			// near its probers stays under; 10 ms would distrust
			// every cross-shard latency of a server a few ms away.
			MaxClockUncertainty: 50 * time.Millisecond,
		},
		// No profiles: soak tests are opt-in, as they load the target.
		Soak: Soak{},
		Saturation: Saturation{
			Interval:        time.Second,
			Window:          5 * time.Second,
			MaxSendLag:      100 * time.Millisecond,
			MaxReceiveLag:   100 * time.Millisecond,
			MaxSchedLatency: 50 * time.Millisecond,
			MaxGCPause:      50 * time.Millisecond,
			MaxCPU:          0.9,
			MaxFDs:          0.9,
			MaxPorts:        0.9,
		},
		SLO: SLO{Objective: 0.999},
	}
}
