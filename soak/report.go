// Package soak runs soak tests: a cohort of users ramped in on top of the
// background population, open-loop traffic for a duration, a drain, and a
// report with a verdict. It also keeps the run history (soak runs and canary
// rounds) under the data directory.
package soak

import "time"

// Report is the outcome of one soak run. Its JSON field names are a stable
// interface for pipelines: add fields, never rename or remove one.
type Report struct {
	// ID identifies the run in the history: the start time and a random
	// suffix, sortable as text.
	ID      string  `json:"id"`
	Kind    string  `json:"kind"` // "soak"
	Target  string  `json:"target"`
	Profile Profile `json:"profile"`
	// Result is "pass", "fail" or "aborted" (stopped before its end; an
	// aborted run never passes).
	Result string    `json:"result"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	// Phases are the start times of ramp, send and drain.
	Phases []Phase `json:"phases"`

	Users    Users    `json:"users"`
	Messages Messages `json:"messages"`
	// Deliveries by kind: "direct", "group" and "all".
	Deliveries map[string]Deliveries `json:"deliveries"`
	// Disconnects by reason (server_close, slow_consumer, error), our own
	// shutdown at the end of the run excluded.
	Disconnects map[string]int64 `json:"disconnects"`
	// Latency percentiles: "login", "ack", "delivery_direct",
	// "delivery_group".
	Latency    map[string]Percentiles `json:"latency"`
	Thresholds []Threshold            `json:"thresholds"`
	// Errors are the most frequent error messages with their counts, at
	// most 10, most frequent first.
	Errors []ErrorCount `json:"errors"`
	// Samples are the run's time series, one per sample interval.
	Samples []Sample `json:"samples"`
	// Notes say how numbers were measured where a reader could misread
	// them, and anything that makes the verdict less than certain.
	Notes []string `json:"notes,omitempty"`
}

// Profile is the soak profile a run used, as configured.
type Profile struct {
	Name      string        `json:"name"`
	Users     int           `json:"users"`
	GroupSize int           `json:"group_size"`
	Rate      float64       `json:"rate"` // messages per second per user
	Ramp      time.Duration `json:"ramp_ns"`
	Duration  time.Duration `json:"duration_ns"`
	Drain     time.Duration `json:"drain_ns"`
	Deadline  time.Duration `json:"deadline_ns"`
	// LateLogins is the fraction of users who log in only after LateAfter,
	// so messages sent to them meanwhile test offline delivery.
	LateLogins float64       `json:"late_logins"`
	LateAfter  time.Duration `json:"late_after_ns"`
	// SlowReaders is reserved for the slow-reader drills.
	Thresholds Thresholds `json:"thresholds"`
}

// Thresholds are the limits a run must stay within to pass.
type Thresholds struct {
	MaxLoss        float64       `json:"max_loss"` // ratio of expected deliveries
	MaxLate        float64       `json:"max_late"` // ratio of deliveries
	P99Ack         time.Duration `json:"p99_ack_ns"`
	P99Delivery    time.Duration `json:"p99_delivery_ns"`
	MinOnlineRatio float64       `json:"min_online_ratio"`
	MaxDisconnects int64         `json:"max_disconnects"`
}

// Phase is the start of one phase of the run.
type Phase struct {
	Name  string    `json:"name"` // "ramp", "send", "drain"
	Start time.Time `json:"start"`
}

// Users counts the cohort's logins.
type Users struct {
	Configured int `json:"configured"`
	// LoggedIn is how many distinct users logged in at least once.
	LoggedIn int `json:"logged_in"`
	// FailedLogins counts failed connect or login attempts.
	FailedLogins int64 `json:"failed_logins"`
	Groups       int   `json:"groups"`
	// MinOnlineRatio is the lowest online/configured ratio sampled during
	// the send phase.
	MinOnlineRatio float64 `json:"min_online_ratio"`
}

// Messages counts what the cohort sent.
type Messages struct {
	Sent        int64   `json:"sent"`
	SentPerSec  float64 `json:"sent_per_second"` // over the send phase
	Acked       int64   `json:"acked"`
	Unacked     int64   `json:"unacked"` // ack timeouts and sessions that ended first
	Offline     int64   `json:"offline"` // intended sends skipped: sender offline
	WriteErrors int64   `json:"write_errors"`
	// Rejected counts the server's refusals by its error code.
	Rejected map[string]int64 `json:"rejected"`
}

// Deliveries counts deliveries of one kind. Lost is what the ledger wrote
// off during the run; Undelivered is what was still missing when the drain
// ended. The verdict's loss ratio counts both.
type Deliveries struct {
	Expected    int64   `json:"expected"`
	Delivered   int64   `json:"delivered"`
	Lost        int64   `json:"lost"`
	Undelivered int64   `json:"undelivered"`
	Late        int64   `json:"late"`
	Duplicate   int64   `json:"duplicate"`
	Reordered   int64   `json:"reordered"`
	LossRatio   float64 `json:"loss_ratio"` // (Lost + Undelivered) / Expected
	LateRatio   float64 `json:"late_ratio"` // Late / Delivered
}

// Percentiles of one latency, in nanoseconds in JSON. Count is the number
// of observations; the others are zero when it is.
type Percentiles struct {
	Count int64         `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
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
}

// ErrorCount is one distinct error and how often it happened.
type ErrorCount struct {
	Error string `json:"error"`
	Count int64  `json:"count"`
}

// Sample is the run's state at one moment, with rates and latency over the
// interval that ended then.
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
}

// Canary is the record of one canary round.
type Canary struct {
	ID     string    `json:"id"`
	Kind   string    `json:"kind"` // "canary"
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Result string    `json:"result"` // "pass" or "fail"
	// Checks has one entry per message kind ("direct", "group").
	Checks []CanaryCheck `json:"checks"`
}

// CanaryCheck is the outcome of one kind of message in a canary round.
type CanaryCheck struct {
	Kind     string `json:"kind"`
	Pass     bool   `json:"pass"`
	Expected int    `json:"expected"`
	// Delivered counts deliveries within the deadline.
	Delivered int `json:"delivered"`
	// Reasons the check failed: "session_down", "no_ack",
	// "not_delivered", "late", "duplicated"; empty when it passed.
	Reasons []string `json:"reasons,omitempty"`
	// MaxLatency is the slowest delivery of the round.
	MaxLatency time.Duration `json:"max_latency_ns"`
}
