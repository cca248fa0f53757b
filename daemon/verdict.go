package daemon

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// Verdicts of the status page, worst first in the order judge tries them.
const (
	VerdictDown      = "down"
	VerdictSaturated = "saturated"
	VerdictStarting  = "starting"
	VerdictDegraded  = "degraded"
	VerdictHealthy   = "healthy"
)

// Verdict is the status page's one-word answer and why, in words.
type Verdict struct {
	// State is one of the Verdict* values.
	State string `json:"state"`
	// Cause is the main reason, in a sentence; Causes lists every reason
	// found, Cause first.
	Cause  string   `json:"cause"`
	Causes []string `json:"causes"`
}

// WindowSLI is the record of one source and message kind over the recent
// window, judged as the SLO rules judge it: real-time completeness counts
// a delivery lost, late or recovered by catch-up as bad, eventual
// completeness only one lost, and latency one over a second.
type WindowSLI struct {
	Source    string  `json:"source"`
	Kind      string  `json:"kind"`
	Expected  float64 `json:"expected"`
	Delivered float64 `json:"delivered"`
	Recovered float64 `json:"recovered"`
	Lost      float64 `json:"lost"`
	Late      float64 `json:"late"`
	Duplicate float64 `json:"duplicate"`
	Reordered float64 `json:"reordered"`
	// Completeness is the real-time completeness, 1 -
	// (lost+late+recovered)/expected, and Eventual 1 - lost/expected,
	// both null while nothing was expected; Latency is the share of
	// deliveries within a second, null while nothing was delivered.
	Completeness *float64 `json:"completeness"`
	Eventual     *float64 `json:"eventual_completeness"`
	Latency      *float64 `json:"latency"`
	// P99 is the 99th percentile of delivery latency in seconds,
	// estimated from the histogram's buckets; null with no delivery.
	P99 *float64 `json:"p99_seconds"`
}

// RecentStatus is the recent window: its SLIs, the connect failures in it
// by reason, and the objective they are judged by.
type RecentStatus struct {
	// Window is how far back the figures go: recentWindow, or less just
	// after the start.
	Window    time.Duration      `json:"window_ns"`
	Objective float64            `json:"objective"`
	SLIs      []WindowSLI        `json:"slis"`
	Connects  float64            `json:"connects"`
	Failures  map[string]float64 `json:"connect_failures"`
	// LostAfter is population.lost_after: loss is judged this long after
	// sending, so the window's losses are those of messages sent that
	// much earlier.
	LostAfter time.Duration `json:"lost_after_ns"`
}

// ReachStatus is engine.ReachState for the page.
type ReachStatus struct {
	Known       bool      `json:"known"`
	Reachable   bool      `json:"reachable"`
	Since       time.Time `json:"since"`
	Reason      string    `json:"reason,omitempty"`
	Cause       string    `json:"cause,omitempty"`
	LastFailure time.Time `json:"last_failure"`
}

func reachStatus(st engine.ReachState) ReachStatus {
	r := ReachStatus{Known: st.Known, Reachable: st.Reachable, Since: st.Since, LastFailure: st.LastFailure}
	if st.Reason != "" {
		r.Reason, r.Cause = st.Reason, st.Cause()
	}
	return r
}

// SaturationStatus is the prober's self-monitor, as the page shows it.
type SaturationStatus struct {
	Saturated bool      `json:"saturated"`
	Since     time.Time `json:"since"`
	Causes    []string  `json:"causes"`
}

// windowSLIs turns two readings into the recent window's SLIs, in the
// order of trendSources and metrics.Kinds.
func windowSLIs(from, to trendPoint) []WindowSLI {
	var out []WindowSLI
	for s, src := range trendSources {
		for k, kind := range metrics.Kinds {
			d := to.kind[s][k].minus(from.kind[s][k])
			w := WindowSLI{Source: src, Kind: kind, Expected: d.expected, Delivered: d.delivered, Recovered: d.recovered,
				Lost: d.lost, Late: d.late, Duplicate: d.duplicate, Reordered: d.reordered}
			if d.expected > 0 {
				c := clamp01(1 - (d.lost+d.late+d.recovered)/d.expected)
				e := clamp01(1 - d.lost/d.expected)
				w.Completeness, w.Eventual = &c, &e
			}
			if d.delivered > 0 {
				l := clamp01(d.within(1) / d.delivered)
				w.Latency = &l
				if p := d.quantile(0.99); !math.IsNaN(p) {
					w.P99 = &p
				}
			}
			out = append(out, w)
		}
	}
	return out
}

// clamp01 keeps a ratio in [0, 1]: counters are read one after another, so
// a delivery counted after its expectation was read can tip a ratio over.
func clamp01(v float64) float64 { return max(0, min(v, 1)) }

// verdictInput is everything judge looks at, gathered by the daemon.
type verdictInput struct {
	now         time.Time
	started     time.Time
	startGrace  time.Duration // how long the population may take to come online
	reach       engine.ReachState
	online      int
	users       int
	ready       bool
	saturation  SaturationStatus
	recent      RecentStatus
	lagging     float64
	lastCanary  *canaryOutcome // nil: no round yet, or the canary is off
	canaryStale time.Duration  // how old a failed round may be and still count
}

// canaryOutcome is what judge needs of the last canary round.
type canaryOutcome struct {
	end    time.Time
	pass   bool
	detail string
}

// judge gives the status page's verdict. A target that cannot be reached is
// down whatever else holds, because that is certain even on a saturated
// prober; a saturated prober comes next, because every other figure may be
// its own; then a population still ramping in; then anything short of the
// objective.
func judge(in verdictInput) Verdict {
	counts := fmt.Sprintf("%d of %d sessions online", in.online, in.users)
	// What falls short of the objective is listed whatever the verdict:
	// a page that says down still says that the prober is saturated, or
	// that a fifth of the messages were lost before the target went.
	short := shortfalls(in)
	var state, cause string
	switch {
	case in.reach.Known && !in.reach.Reachable && in.online == 0:
		state, cause = VerdictDown, fmt.Sprintf("target unreachable for %s: %s; %s",
			ago(in.now.Sub(in.reach.Since)), in.reach.Cause(), counts)
	case in.reach.Known && !in.reach.Reachable:
		// Sessions that were logged in still work, new logins fail: a
		// server at a connection limit, or one whose login path broke.
		state, cause = VerdictDegraded, fmt.Sprintf("new logins failing for %s: %s; %s",
			ago(in.now.Sub(in.reach.Since)), in.reach.Cause(), counts)
	case in.ready && in.users > 0 && in.online == 0:
		// Every session dropped, and the attempts since have not (yet)
		// failed often enough to call the target unreachable.
		why := "logging in again"
		if in.reach.Streak > 0 {
			why = fmt.Sprintf("%d attempts failed since the last success, the last: %s", in.reach.Streak, in.reach.Cause())
		}
		state, cause = VerdictDown, "no session online: "+counts+"; "+why
	case in.saturation.Saturated:
		state, cause = VerdictSaturated, saturatedCause(in)
	case !in.ready && in.now.Sub(in.started) < in.startGrace:
		state, cause = VerdictStarting, "starting: "+counts
		// Sessions still logging in are the ramp, not a shortfall.
		short = slices.DeleteFunc(short, func(c string) bool { return c == counts })
	case len(short) > 0:
		return Verdict{State: VerdictDegraded, Cause: short[0], Causes: short}
	default:
		return verdict(VerdictHealthy, fmt.Sprintf("all %d sessions online; every SLI at or above %s over the last %s",
			in.users, percent(in.recent.Objective), ago(in.recent.Window)))
	}
	causes := []string{cause}
	if state != VerdictSaturated && in.saturation.Saturated {
		causes = append(causes, saturatedCause(in))
	}
	for _, c := range short {
		if c != counts || state == VerdictSaturated {
			causes = append(causes, c)
		}
	}
	return Verdict{State: state, Cause: cause, Causes: causes}
}

func saturatedCause(in verdictInput) string {
	return fmt.Sprintf("imcanary is saturated (%s) since %s: its latency and loss figures may be its own, not the target's",
		strings.Join(in.saturation.Causes, ", "), ago(in.now.Sub(in.saturation.Since))+" ago")
}

// shortfalls lists what falls short of the objective, in words.
func shortfalls(in verdictInput) []string {
	var causes []string
	if in.online < in.users {
		causes = append(causes, fmt.Sprintf("%d of %d sessions online", in.online, in.users))
	}
	objective := in.recent.Objective
	span := "over the last " + ago(in.recent.Window)
	for _, w := range in.recent.SLIs {
		name := w.Source + " " + w.Kind
		if w.Eventual != nil && *w.Eventual < objective {
			// Lost for good: said first, the worse of the two.
			causes = append(causes, fmt.Sprintf("%s eventual completeness %s %s (objective %s): %s lost of %s owed",
				name, percent(*w.Eventual), span, percent(objective), count(w.Lost), count(w.Expected)))
		}
		eventualShort := w.Eventual != nil && *w.Eventual < objective
		// Every loss misses real time too: the real-time figure is said
		// when it tells something the eventual one does not.
		if w.Completeness != nil && *w.Completeness < objective && (!eventualShort || w.Late+w.Recovered > 0) {
			causes = append(causes, fmt.Sprintf("%s real-time completeness %s %s (objective %s): %s lost, %s late, %s recovered by catch-up of %s owed",
				name, percent(*w.Completeness), span, percent(objective), count(w.Lost), count(w.Late), count(w.Recovered), count(w.Expected)))
		}
		if w.Latency != nil && *w.Latency < objective {
			causes = append(causes, fmt.Sprintf("%s latency: %s of deliveries within 1s %s (objective %s)",
				name, percent(*w.Latency), span, percent(objective)))
		}
		if w.Duplicate > 0 {
			causes = append(causes, fmt.Sprintf("%s: %s duplicate deliveries %s", name, count(w.Duplicate), span))
		}
		if w.Reordered > 0 {
			causes = append(causes, fmt.Sprintf("%s: %s deliveries out of order %s", name, count(w.Reordered), span))
		}
	}
	if c := in.lastCanary; c != nil && !c.pass && in.now.Sub(c.end) <= in.canaryStale {
		causes = append(causes, "last canary round failed: "+c.detail)
	}
	if in.lagging > 0 {
		causes = append(causes, fmt.Sprintf("%s sessions lagging: the server acknowledged messages they have not received", count(in.lagging)))
	}
	if f := failureSummary(in.recent.Failures); f != "" {
		causes = append(causes, f+" "+span)
	}
	return causes
}

func verdict(state, cause string) Verdict {
	return Verdict{State: state, Cause: cause, Causes: []string{cause}}
}

// failureSummary says the connect failures of the window, most common
// reason first: "12 connect attempts failed (timeout 10, refused 2)".
func failureSummary(byReason map[string]float64) string {
	total := 0.0
	var reasons []string
	for r, n := range byReason {
		if n > 0 {
			total += n
			reasons = append(reasons, r)
		}
	}
	if total == 0 {
		return ""
	}
	slices.SortFunc(reasons, func(a, b string) int {
		if byReason[a] != byReason[b] {
			if byReason[a] > byReason[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = r + " " + count(byReason[r])
	}
	noun := "attempts"
	if total == 1 {
		noun = "attempt"
	}
	return fmt.Sprintf("%s connect %s failed (%s)", count(total), noun, strings.Join(parts, ", "))
}

// percent prints a ratio as the page's percentages do: three decimals,
// rounded down so that 99.9996% never reads as 100%.
func percent(v float64) string {
	return pageRatio(&v)
}

// count prints a whole count as the reports do: grouped from 1,000 up.
func count(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return report.FormatCount(int64(math.Round(v)))
}

// ago prints a span to the second ("12s", "3m5s", "2h0m"), or to the
// millisecond under a second.
func ago(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
