package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/imcanary/imcanary/report"
)

// ReportVersion is the version of the Report's JSON layout. Fields are only
// ever added; a change to the meaning of one would make it 2.
const ReportVersion = 1

// Report is everything one bench run measured and the plan made from it,
// written by `imcanary bench --json` as one JSON object. Field names are
// stable. Rates are per second of wall time; "core-second" is one second of
// one CPU's time, user and system together, read from /proc for the process
// named. A figure the run could not measure is 0, with the reason in
// Warnings.
type Report struct {
	// Version is ReportVersion.
	Version int `json:"version"`
	// Mode is "quick" (CI scale, under a minute) or "full".
	Mode string `json:"mode"`
	// Started is when the run began; Seconds how long it took.
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Machine Machine   `json:"machine"`
	Setup   Setup     `json:"setup"`
	// Throughput compares imcanary's receive path with a bare read loop.
	Throughput Throughput `json:"throughput"`
	// Baseline is a prober holding one session: what every process costs
	// before its sessions.
	Baseline Baseline `json:"baseline"`
	// Logins is the ramp's baseline: the bare login loop.
	Logins Logins `json:"logins"`
	// Noise is the self-noise step: one prober at Setup.NoiseSessions
	// sessions receiving Setup.NoiseDeliveriesPerSecond.
	Noise Step `json:"noise"`
	// Steps are the session steps, in order, up to the one that stopped
	// the run.
	Steps []Step `json:"steps"`
	Stop  Stop   `json:"stop"`
	Plan  Plan   `json:"plan"`
	// Warnings are what the reader should know to trust the figures:
	// causes discounted, features the binary lacks, figures not measured.
	Warnings []string `json:"warnings"`
}

// Machine is what the bench found of the machine it ran on.
type Machine struct {
	Cores      int `json:"cores"`
	GOMAXPROCS int `json:"gomaxprocs"`
	// MemTotalBytes and MemAvailableBytes are from /proc/meminfo at the
	// start, before any worker ran.
	MemTotalBytes     int64 `json:"mem_total_bytes"`
	MemAvailableBytes int64 `json:"mem_available_bytes"`
	// FileLimit is the soft RLIMIT_NOFILE every worker inherits.
	FileLimit int64 `json:"file_limit"`
	// EphemeralPorts is net.ipv4.ip_local_port_range, both ends included.
	EphemeralPorts [2]int `json:"ephemeral_ports"`
	// Load1 is the one-minute load average at the start: work of other
	// processes competes with the bench's, and shows in every figure.
	Load1 float64 `json:"load1"`
}

// Setup is how the run was set up.
type Setup struct {
	// Processes is how many probers held sessions side by side, each
	// against a target of its own (a reference server unless Target names
	// another).
	Processes int `json:"processes"`
	// Target is "reference" (reference servers the bench runs) or the URL
	// of the target given.
	Target string `json:"target"`
	// Rate is the messages per second each user sent in the session
	// steps; GroupSize and HeartbeatSeconds are the population's.
	Rate             float64 `json:"rate"`
	GroupSize        int     `json:"group_size"`
	HeartbeatSeconds float64 `json:"heartbeat_seconds"`
	// ConnectRate is the logins per second each prober was allowed, and
	// ConnectLimiter the key that set it: population.max_connect_rate, or
	// population.ramp on a binary without that key.
	ConnectRate    float64 `json:"connect_rate"`
	ConnectLimiter string  `json:"connect_limiter"`
	// SourceAddrs is true when each prober connected from a loopback
	// address of its own (population.source_addrs).
	SourceAddrs bool `json:"source_addrs"`
	// Reactor is true when the probers read their sessions without a
	// goroutine each (population.reactor).
	Reactor bool `json:"reactor"`
	// SettleSeconds is the wait after the last login before a step's
	// window; WindowSeconds the window each step is measured over.
	SettleSeconds float64 `json:"settle_seconds"`
	WindowSeconds float64 `json:"window_seconds"`
	// NoiseSessions and NoiseDeliveriesPerSecond set the self-noise step.
	NoiseSessions            int     `json:"noise_sessions"`
	NoiseDeliveriesPerSecond float64 `json:"noise_deliveries_per_second"`
	// Saturation is the saturation.* limits the probers ran with, by key.
	Saturation map[string]string `json:"saturation"`
	// WorkerGOMAXPROCS is the GOMAXPROCS every worker ran with when
	// several probers shared the machine (sharedGOMAXPROCS), 0 for the
	// runtime's own choice.
	WorkerGOMAXPROCS int `json:"worker_gomaxprocs"`
}

// Throughput is the flood: the same stream of real delivery frames (the
// reference server's msg frames with probe bodies), at the same pace, to a
// bare read loop and to an imcanary prober, one at a time, in alternating
// rounds within the same run. Each figure is deliveries per core-second of
// the client process alone; the server writing the frames is not counted.
type Throughput struct {
	// Connections each client held; Rounds of the alternation, each
	// measured over WindowSeconds per client.
	Connections   int     `json:"connections"`
	Rounds        int     `json:"rounds"`
	WindowSeconds float64 `json:"window_seconds"`
	// FrameBytes is the mean WebSocket payload of a delivery frame, and
	// OfferedPerSecond the pace the frames were written at, each in a
	// write of its own, round-robin over the connections.
	FrameBytes       float64 `json:"frame_bytes"`
	OfferedPerSecond float64 `json:"offered_per_second"`
	// Bare is the bare read loop (BareReader); Imcanary a real prober
	// (imcanary run): frame read, decode, ledger, histograms, and the rest
	// of the daemon running (sweeps, saturation monitor).
	Bare     Client `json:"bare"`
	Imcanary Client `json:"imcanary"`
	// Ratio is Imcanary.DeliveriesPerCoreSecond over
	// Bare.DeliveriesPerCoreSecond.
	Ratio float64 `json:"ratio"`
}

// Client is one side of the flood, summed over its rounds.
type Client struct {
	// Sent is the frames written to the client during its windows and
	// their warm-ups; Deliveries those it processed within the windows.
	Sent                    float64 `json:"sent"`
	Deliveries              float64 `json:"deliveries"`
	CPUSeconds              float64 `json:"cpu_seconds"`
	WallSeconds             float64 `json:"wall_seconds"`
	DeliveriesPerCoreSecond float64 `json:"deliveries_per_core_second"`
	DeliveriesPerSecond     float64 `json:"deliveries_per_second"`
	// CoresUsed is CPUSeconds over WallSeconds.
	CoresUsed float64 `json:"cores_used"`
}

// Baseline is an idle prober with one session, and its target.
type Baseline struct {
	RSSBytes       int64 `json:"rss_bytes"`
	OpenFiles      int   `json:"open_files"`
	TargetRSSBytes int64 `json:"target_rss_bytes"`
}

// Logins is the bare login loop (BareLogin): the fastest this machine logs
// sessions in to the target, which bounds any prober's ramp on it.
type Logins struct {
	// Sessions logged in, by Workers at once.
	Sessions int `json:"sessions"`
	Workers  int `json:"workers"`
	// LoginsPerSecond from the first dial to the last login.
	LoginsPerSecond float64 `json:"logins_per_second"`
	// CPUSecondsPerLogin is the loop's CPU per login, and
	// TargetCPUSecondsPerLogin the reference server's (0 with --target).
	CPUSecondsPerLogin       float64 `json:"cpu_seconds_per_login"`
	TargetCPUSecondsPerLogin float64 `json:"target_cpu_seconds_per_login"`
}

// Step is one measured step: Processes probers with SessionsPerProcess
// sessions each, measured over WindowSeconds once all were online and
// settled.
type Step struct {
	SessionsPerProcess int `json:"sessions_per_process"`
	Processes          int `json:"processes"`
	// Sessions is every prober's sessions together; Online the fewest
	// online at any sample of the window.
	Sessions int `json:"sessions"`
	Online   int `json:"online"`
	// Rate is the messages per second each user sent.
	Rate float64 `json:"rate"`
	// LoginsPerSecond is the median over the probers of each one's
	// logins per second from its first login to its last, probers
	// ramping one after another; RampSeconds the longest ramp.
	LoginsPerSecond float64 `json:"logins_per_second"`
	RampSeconds     float64 `json:"ramp_seconds"`
	// LoginCPUSeconds is the probers' CPU per login while they ramped,
	// and TargetLoginCPUSeconds the reference servers': what bounds the
	// ramp when the machine's cores are its limit.
	LoginCPUSeconds       float64 `json:"login_cpu_seconds"`
	TargetLoginCPUSeconds float64 `json:"target_login_cpu_seconds"`
	// RSSBytes is the mean resident set of a prober at the end of the
	// window; BytesPerSession is (RSSBytes - Baseline.RSSBytes) per
	// session of a prober: imcanary's own memory, the target's and the
	// kernel's excluded. HeapBytesPerSession is the Go heap and stacks
	// in use per session, from the prober's go_memstats.
	RSSBytes            int64   `json:"rss_bytes"`
	BytesPerSession     float64 `json:"bytes_per_session"`
	HeapBytesPerSession float64 `json:"heap_bytes_per_session"`
	// TargetBytesPerSession is the same for the reference servers, for
	// machines that run both.
	TargetBytesPerSession float64 `json:"target_bytes_per_session"`
	// OpenFiles is the most files one prober had open, and Goroutines
	// the most goroutines one had at the window's end (go_goroutines):
	// with population.reactor, an idle session holds none.
	OpenFiles  int `json:"open_files"`
	Goroutines int `json:"goroutines"`
	// MachineCores is the whole machine's CPU use over the window, in
	// cores; TargetCores the reference servers' share of it, and
	// OtherCores what processes other than the bench's used: on a shared
	// machine, the competition the step was measured under. Load1 is the
	// one-minute load average at the window's end.
	MachineCores float64 `json:"machine_cores"`
	TargetCores  float64 `json:"target_cores"`
	OtherCores   float64 `json:"other_cores"`
	Load1        float64 `json:"load1"`
	// CPUCores is the probers' CPU over the window, in cores;
	// CPUSecondsPerSessionSecond is that per session.
	CPUCores                   float64 `json:"cpu_cores"`
	CPUSecondsPerSessionSecond float64 `json:"cpu_seconds_per_session_second"`
	// GCPerMinute is the probers' garbage collections per minute over the
	// window, the mean of one prober's. GCShare is the collector's part of
	// the probers' CPU (the Go runtime's own estimate,
	// /cpu/classes/gc/total:cpu-seconds), -1 from a binary that does not
	// export it; GCBusy is set past GCShareLimit: the collector, not the
	// sessions, is what the step's CPU figures measure.
	GCPerMinute float64 `json:"gc_per_minute"`
	GCShare     float64 `json:"gc_share"`
	GCBusy      bool    `json:"gc_busy"`
	// DeliveriesPerSecond is every prober's deliveries together;
	// DeliveriesPerCoreSecond is that per core-second of the probers,
	// sending, heartbeats and everything else included.
	DeliveriesPerSecond     float64 `json:"deliveries_per_second"`
	DeliveriesPerCoreSecond float64 `json:"deliveries_per_core_second"`
	// Lost and Reconnects during the window: both should be 0 on a
	// healthy step.
	Lost       float64 `json:"lost"`
	Reconnects float64 `json:"reconnects"`
	// ReceiveLagP99Seconds and SendLagP99Seconds are the p99 of the
	// probers' own lags over the window, from their histograms;
	// ReceiveLagOver2ms is the fraction of receive lags above 2 ms.
	ReceiveLagP99Seconds float64 `json:"receive_lag_p99_seconds"`
	ReceiveLagOver2ms    float64 `json:"receive_lag_over_2ms"`
	SendLagP99Seconds    float64 `json:"send_lag_p99_seconds"`
	// Saturated is true when a prober's saturation detector fired during
	// the window for a cause not discounted; Causes are those causes, and
	// Discounted the ones the bench knows to be an artefact of its own
	// setup (see Warnings).
	Saturated  bool     `json:"saturated"`
	Causes     []string `json:"causes"`
	Discounted []string `json:"discounted"`
	// Fired is, for a step with a cause, each prober's last log line
	// that listed its causes in force, with their figures: which port
	// pool was full, how late the scheduler was.
	Fired []string `json:"fired,omitempty"`
	// Attempts is how often the step ran: one saturated while other
	// processes were busy on more than a quarter of the cores is run
	// again, up to three times, and only the last attempt is kept.
	Attempts int `json:"attempts"`
}

// GCShareLimit is the part of a prober's CPU its collector may take before
// the bench flags the step (Step.GCBusy): beyond it the collector runs
// without garbage worth the work, as it did under a memory limit the
// sessions outgrew (half an idle prober's CPU and more).
const GCShareLimit = 0.5

// gcShare formats a step's GCShare, "-" when not measured.
func gcShare(st Step) string {
	if st.GCShare < 0 {
		return "-"
	}
	mark := ""
	if st.GCBusy {
		mark = "!"
	}
	return fmt.Sprintf("%.0f%s", 100*st.GCShare, mark)
}

// Stop reasons.
const (
	StopStepsDone   = "steps_done"
	StopSaturated   = "saturated"
	StopNotOnline   = "not_online"
	StopError       = "error"
	StopInterrupted = "interrupted"
)

// Limits a plan can have reached (Plan.Limit).
const (
	LimitSaturated = StopSaturated
	LimitNotOnline = StopNotOnline
	LimitFDs       = "fds"
	LimitPorts     = "ports"
	LimitMemory    = "memory"
)

// Stop says why the steps ended.
type Stop struct {
	// Reason is "steps_done" (every step held, up to the file limit),
	// "saturated", "not_online" (a prober could not bring its sessions
	// online), "error" or "interrupted".
	Reason string `json:"reason"`
	// Step is the 1-based step that ended the run, 0 when all held.
	Step   int    `json:"step"`
	Detail string `json:"detail"`
}

// Plan is the capacity plan.
type Plan struct {
	// Sessions is the most sessions the run held without saturation, all
	// probers together, and DeliveriesPerSecond what imcanary could verify
	// on this machine's cores while holding them, if the target ran
	// elsewhere. Sessions is what the machine holds only when LimitFound;
	// otherwise it is the largest step tried, and the machine may hold
	// more.
	Sessions            int     `json:"sessions"`
	DeliveriesPerSecond float64 `json:"deliveries_per_second"`
	// LimitFound says the run reached a limit, and Limit names it:
	// "saturated" (the step after the last one held saturated a prober),
	// "not_online" (a prober could not bring that step's sessions
	// online), or, when every step held, the bound the largest one
	// reached: "fds" or "ports" (FDBound, PortBound: a shard's, so more
	// processes may hold more) or "memory" (MemorySessions). Limit is ""
	// when LimitFound is false: the steps ended, or the run stopped,
	// short of every limit.
	LimitFound bool   `json:"limit_found"`
	Limit      string `json:"limit"`
	// SessionsPerProcess is the most sessions one process (one shard)
	// should hold, and Bound the limit that sets it: "fds" or "ports".
	SessionsPerProcess int    `json:"sessions_per_process"`
	Bound              string `json:"bound"`
	// FDBound is the sessions per process that saturation.max_fds of the
	// file limit allows, less the files a prober holds besides its
	// sessions; PortBound the sessions from one source address to one
	// target address that saturation.max_ports of the ephemeral range
	// allows.
	FDBound   int `json:"fd_bound"`
	PortBound int `json:"port_bound"`
	// MemorySessions is how many sessions this machine's available
	// memory holds at BytesPerSession; CPUSessions how many its cores
	// (saturation.max_cpu of each) hold at CPUSecondsPerSessionSecond
	// with no traffic.
	MemorySessions int `json:"memory_sessions"`
	CPUSessions    int `json:"cpu_sessions"`
	// BytesPerSession is the larger of the largest step held's and the
	// self-noise step's, whose ledgers hold streams.
	BytesPerSession float64 `json:"bytes_per_session"`
	// CPUSecondsPerSessionSecond is a session's CPU cost with no
	// traffic, and DeliveriesPerCoreSecond the deliveries one core
	// verifies end to end, sending included: the two costs the largest
	// step held and the self-noise step separate (the steps are idle
	// unless --rate is given; the noise step is mostly deliveries).
	// ReceiveDeliveriesPerCoreSecond is the receive path alone, from the
	// flood.
	CPUSecondsPerSessionSecond     float64 `json:"cpu_seconds_per_session_second"`
	DeliveriesPerCoreSecond        float64 `json:"deliveries_per_core_second"`
	ReceiveDeliveriesPerCoreSecond float64 `json:"receive_deliveries_per_core_second"`
	// Config sizes the configuration given (or the defaults).
	Config ConfigPlan `json:"config"`
}

// ConfigPlan sizes one configuration.
type ConfigPlan struct {
	// File is the configuration file, "" for the defaults.
	File      string  `json:"file"`
	Users     int     `json:"users"`
	Rate      float64 `json:"rate"`
	GroupSize int     `json:"group_size"`
	// DeliveriesPerSecond is what the users receive: each message is
	// direct (one delivery) or to a group (GroupSize-1), alternately.
	DeliveriesPerSecond float64 `json:"deliveries_per_second"`
	// CPUCores is the CPU the configuration needs at the measured costs.
	CPUCores float64 `json:"cpu_cores"`
	// Shards is how many processes to run, and Bound what sets it:
	// "sessions" (SessionsPerProcess) or "cpu" (a shard's cores, as many
	// as this machine's, at saturation.max_cpu).
	Shards int    `json:"shards"`
	Bound  string `json:"bound"`
	// Machines is how many machines like this one the shards need
	// together, by CPU and memory, targets elsewhere.
	Machines int `json:"machines"`
	// GOMAXPROCS is what to set in each shard when several share one of
	// the machines (sharedGOMAXPROCS), 0 when each has a machine of its
	// own.
	GOMAXPROCS int `json:"gomaxprocs"`
}

// WriteJSON writes r as one indented JSON object.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r for a person: the figures, then the plan.
func WriteText(w io.Writer, r *Report) error {
	var b strings.Builder
	m := r.Machine
	// Port numbers are names, not counts: they stay ungrouped.
	fmt.Fprintf(&b, "imcanary bench (%s, %s): %s cores (load %.1f at the start), %s available, file limit %s, ephemeral ports %d-%d\n",
		r.Mode, time.Duration(r.Seconds*float64(time.Second)).Round(time.Second), count(float64(m.Cores)), m.Load1, bytesIEC(float64(m.MemAvailableBytes)),
		count(float64(m.FileLimit)), m.EphemeralPorts[0], m.EphemeralPorts[1])
	s := r.Setup
	against := "reference server(s) of their own"
	if s.Target != "reference" {
		against = "the target " + s.Target
	}
	reading := "a goroutine each"
	if s.Reactor {
		reading = "the reactor (population.reactor)"
	}
	fmt.Fprintf(&b, "%s prober process(es) against %s; logins at up to %s/s per prober (%s); sessions read by %s\n\n",
		count(float64(s.Processes)), against, count(s.ConnectRate), s.ConnectLimiter, reading)

	t := r.Throughput
	fmt.Fprintf(&b, "Verification throughput: the same delivery frames (%s B) at %s/s to each client, %s connections, %s rounds of %s\n",
		count(t.FrameBytes), count(t.OfferedPerSecond), count(float64(t.Connections)), count(float64(t.Rounds)), secs(t.WindowSeconds))
	fmt.Fprintf(&b, "  bare read loop   %9s deliveries per core-second  (%s/s on %.2f cores)\n",
		count(t.Bare.DeliveriesPerCoreSecond), count(t.Bare.DeliveriesPerSecond), t.Bare.CoresUsed)
	fmt.Fprintf(&b, "  imcanary         %9s deliveries per core-second  (%s/s on %.2f cores)  %.0f%% of the bare loop\n\n",
		count(t.Imcanary.DeliveriesPerCoreSecond), count(t.Imcanary.DeliveriesPerSecond), t.Imcanary.CoresUsed, 100*t.Ratio)

	traffic := "idle sessions"
	if s.Rate > 0 {
		traffic = fmt.Sprintf("%g msg/s per user, groups of %s", s.Rate, count(float64(s.GroupSize)))
	}
	fmt.Fprintf(&b, "Sessions: steps of %s, heartbeat %s, measured over %s after %s; baseline prober %s RSS\n",
		traffic, secs(s.HeartbeatSeconds), secs(s.WindowSeconds), secs(s.SettleSeconds), bytesIEC(float64(r.Baseline.RSSBytes)))
	fmt.Fprintf(&b, "  %-4s %8s %8s %9s %9s %9s %10s %10s %7s %5s %7s %9s %9s %7s  %s\n",
		"step", "per proc", "total", "logins/s", "login µs", "RSS/sess", "heap/sess", "CPU/sess", "GC/min", "GC%", "gorout", "deliv/s", "rcv p99", "others", "saturated")
	for i, st := range r.Steps {
		fmt.Fprintf(&b, "  %-4d %8s %8s %9s %9s %9s %10s %8.2fµs %7.1f %5s %7s %9s %9s %7.2f  %s\n",
			i+1, count(float64(st.SessionsPerProcess)), count(float64(st.Sessions)), count(st.LoginsPerSecond),
			count(st.LoginCPUSeconds*1e6)+"/"+count(st.TargetLoginCPUSeconds*1e6), bytesIEC(st.BytesPerSession), bytesIEC(st.HeapBytesPerSession),
			st.CPUSecondsPerSessionSecond*1e6, st.GCPerMinute, gcShare(st), count(float64(st.Goroutines)), count(st.DeliveriesPerSecond), lag(st), st.OtherCores, saturationCell(st))
	}
	b.WriteString("  (login µs: CPU per login in imcanary/in the target; RSS/sess and heap/sess: imcanary's, over the\n" +
		"   baseline; CPU/sess: CPU time per session per second; GC/min: collections per minute of one prober;\n" +
		"   GC%: the collector's share of the probers' CPU, ! past " + fmt.Sprintf("%.0f%%", 100*GCShareLimit) + "; gorout: the most goroutines of one\n" +
		"   prober at the window's end; others: cores used by other processes)\n")
	for i, st := range r.Steps {
		if st.GCBusy {
			fmt.Fprintf(&b, "  step %d: the collector took %.0f%% of the probers' CPU at %.1f collections a minute: its CPU figures measure the collector, not the sessions\n",
				i+1, 100*st.GCShare, st.GCPerMinute)
		}
		for _, f := range st.Fired {
			fmt.Fprintf(&b, "  step %d, %s\n", i+1, f)
		}
	}
	if l := r.Logins; l.LoginsPerSecond > 0 {
		fmt.Fprintf(&b, "Ramp baseline: a bare login loop (%s in flight, no rate limit) logged %s sessions in at %s/s,\n"+
			"  %s µs of CPU per login in the client and %s in the target", count(float64(l.Workers)), count(float64(l.Sessions)),
			count(l.LoginsPerSecond), count(l.CPUSecondsPerLogin*1e6), count(l.TargetCPUSecondsPerLogin*1e6))
		for _, st := range slices.Backward(r.Steps) {
			if st.SessionsPerProcess == l.Sessions && st.LoginsPerSecond > 0 {
				fmt.Fprintf(&b, "; imcanary's ramp at that size is %.0f%% of it", 100*st.LoginsPerSecond/l.LoginsPerSecond)
				break
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Stopped: %s", r.Stop.Reason)
	if r.Stop.Step > 0 {
		fmt.Fprintf(&b, " at step %d", r.Stop.Step)
	}
	if r.Stop.Detail != "" {
		fmt.Fprintf(&b, ": %s", r.Stop.Detail)
	}
	b.WriteString("\n\n")

	n := r.Noise
	fmt.Fprintf(&b, "Self-noise at %s sessions, %s of %s deliveries/s: receive lag p99 %s (%.2f%% over 2 ms), send lag p99 %s,\n",
		count(float64(n.Sessions)), count(n.DeliveriesPerSecond), count(s.NoiseDeliveriesPerSecond), lag(n), 100*n.ReceiveLagOver2ms, ms(n.SendLagP99Seconds))
	fmt.Fprintf(&b, "  %s deliveries per core-second end to end, %s RSS per session, other processes on %.2f cores; saturated: %s\n\n",
		count(n.DeliveriesPerCoreSecond), bytesIEC(n.BytesPerSession), n.OtherCores, saturationCell(n))

	p := r.Plan
	fmt.Fprintf(&b, "Capacity plan\n")
	fmt.Fprintf(&b, "  %s\n", heldLine(r))
	fmt.Fprintf(&b, "  A shard (one process) should hold at most %s sessions, bound by %s: fds allow %s (saturation.max_fds\n"+
		"  of the file limit, less the prober's own files), ports %s per source address and target (max_ports of the range).\n",
		count(float64(p.SessionsPerProcess)), p.Bound, count(float64(p.FDBound)), count(float64(p.PortBound)))
	fmt.Fprintf(&b, "  This machine's memory holds %s sessions at %s each, its CPU %s idle ones at %.2fµs/s each.\n",
		count(float64(p.MemorySessions)), bytesIEC(p.BytesPerSession), count(float64(p.CPUSessions)), p.CPUSecondsPerSessionSecond*1e6)
	fmt.Fprintf(&b, "  Deliveries per core-second: %s end to end with sending, %s receiving alone.\n",
		count(p.DeliveriesPerCoreSecond), count(p.ReceiveDeliveriesPerCoreSecond))
	c := p.Config
	name := c.File
	if name == "" {
		name = "the default configuration"
	}
	fmt.Fprintf(&b, "  For %s (%s users at %g msg/s, groups of %s: %s deliveries/s, %.3g cores): run %s shard(s) (bound by %s) on %s machine(s) like this one.\n",
		name, count(float64(c.Users)), c.Rate, count(float64(c.GroupSize)), count(c.DeliveriesPerSecond), c.CPUCores,
		count(float64(c.Shards)), c.Bound, count(float64(c.Machines)))
	if c.GOMAXPROCS > 0 {
		fmt.Fprintf(&b, "  With %s shards on one machine, set GOMAXPROCS=%d in each: every Go process otherwise takes all %d cores, and their collectors contend.\n",
			count(float64(ceilDiv(float64(c.Shards), float64(c.Machines)))), c.GOMAXPROCS, r.Machine.GOMAXPROCS)
	}
	if len(r.Warnings) > 0 {
		b.WriteString("\nNotes:\n")
		for _, w := range r.Warnings {
			fmt.Fprintf(&b, "  - %s\n", w)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// heldLine is the plan's first line: the sessions held and, as honestly
// as the run allows, whether that is what the machine holds. Without a
// limit reached it is only the largest step tried.
func heldLine(r *Report) string {
	p := r.Plan
	held := fmt.Sprintf("%s sessions at %s deliveries/s", count(float64(p.Sessions)), count(p.DeliveriesPerSecond))
	// The step that ended the run: "the next step, 119,616 sessions,"
	// after one that held, "the first step" when none did.
	which, why := "the next step", r.Stop.Detail
	if p.Sessions == 0 {
		which = "the first step"
	}
	if i := r.Stop.Step - 1; i >= 0 && i < len(r.Steps) {
		st := r.Steps[i]
		which += ", " + count(float64(st.Sessions)) + " sessions,"
		if len(st.Causes) > 0 {
			why = strings.Join(st.Causes, ", ")
		}
	}
	switch {
	case p.Limit == LimitSaturated && p.Sessions == 0:
		return fmt.Sprintf("No step held: %s saturated a prober (%s).", which, why)
	case p.Limit == LimitSaturated:
		return fmt.Sprintf("This machine holds %s: %s saturated a prober (%s).", held, which, why)
	case p.Limit == LimitNotOnline && p.Sessions == 0:
		return fmt.Sprintf("No step held: at %s a prober could not bring its sessions online.", which)
	case p.Limit == LimitNotOnline:
		return fmt.Sprintf("This machine holds %s: at %s a prober could not bring its sessions online.", held, which)
	case p.Limit == LimitFDs:
		return fmt.Sprintf("Held %s, every prober at a shard's file bound (%s sessions): more processes may hold more.",
			held, count(float64(p.FDBound)))
	case p.Limit == LimitPorts:
		return fmt.Sprintf("Held %s, every prober at a shard's port bound (%s sessions): more source addresses may hold more.",
			held, count(float64(p.PortBound)))
	case p.Limit == LimitMemory:
		return fmt.Sprintf("This machine holds %s: its available memory holds %s at %s each.",
			held, count(float64(p.MemorySessions)), bytesIEC(p.BytesPerSession))
	case p.Sessions == 0:
		return fmt.Sprintf("No session step held (stopped: %s); no limit was reached.", r.Stop.Reason)
	case r.Stop.Reason != StopStepsDone:
		return fmt.Sprintf("Held %s before the run stopped (%s); no limit was reached.", held, r.Stop.Reason)
	}
	return fmt.Sprintf("Held %s, the largest step tried; no limit was reached, so this machine may hold more.", held)
}

// lag is a step's receive-lag p99, "-" for a step without deliveries.
func lag(s Step) string {
	if s.DeliveriesPerSecond == 0 {
		return "-"
	}
	return ms(s.ReceiveLagP99Seconds)
}

func saturationCell(s Step) string {
	out := "no"
	if s.Saturated {
		out = "yes (" + strings.Join(s.Causes, ", ") + ")"
	}
	if len(s.Discounted) > 0 {
		out += " [discounted: " + strings.Join(s.Discounted, ", ") + "]"
	}
	return out
}

// count formats n, rounded to a whole number, with thousands separators.
// Every count and whole figure of the text report goes through it, so that
// no line shows 20000 beside 17,989; port numbers, step numbers and
// process ids are names and are printed as they are.
func count(n float64) string {
	if math.IsNaN(n) || math.IsInf(n, 0) {
		return "-"
	}
	// As %.0f rounds: half to even.
	return report.FormatCount(int64(math.RoundToEven(n)))
}

func bytesIEC(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}

func ms(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", s*1e3)
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).String()
}
