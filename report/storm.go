package report

import (
	"fmt"
	"time"
)

// Storm is the outcome of a reconnect-storm drill: a fraction of a
// population's sessions dropped at once without a clean close, and how
// they came back.
type Storm struct {
	// Population is whose sessions were dropped: "background" (the
	// daemon's background population) or "soak" (the run's own cohort).
	Population string `json:"population"`
	// Fraction is the drill as configured; Online the sessions of that
	// population online at the drop, Dropped how many were aborted.
	Fraction float64   `json:"fraction"`
	At       time.Time `json:"at"`
	Online   int       `json:"online"`
	Dropped  int       `json:"dropped"`
	// Back is how many of the dropped sessions logged in again before
	// the run ended.
	Back int `json:"back"`
	// Recovery99 and Recovery100 run from the drop to the login that
	// brought 99% (rounded up) and all of the dropped sessions back; 0
	// with Reached99 or Reached100 false when that never came.
	Recovery99  time.Duration `json:"recovery_99_ns"`
	Recovery100 time.Duration `json:"recovery_100_ns"`
	Reached99   bool          `json:"reached_99"`
	Reached100  bool          `json:"reached_100"`
	// Login is the duration of the dropped sessions' successful connect
	// attempts (dial and login) after the drop; FailedAttempts counts the
	// ones that failed.
	Login          Percentiles `json:"login"`
	FailedAttempts int64       `json:"failed_attempts"`
	// Attempts counts the connect attempts of AttemptsOf ("process":
	// every population sharing the process's limiter; "dropped sessions"
	// when there is no limiter) from the drop to the last session back
	// (or the run's end), over AttemptsSpan; AttemptsPerSec is their
	// mean rate and PeakPerSec the most in any one second, beside
	// MaxConnectRate (population.max_connect_rate; 0 is no limit) and its
	// Burst.
	AttemptsOf     string        `json:"attempts_of"`
	Attempts       int64         `json:"attempts"`
	AttemptsSpan   time.Duration `json:"attempts_span_ns"`
	AttemptsPerSec float64       `json:"attempts_per_sec"`
	PeakPerSec     float64       `json:"peak_per_sec"`
	MaxConnectRate float64       `json:"max_connect_rate"`
	Burst          int           `json:"burst"`
	// Deliveries are the dropped population's, from the drop to the end
	// of the run: what the storm cost, lost, late or fetched again
	// (recovered).
	Deliveries Deliveries    `json:"deliveries"`
	Window     time.Duration `json:"window_ns"`
	// InFlightAtDrop is how many of Deliveries.Expected were owed before
	// the drop and not yet received at it (expected less delivered,
	// recovered and lost then).
	InFlightAtDrop int64 `json:"in_flight_at_drop"`
	// ConnectPath is where the dropped population's logins spent their
	// time during the storm, from the drop until every dropped session
	// was back (or the run's end, if some never were): ConnectUntilEnd
	// says it ran to the end. Nil in reports from before it.
	ConnectPath     *ConnectPath `json:"connect_path,omitempty"`
	ConnectUntilEnd bool         `json:"connect_until_end,omitempty"`
}

// renderStormRows are the lines of the storm drill, the same in the text
// and HTML reports; the headline (renderStormHeadline) is shown apart,
// first.
func renderStormRows(r *Soak) []renderKV {
	s := r.Storm
	dl := s.Deliveries
	rate := "no limit"
	if s.MaxConnectRate > 0 {
		rate = fmt.Sprintf("%s/s (burst %s)", renderRate(s.MaxConnectRate), renderCount(int64(s.Burst)))
	}
	rows := []renderKV{
		{"dropped", fmt.Sprintf("%s of %s %s sessions online (%s), at %s, without a close", renderCount(int64(s.Dropped)),
			renderCount(int64(s.Online)), s.Population, renderPercent(s.Fraction), renderTime(s.At))},
		{"back", fmt.Sprintf("%s of %s by the end of the run", renderCount(int64(s.Back)), renderCount(int64(s.Dropped)))},
		{"time to 99% back", renderReached(s.Recovery99, s.Reached99)},
		{"time to 100% back", renderReached(s.Recovery100, s.Reached100)},
		{"login latency", renderPercentiles(s.Login)},
		{"failed attempts", renderCount(s.FailedAttempts)},
		{"connect attempts", fmt.Sprintf("%s of the %s in %s: %s/s mean, %s/s peak second; max_connect_rate %s",
			renderCount(s.Attempts), s.AttemptsOf, renderLatency(s.AttemptsSpan), renderRate(s.AttemptsPerSec), renderRate(s.PeakPerSec), rate)},
		{"deliveries", fmt.Sprintf("%s expected (%s of them in flight at the drop), %s delivered, %s recovered, %s lost, %s late, over the %s from the drop",
			renderCount(dl.Expected), renderCount(s.InFlightAtDrop), renderCount(dl.Delivered), renderCount(dl.Recovered), renderCount(dl.Lost),
			renderCount(dl.Late), renderSpan(s.Window))},
	}
	if c := s.ConnectPath; c != nil {
		until := "until all were back"
		if s.ConnectUntilEnd {
			until = "until the end of the run"
		}
		rows = append(rows, renderKV{"login by phase", renderConnectLine(c) + ", from the drop " + until + ", from histogram buckets"})
	}
	return rows
}

// renderStormHeadline says in one line how the dropped sessions came
// back.
func renderStormHeadline(s *Storm) string {
	switch {
	case s.Dropped == 0:
		return "nothing dropped: no session was online at the drop"
	case s.Reached100:
		return fmt.Sprintf("all %s back after %s (99%% after %s)", renderCount(int64(s.Dropped)),
			renderLatency(s.Recovery100), renderLatency(s.Recovery99))
	}
	return fmt.Sprintf("%s of %s back by the end of the run", renderCount(int64(s.Back)), renderCount(int64(s.Dropped)))
}

func renderReached(d time.Duration, reached bool) string {
	if !reached {
		return "not reached"
	}
	return renderLatency(d)
}
