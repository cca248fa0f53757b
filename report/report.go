// Package report is what a soak run and a canary round record, and how it
// is written for machines and for people: Soak and Round, the JSON that
// pipelines and the run history read, a text summary for a terminal, and a
// self-contained HTML page with SVG charts. The charts and the number
// formatting are shared with the other pages imcanary draws (the status
// page), so that the same figure reads the same everywhere. It renders and
// parses; it neither runs nor stores anything.
package report

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"time"
)

// Soak is the report of one soak run. Its JSON field names are a stable
// interface for pipelines: add fields, never rename or remove one.
type Soak struct {
	// ID identifies the run in the history: the start time and a random
	// suffix, sortable as text.
	ID      string  `json:"id"`
	Kind    string  `json:"kind"` // "soak"
	Target  string  `json:"target"`
	Profile Profile `json:"profile"`
	// Result is "pass", "fail", "inconclusive" or "aborted".
	// Inconclusive is a run that missed a threshold while imcanary itself
	// was saturated during the send or drain phase: the failure may be
	// the prober's own, so it is neither a pass nor the server's fail
	// (Saturation says when and why). Aborted is a run stopped before its
	// end; an aborted run never passes.
	Result string    `json:"result"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	// Phases are the start times of ramp, send and drain (PhaseRamp,
	// PhaseSend, PhaseDrain).
	Phases []Phase `json:"phases"`

	// CatchUp is target.catch_up during the run, "on" or "off": on, a
	// device fetched what it missed and Deliveries count it recovered.
	// Reports of releases before catch-up have none, and render as they
	// did.
	CatchUp string `json:"catch_up,omitempty"`

	Users    Users    `json:"users"`
	Messages Messages `json:"messages"`
	// Deliveries by kind: "direct", "group" and "all", to normal users
	// only: the slow readers of a drill are counted in Drill.
	Deliveries map[string]Deliveries `json:"deliveries"`
	// Disconnects of normal users by reason (server_close, slow_consumer,
	// error), our own shutdown at the end of the run excluded. The slow
	// readers' disconnects are the drill's result, in Drill.
	Disconnects map[string]int64 `json:"disconnects"`
	// Latency percentiles: "login", "ack", "delivery_direct",
	// "delivery_group". Delivery latencies are normal users' only.
	Latency map[string]Percentiles `json:"latency"`
	// Thresholds judge the normal users: loss, late, p99_delivery,
	// min_online_ratio and max_disconnects leave the slow readers out,
	// since a slow reader being disconnected or left behind is the
	// drill's experiment, not a failure.
	Thresholds []Threshold `json:"thresholds"`
	// Drill is the slow-reader drill's outcome; nil when the profile has
	// no slow readers.
	Drill *Drill `json:"drill,omitempty"`
	// Storm is the reconnect-storm drill's outcome; nil when the profile
	// has none.
	Storm *Storm `json:"storm,omitempty"`
	// ConnectPath is where the run's own connects spent their time over
	// the run, by phase; nil in reports from before it.
	ConnectPath *ConnectPath `json:"connect_path,omitempty"`
	// Saturation says when imcanary itself was saturated during the run;
	// nil when it never was (or no self-monitor was running).
	Saturation *Saturation `json:"saturation,omitempty"`
	// Errors are the most frequent error messages with their counts, at
	// most 10, most frequent first.
	Errors []ErrorCount `json:"errors"`
	// Samples are the run's time series, one per sample interval.
	Samples []Sample `json:"samples"`
	// Shard is the shard of a sharded deployment that ran this report's
	// run, "I/N" (the shard setting), empty for a process of its own. A
	// merged report has Shards instead.
	Shard string `json:"shard,omitempty"`
	// Shards are the shard reports a merged report was made of (imcanary
	// soak merge), in shard order; empty in a shard's own report.
	Shards []ShardRun `json:"shards,omitempty"`
	// Histograms are the latency histograms the Latency percentiles were
	// read from, by the same keys, in hdrhistogram-go's compressed V2
	// encoding (base64 text): percentiles of several shards cannot be
	// combined, their histograms can. Reports before them have none.
	Histograms map[string]string `json:"histograms,omitempty"`
	// Notes say how numbers were measured where a reader could misread
	// them, and anything that makes the verdict less than certain.
	Notes []string `json:"notes,omitempty"`
	// Comparisons set this run beside the previous run of its profile
	// and the profile's pinned baseline, in that order; empty in reports
	// written before comparisons, or saved without a history.
	Comparisons []Comparison `json:"comparisons,omitempty"`
}

// ShardRun is one shard's run in a merged report.
type ShardRun struct {
	Shard  string    `json:"shard"`
	ID     string    `json:"id"`
	Result string    `json:"result"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
}

// Profile is the soak profile a run used, as configured.
type Profile struct {
	Name      string `json:"name"`
	Users     int    `json:"users"`
	GroupSize int    `json:"group_size"`
	// Groups is the group layout (COUNTxSIZE entries) when the profile
	// had one; Devices is the sessions per user, 0 in reports of
	// releases before devices (one each).
	Groups   string        `json:"groups,omitempty"`
	Devices  int           `json:"devices,omitempty"`
	Rate     float64       `json:"rate"` // messages per second per user
	Ramp     time.Duration `json:"ramp_ns"`
	Duration time.Duration `json:"duration_ns"`
	// Settle is the first part of Duration whose messages are not judged
	// on latency; 0 (and absent) judges them all.
	Settle   time.Duration `json:"settle_ns,omitempty"`
	Drain    time.Duration `json:"drain_ns"`
	Deadline time.Duration `json:"deadline_ns"`
	// LateLogins is the fraction of users who log in only after LateAfter,
	// so messages sent to them meanwhile test offline delivery.
	LateLogins float64       `json:"late_logins"`
	LateAfter  time.Duration `json:"late_after_ns"`
	// The slow-reader settings of a drill are in Soak.Drill, beside its
	// outcome.
	Thresholds Thresholds `json:"thresholds"`
}

// Thresholds are the limits a run must stay within to pass.
type Thresholds struct {
	MaxLoss float64 `json:"max_loss"` // ratio of expected deliveries
	MaxLate float64 `json:"max_late"` // ratio of deliveries
	// MaxRefused bounds the sends refused or never acked, per send; 0 in
	// reports of releases before it.
	MaxRefused float64 `json:"max_refused,omitempty"`
	// MinRealtimeCompleteness bounds Deliveries.Realtime; 0 does not
	// judge it.
	MinRealtimeCompleteness float64       `json:"min_realtime_completeness"`
	P99Ack                  time.Duration `json:"p99_ack_ns"`
	P99Delivery             time.Duration `json:"p99_delivery_ns"`
	MinOnlineRatio          float64       `json:"min_online_ratio"`
	MaxDisconnects          int64         `json:"max_disconnects"`
	// Recovery99 and Recovery100 bound a storm drill's recovery; 0
	// without one.
	Recovery99  time.Duration `json:"recovery_99_ns,omitempty"`
	Recovery100 time.Duration `json:"recovery_100_ns,omitempty"`
}

// Phase is the start of one phase of the run.
type Phase struct {
	Name  string    `json:"name"` // PhaseRamp, PhaseSend or PhaseDrain
	Start time.Time `json:"start"`
}

// The phases of a soak run, as Phase.Name and Sample.Phase name them.
const (
	PhaseRamp  = "ramp"
	PhaseSend  = "send"
	PhaseDrain = "drain"
)

// Users counts the cohort's logins.
type Users struct {
	Configured int `json:"configured"`
	// LoggedIn is how many distinct users logged in at least once.
	LoggedIn int `json:"logged_in"`
	// FailedLogins counts failed connect or login attempts.
	FailedLogins int64 `json:"failed_logins"`
	Groups       int   `json:"groups"`
	// MinOnlineRatio is the lowest ratio of normal users online to normal
	// users due online sampled during the send phase (slow readers left
	// out).
	MinOnlineRatio float64 `json:"min_online_ratio"`
}

// Messages counts what the cohort sent.
type Messages struct {
	Sent int64 `json:"sent"`
	// SentPerSec is Sent over SendSeconds, how long the send phase
	// actually ran: shorter than the profile's duration when the run was
	// aborted while sending, and 0 when it never began. Reports written
	// before send_seconds existed divided by the profile's duration.
	SentPerSec  float64 `json:"sent_per_second"`
	SendSeconds float64 `json:"send_seconds"`
	Acked       int64   `json:"acked"`
	Unacked     int64   `json:"unacked"` // ack timeouts and sessions that ended first
	// AckTimeouts is the part of Unacked that no ack came for within the
	// ack timeout (the rest ended with their session); 0 in reports
	// before it.
	AckTimeouts int64 `json:"ack_timeouts,omitempty"`
	Offline     int64 `json:"offline"` // intended sends skipped: sender offline
	WriteErrors int64 `json:"write_errors"`
	// Rejected counts the server's refusals by its error code.
	Rejected map[string]int64 `json:"rejected"`
}

// Deliveries counts deliveries of one kind. Delivered counts pushes, on
// time or late; Recovered what a device fetched by catch-up instead. Lost
// is what the ledger wrote off during the run; Undelivered is what was
// still missing when the drain ended. The verdict's loss ratio counts both.
//
// Two completeness figures follow, side by side: real-time (pushed within
// the deadline: Delivered - Late, per Expected) and eventual (pushed or
// recovered at all: 1 - LossRatio). A server that drops pushes but keeps
// its store misses the first only; one that loses data misses both.
type Deliveries struct {
	Expected  int64 `json:"expected"`
	Delivered int64 `json:"delivered"`
	Recovered int64 `json:"recovered"`
	// LatePush counts pushes of what a device had already recovered: of
	// Recovered, these were pushed after all, later than the catch-up
	// grace; the rest were not pushed before lost_after.
	LatePush    int64   `json:"late_push,omitempty"`
	Lost        int64   `json:"lost"`
	Undelivered int64   `json:"undelivered"`
	Late        int64   `json:"late"`
	Duplicate   int64   `json:"duplicate"`
	Reordered   int64   `json:"reordered"`
	LossRatio   float64 `json:"loss_ratio"` // (Lost + Undelivered) / Expected
	LateRatio   float64 `json:"late_ratio"` // Late / Delivered
	// RealtimeMissRatio is what was not pushed within the deadline (late,
	// recovered, lost or undelivered) per Expected.
	RealtimeMissRatio float64 `json:"realtime_miss_ratio"`
}

// Realtime returns the real-time completeness, 1 - RealtimeMissRatio.
func (d Deliveries) Realtime() float64 { return 1 - d.RealtimeMissRatio }

// Eventual returns the eventual completeness, 1 - LossRatio.
func (d Deliveries) Eventual() float64 { return 1 - d.LossRatio }

// Percentiles of one latency, in nanoseconds in JSON. Count is the number
// of observations; the others are zero when it is. Mean is the histogram's
// (its values at 3 significant digits), which published tests report
// beside the maximum, as OpenIM's does.
type Percentiles struct {
	Count int64         `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
	Mean  time.Duration `json:"mean_ns"`
}

// Threshold is one row of the verdict table.
type Threshold struct {
	Name string `json:"name"`
	// Limit and Actual are shown as text ("0.1%", "500ms") and as numbers
	// (ratios, or seconds for durations) for machines.
	Limit       string  `json:"limit"`
	Actual      string  `json:"actual"`
	LimitValue  float64 `json:"limit_value"`
	ActualValue float64 `json:"actual_value"`
	Pass        bool    `json:"pass"`
	// Cause says why a failed threshold failed, where the run knows
	// ("95% of the deliveries slower than 2s went to late logins").
	Cause string `json:"cause,omitempty"`
}

// ErrorCount is one distinct error and how often it happened.
type ErrorCount struct {
	Error string `json:"error"`
	Count int64  `json:"count"`
}

// Sample is the run's state at one moment, with rates and latency over the
// interval that ended then.
//
// Online counts every session of the cohort, slow readers included; the
// deliveries, losses, disconnects and latencies are normal users' only.
type Sample struct {
	T           time.Time `json:"t"`
	Phase       string    `json:"phase"`
	Online      int       `json:"online"`
	SentPerSec  float64   `json:"sent_per_second"`
	DelivPerSec float64   `json:"delivered_per_second"`
	// Cumulative counts since the start of the run.
	Lost        int64 `json:"lost"`
	Late        int64 `json:"late"`
	Disconnects int64 `json:"disconnects"`
	// Delivery latency over the interval; zero when nothing arrived.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// SlowReaderDisconnects counts the slow readers' disconnects since
	// the start of the run, and SlowReaderLag is the most messages an
	// online slow reader was behind at the population's last sweep;
	// both zero without a drill.
	SlowReaderDisconnects int64 `json:"slow_reader_disconnects,omitempty"`
	SlowReaderLag         int64 `json:"slow_reader_lag_messages,omitempty"`
	// Saturated says the prober was saturated when the sample was taken,
	// for the causes listed.
	Saturated        bool     `json:"saturated,omitempty"`
	SaturationCauses []string `json:"saturation_causes,omitempty"`
}

// Drill is the outcome of a slow-reader drill: what the server did to the
// users who read slowly, and what it cost everyone else.
type Drill struct {
	// SlowReaders is how many of the users read slowly; they receive and
	// never send.
	SlowReaders int `json:"slow_readers"`
	// The drill as configured: the fraction of users who read slowly, a
	// pause after every delivery they read, and a longer pause at their
	// first delivery and then every PauseEvery (0: once a session).
	Fraction   float64       `json:"fraction"`
	ReadDelay  time.Duration `json:"read_delay_ns"`
	Pause      time.Duration `json:"pause_ns"`
	PauseEvery time.Duration `json:"pause_every_ns"`
	// Reaction is the server's reaction in one line, derived from the
	// numbers below.
	Reaction string `json:"reaction"`
	// Deliveries to the slow readers, both kinds summed.
	Deliveries Deliveries `json:"deliveries"`
	// Latency of the deliveries to slow readers, and NormalP99 the
	// normal users' delivery p99 beside it: the drill's cost to the
	// others in one number.
	Latency   Percentiles   `json:"latency"`
	NormalP99 time.Duration `json:"normal_p99_ns"`
	// Disconnects of slow readers by reason, our own shutdown excluded,
	// and by the server's close code ("4008"); a session that ended
	// without a close frame has a reason and no code.
	Disconnects map[string]int64 `json:"disconnects"`
	CloseCodes  map[string]int64 `json:"close_codes"`
	// TimeToDisconnect runs from when a slow reader started being slow
	// (its session's login or the start of the send phase, whichever is
	// later) to when imcanary saw the server end the session.
	TimeToDisconnect Percentiles `json:"time_to_disconnect"`
	// MaxLagMessages is the most messages a slow reader was behind at
	// any sample: acknowledged to its conversations and not yet read.
	MaxLagMessages int64 `json:"max_lag_messages"`
}

// Saturation is when imcanary's own self-monitor found it saturated
// during the run: its latency and loss numbers then include its own delay.
type Saturation struct {
	// Periods are the saturated spans, in order. Each sample that found
	// the prober saturated marks the interval that ended at it; adjacent
	// ones merge.
	Periods []SaturatedPeriod `json:"periods"`
	// SendDrainRatio is the saturated fraction of the send and drain
	// phases, the part of the run the thresholds judge.
	SendDrainRatio float64 `json:"send_drain_ratio"`
	// DeliverySamples counts delivery latency samples (both cohorts)
	// recorded while the prober said it was saturated.
	DeliverySamples int64 `json:"delivery_samples"`
}

// SaturatedPeriod is one span in which the prober was saturated, with
// every cause seen in it.
type SaturatedPeriod struct {
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Causes []string  `json:"causes"`
}

// Round is the record of one canary round.
type Round struct {
	ID     string    `json:"id"`
	Kind   string    `json:"kind"` // "canary"
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Result string    `json:"result"` // "pass" or "fail"
	// Checks has one entry per message kind ("direct", "group").
	Checks []Check `json:"checks"`
	// Cause says in words why a round that failed with session_down did:
	// how many canary users were offline and the last connect error, as
	// "2 of 4 canary users offline: connection refused (dial tcp …)".
	Cause string `json:"cause,omitempty"`
}

// Check is the outcome of one kind of message in a canary round.
type Check struct {
	Kind     string `json:"kind"`
	Pass     bool   `json:"pass"`
	Expected int    `json:"expected"`
	// Delivered counts deliveries pushed within the deadline: the
	// round's real-time completeness is Delivered / Expected.
	Delivered int `json:"delivered"`
	// Recovered counts deliveries a recipient fetched by catch-up
	// instead, within the deadline: complete eventually, but a failed
	// round, since nothing was pushed. (Delivered + Recovered) / Expected
	// is the round's eventual completeness.
	Recovered int `json:"recovered,omitempty"`
	// Reasons the check failed: "session_down", "no_ack",
	// "not_delivered", "late", "duplicated", "recovered"; empty when it
	// passed.
	Reasons []string `json:"reasons,omitempty"`
	// MaxLatency is the slowest delivery of the round.
	MaxLatency time.Duration `json:"max_latency_ns"`
}

// NewRunID returns an id for a soak run or a canary round that starts at
// t: the UTC time and six random hex digits, e.g.
// "20261130T031500Z-3f9a1c". Ids sort as their start times do.
func NewRunID(t time.Time) string {
	var b [3]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return t.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// RunSummary is one soak run as the history lists it.
type RunSummary struct {
	ID      string    `json:"id"`
	Kind    string    `json:"kind"`
	Target  string    `json:"target"`
	Profile string    `json:"profile"`
	Result  string    `json:"result"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	// LossRatio is that of all deliveries ("all" in Soak.Deliveries).
	LossRatio float64 `json:"loss_ratio"`
	// P99Delivery is the worse of the direct and group p99 delivery
	// latencies.
	P99Delivery time.Duration `json:"p99_delivery_ns"`
}

// Summary is r as the history lists it.
func (r *Soak) Summary() RunSummary {
	return RunSummary{
		ID:          r.ID,
		Kind:        r.Kind,
		Target:      r.Target,
		Profile:     r.Profile.Name,
		Result:      r.Result,
		Start:       r.Start,
		End:         r.End,
		LossRatio:   r.Deliveries["all"].LossRatio,
		P99Delivery: max(r.Latency["delivery_direct"].P99, r.Latency["delivery_group"].P99),
	}
}

// PhasesDuring names the phases of r that overlap the span from..to.
func (r *Soak) PhasesDuring(from, to time.Time) []string {
	var names []string
	for i, ph := range r.Phases {
		end := r.End
		if i+1 < len(r.Phases) {
			end = r.Phases[i+1].Start
		}
		if ph.Start.IsZero() || ph.Start.After(to) || (!end.IsZero() && !end.After(from)) {
			continue
		}
		names = append(names, ph.Name)
	}
	return names
}

// Causes is the union of every period's causes, sorted.
func (s *Saturation) Causes() []string {
	var all []string
	for _, p := range s.Periods {
		all = append(all, p.Causes...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}
