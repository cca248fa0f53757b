package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Search is the report of a search for the server's limit: a soak run per
// step of one varied value, each judged by the profile's thresholds.
type Search struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"` // "search"
	Target  string `json:"target"`
	Profile string `json:"profile"`
	// Vary is what the search varied: "rate" (messages per second per
	// user), "users" or "group_size".
	Vary      string  `json:"vary"`
	Start     float64 `json:"start"`
	Max       float64 `json:"max"`
	Factor    float64 `json:"factor"`
	Precision float64 `json:"precision"`
	// Result is how the search ended: SearchFound, SearchNoLimit,
	// SearchBelowStart, SearchInconclusive or SearchAborted.
	Result string `json:"result"`
	// Knee is the largest value that passed, 0 for none; FirstFail the
	// smallest that failed, 0 for none.
	Knee      float64 `json:"knee"`
	FirstFail float64 `json:"first_fail"`
	// Broke are the thresholds that failed at FirstFail: the first to
	// break as the load rose.
	Broke     []Threshold  `json:"broke,omitempty"`
	Steps     []SearchStep `json:"steps"`
	StartTime time.Time    `json:"start_time"`
	EndTime   time.Time    `json:"end_time"`
	// Settings is the profile each step ran, before the step set the
	// varied value (Vary) to its own, thresholds included; CatchUp is
	// as in a soak report.
	Settings Profile `json:"settings"`
	CatchUp  string  `json:"catch_up,omitempty"`
	// Comparisons set the search beside the previous search of its
	// profile against the same target and beside its pinned baseline,
	// one each, a missing one saying why.
	Comparisons []SearchComparison `json:"comparisons,omitempty"`
	Notes       []string           `json:"notes,omitempty"`
}

// SearchComparison is a search beside an earlier one of the same profile:
// the knee and first failing value of both as deltas, and the earlier
// search's steps, for the charts that draw both.
type SearchComparison struct {
	Comparison
	Steps []SearchStep `json:"steps,omitempty"`
}

// CompareSearch returns s beside was, an earlier search of the same
// profile. A lower knee is worse: the server takes less load than it did.
func CompareSearch(against string, s, was *Search) SearchComparison {
	c := SearchComparison{Comparison: Comparison{Against: against, ID: was.ID, Start: was.StartTime, Result: was.Result}}
	c.SettingsChanged = searchSettingsChanged(was, s)
	if was.Knee > 0 || s.Knee > 0 {
		c.Deltas = append(c.Deltas, newDelta("knee", unitValue, was.Knee, s.Knee, s.Knee < was.Knee))
	}
	if was.FirstFail > 0 && s.FirstFail > 0 {
		c.Deltas = append(c.Deltas, newDelta("first failing", unitValue, was.FirstFail, s.FirstFail, s.FirstFail < was.FirstFail))
	}
	c.Steps = was.Steps
	return c
}

// MissingSearchComparison is the comparison with a search that is not
// there, with why in words.
func MissingSearchComparison(against, why string) SearchComparison {
	return SearchComparison{Comparison: MissingComparison(against, why)}
}

// searchSettingsChanged lists what differs between two searches' set-ups:
// the profile's settings but the varied one, and the search's own.
func searchSettingsChanged(a, b *Search) []string {
	settings := func(s *Search) map[string]string {
		p := s.Settings
		p.Name = ""
		out := map[string]string{"catch_up": s.CatchUp, "target": s.Target,
			"search.vary": s.Vary, "search.start": searchValue(s.Start), "search.max": searchValue(s.Max),
			"search.factor": searchValue(s.Factor), "search.precision": searchValue(s.Precision)}
		flatten(out, "", p)
		delete(out, "name")
		delete(out, s.Vary)
		return out
	}
	return changedKeys(settings(a), settings(b))
}

// Results of a search.
const (
	SearchFound        = "found"
	SearchNoLimit      = "no_limit"
	SearchBelowStart   = "below_start"
	SearchInconclusive = "inconclusive"
	SearchAborted      = "aborted"
)

// SearchStep is one step's run, as its soak report measured it.
type SearchStep struct {
	Value float64 `json:"value"`
	// Result is the step's soak verdict: pass, fail or inconclusive.
	Result string `json:"result"`
	RunID  string `json:"run_id"`
	// What the step's run measured: messages sent and deliveries made
	// per second while it sent (not counting the drain), the p99 of the
	// delivery and ack latency, and the loss ratio.
	SentPerSec      float64       `json:"sent_per_second"`
	DeliveredPerSec float64       `json:"delivered_per_second"`
	P99Delivery     time.Duration `json:"p99_delivery_ns"`
	P99Ack          time.Duration `json:"p99_ack_ns"`
	LossRatio       float64       `json:"loss_ratio"`
	// Recovered counts the deliveries that reached their device by
	// catch-up rather than by a push, and Realtime is the share pushed
	// within the deadline (real-time completeness): a server that falls
	// behind pushes late, the prober fetches what it misses, and the p99
	// of the pushes alone no longer says how late the rest was.
	Recovered int64   `json:"recovered"`
	Realtime  float64 `json:"realtime_completeness"`
	// Failed are the thresholds the step failed.
	Failed []Threshold `json:"failed,omitempty"`
	// Saturation says why the prober was saturated, for an inconclusive
	// step.
	Saturation []string `json:"saturation,omitempty"`
}

// StepOf makes a search step of a step's soak report.
func StepOf(value float64, r *Soak) SearchStep {
	all := r.Deliveries["all"]
	st := SearchStep{Value: value, Result: r.Result, RunID: r.ID, SentPerSec: r.Messages.SentPerSec,
		P99Ack: r.Latency["ack"].P99, LossRatio: all.LossRatio, Recovered: all.Recovered, Realtime: all.Realtime()}
	// Deliveries per second while the step sent, from its samples: the
	// deliveries of the drain, a queue emptying after the senders
	// stopped, are not the rate the server kept up with.
	var sum, span float64
	for i := 1; i < len(r.Samples); i++ {
		if smp := r.Samples[i]; smp.Phase == PhaseSend {
			dt := smp.T.Sub(r.Samples[i-1].T).Seconds()
			sum, span = sum+smp.DelivPerSec*dt, span+dt
		}
	}
	if span > 0 {
		st.DeliveredPerSec = sum / span
	}
	st.P99Delivery = max(r.Latency["delivery_direct"].P99, r.Latency["delivery_group"].P99)
	for _, t := range r.Thresholds {
		if !t.Pass {
			st.Failed = append(st.Failed, t)
		}
	}
	if r.Saturation != nil {
		st.Saturation = r.Saturation.Causes()
	}
	return st
}

// WriteSearchJSON writes s as indented JSON.
func WriteSearchJSON(w io.Writer, s *Search) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// Verdict is the search's outcome in a line.
func (s *Search) Verdict() string {
	unit := searchUnit(s.Vary)
	switch s.Result {
	case SearchFound:
		line := fmt.Sprintf("knee: %s %s passed, %s failed", searchValue(s.Knee), unit, searchValue(s.FirstFail))
		if len(s.Broke) > 0 {
			var broke []string
			for _, t := range s.Broke {
				broke = append(broke, fmt.Sprintf("%s %s against %s", t.Name, renderThresholdValue(t.Actual), renderThresholdValue(t.Limit)))
			}
			line += "; first to break: " + strings.Join(broke, ", ")
		}
		return line
	case SearchNoLimit:
		return fmt.Sprintf("no limit within reach: %s %s, the most the search tries, passed", searchValue(s.Max), unit)
	case SearchBelowStart:
		return fmt.Sprintf("every value tried failed, down to %s %s", searchValue(s.FirstFail), unit)
	case SearchInconclusive:
		line := "inconclusive: the prober is the limit"
		if n := len(s.Steps); n > 0 {
			last := s.Steps[n-1]
			line += fmt.Sprintf(": imcanary saturated at %s %s", searchValue(last.Value), unit)
			if len(last.Saturation) > 0 {
				line += " (" + strings.Join(last.Saturation, ", ") + ")"
			}
			if s.Knee > 0 {
				line += fmt.Sprintf("; the server passed up to %s", searchValue(s.Knee))
			}
		}
		return line
	}
	return "aborted before the search ended"
}

// WriteSearchText writes s as a human reads it: the verdict, then each
// step's figures.
func WriteSearchText(w io.Writer, s *Search) error {
	fmt.Fprintf(w, "imcanary search %s: profile %s, target %s, varying %s (%s) from %s up by %v, to within %s\n",
		s.ID, s.Profile, s.Target, s.Vary, searchUnit(s.Vary), searchValue(s.Start), s.Factor, renderPercent(s.Precision))
	fmt.Fprintf(w, "%s\n\n", s.Verdict())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\t"+s.Vary+"\tresult\tsent/s\tdelivered/s\tp99 delivery\tp99 ack\treal-time\tlost\tfailed\t")
	for i, st := range s.Steps {
		var failed []string
		for _, t := range st.Failed {
			failed = append(failed, t.Name)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i+1, searchValue(st.Value), renderVerdict(st.Result),
			strconv.FormatFloat(st.SentPerSec, 'f', 0, 64), strconv.FormatFloat(st.DeliveredPerSec, 'f', 0, 64),
			renderLatency(st.P99Delivery), renderLatency(st.P99Ack), renderPercent(st.Realtime), renderPercent(st.LossRatio),
			renderOr(strings.Join(failed, ","), "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range s.Comparisons {
		fmt.Fprintf(w, "\n%s\n", searchComparisonTitle(c))
		if ch := searchComparisonSettings(c); ch != "" {
			fmt.Fprintf(w, "  %s\n", ch)
		}
		if len(c.Deltas) > 0 {
			// Through a buffer, so that no line keeps the padding of the
			// judgement column, empty in the header.
			var b strings.Builder
			tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
			for _, row := range append([][]string{renderDeltaHeader}, searchDeltaRows(c)...) {
				fmt.Fprintf(tw, "  %s\t\n", strings.Join(row, "\t"))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for line := range strings.Lines(b.String()) {
				fmt.Fprintf(w, "%s\n", strings.TrimRight(line, " \n"))
			}
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
	return nil
}

func searchUnit(vary string) string {
	switch vary {
	case "users":
		return "users"
	case "group_size":
		return "members per group"
	}
	return "messages per second per user"
}

func searchValue(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// searchComparisonTitle is the heading line of a comparison: which
// search, or why none.
func searchComparisonTitle(c SearchComparison) string {
	if c.Missing != "" {
		return fmt.Sprintf("compared with the %s search: none: %s", c.Against, c.Missing)
	}
	return fmt.Sprintf("compared with the %s search %s (%s, started %s)", c.Against, c.ID, searchResultWord(c.Result), renderTime(c.Start))
}

// searchDeltaRows are c's deltas as table rows.
func searchDeltaRows(c SearchComparison) [][]string {
	var rows [][]string
	for _, d := range c.Deltas {
		rows = append(rows, renderDeltaRow(d))
	}
	return rows
}

// searchResultWord is a search's result as the reader sees it first.
func searchResultWord(result string) string {
	switch result {
	case SearchFound:
		return "FOUND"
	case SearchNoLimit:
		return "NO LIMIT"
	case SearchBelowStart:
		return "BELOW START"
	}
	return renderVerdict(result)
}

// searchComparisonSettings says which settings changed, or "" when none
// did.
func searchComparisonSettings(c SearchComparison) string {
	if len(c.SettingsChanged) == 0 {
		return ""
	}
	return "settings changed since that search, so the two knees are of different experiments: " + strings.Join(c.SettingsChanged, ", ")
}

// ReadSearchJSON reads a search report written by WriteSearchJSON.
func ReadSearchJSON(rd io.Reader) (*Search, error) {
	dec := json.NewDecoder(rd)
	var s Search
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("report: read search json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("report: read search json: trailing data after the report")
	}
	if s.Kind != "search" {
		return nil, fmt.Errorf("report: read search json: kind %q, want \"search\"", s.Kind)
	}
	return &s, nil
}

// SearchSummary is a search as the history lists it.
type SearchSummary struct {
	ID        string    `json:"id"`
	Target    string    `json:"target"`
	Profile   string    `json:"profile"`
	Vary      string    `json:"vary"`
	Result    string    `json:"result"`
	Knee      float64   `json:"knee"`
	FirstFail float64   `json:"first_fail"`
	StartTime time.Time `json:"start_time"`
	EndTime   time.Time `json:"end_time"`
}

// Summary is s as the history lists it.
func (s *Search) Summary() SearchSummary {
	return SearchSummary{ID: s.ID, Target: s.Target, Profile: s.Profile, Vary: s.Vary, Result: s.Result,
		Knee: s.Knee, FirstFail: s.FirstFail, StartTime: s.StartTime, EndTime: s.EndTime}
}
