package report

// This file holds the JSON form of a report and the number formatting that
// the text and HTML renderers share, so that a terminal and a browser show
// the same figures for the same run.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// WriteJSON writes r as indented JSON. Field names are the struct tags and
// durations are integer nanoseconds (the _ns fields), the stable interface
// that pipelines read.
func WriteJSON(w io.Writer, r *Soak) error {
	if r == nil {
		return errors.New("report: write json: nil report")
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Error messages and targets keep their < > & as written: the file is
	// read by programs and people, not embedded in a page.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("report: write json: %w", err)
	}
	return nil
}

// ReadJSON reads a report that WriteJSON wrote. Unknown fields are ignored,
// so an older reader accepts a newer report; trailing data is an error.
func ReadJSON(rd io.Reader) (*Soak, error) {
	dec := json.NewDecoder(rd)
	var r Soak
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("report: read json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("report: read json: trailing data after the report")
	}
	return &r, nil
}

// The formatting that every report shares, for the text a soak run writes
// into its own report (its notes, a drill's reaction) and for other pages,
// so that a figure reads the same wherever it appears. FormatCount is
// beside the text renderer.

// FormatLatency prints a latency with two or three significant digits:
// 850µs, 1.2ms, 350ms, 2.1s, 1m35s.
func FormatLatency(d time.Duration) string { return renderLatency(d) }

// FormatSpan prints a configured or elapsed span to the second: 5m,
// 1h30m, 1m30s.
func FormatSpan(d time.Duration) string { return renderSpan(d) }

// FormatPercent prints a ratio as a percentage, with enough decimals that
// a few in a million do not show as 0%.
func FormatPercent(ratio float64) string { return renderPercent(ratio) }

// FormatTime prints an instant in UTC to the second, "-" for the zero
// time.
func FormatTime(t time.Time) string { return renderTime(t) }

// FormatCounts prints a count map as "a 1, b 2" sorted by key, or "none".
func FormatCounts(m map[string]int64) string { return renderCounts(m) }

// renderVerdict is the word a person reads first: PASS, FAIL,
// INCONCLUSIVE or ABORTED. Anything but "pass" is a failure to the reader,
// so an unknown result is shown upper-cased rather than hidden.
func renderVerdict(result string) string {
	switch result {
	case metrics.ResultPass:
		return "PASS"
	case metrics.ResultFail:
		return "FAIL"
	case metrics.ResultInconclusive:
		return "INCONCLUSIVE"
	case metrics.ResultAborted:
		return "ABORTED"
	case "":
		return "UNKNOWN"
	}
	return strings.ToUpper(result)
}

// renderRunLength is how long the run took, or "" when End is unset (a
// run that was killed before it could write its end).
func renderRunLength(r *Soak) string {
	if r.Start.IsZero() || r.End.IsZero() || r.End.Before(r.Start) {
		return ""
	}
	return renderSpan(r.End.Sub(r.Start))
}

// renderTime prints an instant in UTC to the second: reports from several
// hosts are compared side by side, so one zone for all of them.
func renderTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// renderSpan prints a configured or elapsed span to the second, without
// the zero tails that time.Duration.String adds ("5m", not "5m0s").
func renderSpan(d time.Duration) string {
	if d < 0 {
		return "-" + renderSpan(-d)
	}
	if d < time.Second {
		return renderLatency(d)
	}
	rd := d.Round(time.Second)
	if rd%time.Second != 0 { // Round saturates near MaxInt64
		rd = d.Truncate(time.Second)
	}
	s := rd.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// renderLatency prints a latency with two or three significant digits in
// the largest unit that keeps it at or above one: 850µs, 1.2ms, 350ms,
// 2.1s, 1m35s. Percentiles are estimates, so more digits would be noise.
func renderLatency(d time.Duration) string {
	if d < 0 {
		if d == math.MinInt64 {
			d++ // -MinInt64 overflows; a nanosecond is far below what is shown
		}
		return "-" + renderLatency(-d)
	}
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		if s, ok := renderScaled(d, time.Microsecond, "µs"); ok {
			return s
		}
		return "1ms"
	case d < time.Second:
		if s, ok := renderScaled(d, time.Millisecond, "ms"); ok {
			return s
		}
		return "1s"
	case d < time.Minute-time.Second/2:
		v := float64(d) / float64(time.Second)
		if v < 9.95 {
			return trimZeroDecimal(strconv.FormatFloat(v, 'f', 1, 64)) + "s"
		}
		return strconv.FormatFloat(v, 'f', 0, 64) + "s"
	}
	return renderSpan(d)
}

// renderScaled prints d in unit with one decimal below ten and none from
// ten on; ok is false when rounding reaches 1000 units, where the caller
// switches to the next unit.
func renderScaled(d, unit time.Duration, name string) (string, bool) {
	v := float64(d) / float64(unit)
	switch {
	case v < 9.95:
		return trimZeroDecimal(strconv.FormatFloat(v, 'f', 1, 64)) + name, true
	case v < 999.5:
		return strconv.FormatFloat(v, 'f', 0, 64) + name, true
	}
	return "", false
}

func trimZeroDecimal(s string) string {
	return strings.TrimSuffix(s, ".0")
}

// renderPercent prints a ratio as a percentage with enough decimals that a
// loss of a few messages in a million is not shown as 0%.
func renderPercent(ratio float64) string {
	if math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		return "-"
	}
	p := ratio * 100
	switch a := math.Abs(p); {
	case a == 0:
		return "0%"
	case a >= 10:
		return strconv.FormatFloat(p, 'f', 1, 64) + "%"
	case a >= 0.1:
		return strconv.FormatFloat(p, 'f', 2, 64) + "%"
	case a >= 0.001:
		return strconv.FormatFloat(p, 'f', 3, 64) + "%"
	}
	return "<0.001%"
}

// renderRate prints a per-second rate with one decimal, its whole part
// grouped like a count (1,225.0), so that a rate and the counts beside it
// read alike.
func renderRate(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	whole, frac, _ := strings.Cut(s, ".")
	sign := ""
	if strings.HasPrefix(whole, "-") {
		sign, whole = "-", whole[1:]
	}
	if n, err := strconv.ParseInt(whole, 10, 64); err == nil {
		whole = renderCount(n)
	}
	return sign + whole + "." + frac
}

// renderSending returns how long r's send phase ran: Messages.SendSeconds,
// or, for a report written before that field, the send phase's start to
// the next phase's start (or the end of the run). ok is false when r has
// no send phase to measure.
func renderSending(r *Soak) (time.Duration, bool) {
	if s := r.Messages.SendSeconds; s > 0 && !math.IsInf(s, 0) {
		return time.Duration(s * float64(time.Second)), true
	}
	for i, p := range r.Phases {
		if p.Name != PhaseSend || p.Start.IsZero() {
			continue
		}
		end := r.End
		if i+1 < len(r.Phases) {
			end = r.Phases[i+1].Start
		}
		if end.IsZero() || !end.After(p.Start) {
			return 0, false
		}
		return end.Sub(p.Start), true
	}
	return 0, false
}

// renderSendRate prints the messages sent per second and the span it is
// over, "250.7/s over 5m": an aborted run's rate is over the time it
// sent, and the reader sees which. A report written before SendSeconds
// existed stored a rate over the profile's duration, so the rate is
// computed again from its phases.
func renderSendRate(r *Soak) string {
	m := r.Messages
	d, ok := renderSending(r)
	if !ok {
		return renderRate(m.SentPerSec) + "/s"
	}
	rate := m.SentPerSec
	if m.SendSeconds <= 0 {
		rate = float64(m.Sent) / d.Seconds()
	}
	return renderRate(rate) + "/s over " + renderSpan(d)
}

// renderThresholdValue prints a threshold's limit or actual value as the
// report shows it. The runner writes counts as bare integers ("375253"),
// which pipelines read; a person reads them grouped like every other
// count (375,253). Anything else ("0.1%", "500ms", "≥ 1") is shown as
// written.
func renderThresholdValue(s string) string {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return renderCount(n)
	}
	return s
}

// renderKeyOrder returns the keys of a map with the known ones first, in
// the order given, and any others after them sorted, so that tables read
// the same from run to run.
func renderKeyOrder[V any](m map[string]V, known ...string) []string {
	keys := make([]string, 0, len(m))
	for _, k := range known {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	var rest []string
	for k := range m {
		isKnown := false
		for _, kk := range known {
			if k == kk {
				isKnown = true
				break
			}
		}
		if !isKnown {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(keys, rest...)
}

// renderDeliveryKinds and renderLatencyKinds are the rows that reports
// carry, in reading order.
var (
	renderDeliveryKinds = []string{"direct", "group", "all"}
	renderLatencyKinds  = []string{"login", "ack", "delivery_direct", "delivery_group", "delivery_on_time", "delivery_late_login"}
)

// renderCounts prints a count map as "a 1, b 2" sorted by key, or "none".
func renderCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range renderKeyOrder(m) {
		parts = append(parts, k+" "+renderCount(m[k]))
	}
	return strings.Join(parts, ", ")
}

// renderTotal adds up a count map.
func renderTotal(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// renderPhases prints the phases with their lengths, "ramp 1m, send 5m,
// drain 1m30s", measured from each start to the next and from the last one
// to the end of the run.
func renderPhases(r *Soak) string {
	parts := make([]string, 0, len(r.Phases))
	for i, p := range r.Phases {
		end := r.End
		if i+1 < len(r.Phases) {
			end = r.Phases[i+1].Start
		}
		if end.IsZero() || p.Start.IsZero() || end.Before(p.Start) {
			parts = append(parts, p.Name)
			continue
		}
		parts = append(parts, p.Name+" "+renderSpan(end.Sub(p.Start)))
	}
	return strings.Join(parts, ", ")
}

// renderFailedThresholds lists the names of the thresholds that failed.
func renderFailedThresholds(r *Soak) []string {
	var names []string
	for _, t := range r.Thresholds {
		if !t.Pass {
			names = append(names, t.Name)
		}
	}
	return names
}

// renderTruncate shortens s to at most n runes, marking the cut, so that
// one long error message does not push a table off the screen.
func renderTruncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// renderIf returns s when cond holds, else "": an optional tail of a line.
func renderIf(cond bool, s string) string {
	if cond {
		return s
	}
	return ""
}

// renderPercentiles prints percentiles on one line, "p50 1.5s, p95 2.4s,
// p99 2.4s, max 2.5s (186)", or "none" when nothing was measured.
func renderPercentiles(p Percentiles) string {
	if p.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %s, p95 %s, p99 %s, max %s (%s)", renderLatency(p.P50), renderLatency(p.P95),
		renderLatency(p.P99), renderLatency(p.Max), renderCount(p.Count))
}

// renderDrillRows are the lines of the slow-reader drill, the same in the
// text and HTML reports; the reaction is shown apart, first.
func renderDrillRows(r *Soak) []renderKV {
	d := r.Drill
	users := r.Users.Configured
	if users == 0 {
		users = r.Profile.Users
	}
	dl := d.Deliveries
	return []renderKV{
		{"slow readers", fmt.Sprintf("%s of %s users (%s), who never send", renderCount(int64(d.SlowReaders)),
			renderCount(int64(users)), renderPercent(d.Fraction))},
		{"reading", d.Reading()},
		{"deliveries", fmt.Sprintf("%s expected, %s delivered, %s%s lost, %s undelivered (%s loss), %s late",
			renderCount(dl.Expected), renderCount(dl.Delivered), renderIf(r.CatchUp != "", renderCount(dl.Recovered)+" recovered, "),
			renderCount(dl.Lost), renderCount(dl.Undelivered), renderPercent(dl.LossRatio), renderCount(dl.Late))},
		{"latency", renderPercentiles(d.Latency)},
		{"normal users' p99", renderLatency(d.NormalP99)},
		{"disconnects", renderCountsTotal(d.Disconnects)},
		{"close codes", renderCounts(d.CloseCodes)},
		{"time to disconnect", renderPercentiles(d.TimeToDisconnect)},
		{"max lag", renderCount(d.MaxLagMessages) + " messages"},
	}
}

// Reading says how the slow readers of d read: "a pause of 30s at the
// first delivery of each session and then every 2m of reading; 50ms after
// every delivery".
func (d *Drill) Reading() string {
	var how []string
	if d.Pause > 0 {
		p := "a pause of " + renderLatency(d.Pause) + " at the first delivery of each session"
		if d.PauseEvery > 0 {
			p += " and then every " + renderLatency(d.PauseEvery) + " of reading"
		}
		how = append(how, p)
	}
	if d.ReadDelay > 0 {
		how = append(how, renderLatency(d.ReadDelay)+" after every delivery")
	}
	if len(how) == 0 {
		return "no delay at all: the drill has neither a pause nor a read delay"
	}
	return strings.Join(how, "; ")
}

// renderSaturationSummary is the saturation section's first line.
func renderSaturationSummary(s *Saturation) string {
	causes := "none named"
	if c := s.Causes(); len(c) > 0 {
		causes = strings.Join(c, ", ")
	}
	return fmt.Sprintf("%s of the send and drain phases; %s delivery latency samples recorded while saturated; causes %s",
		renderPercent(s.SendDrainRatio), renderCount(s.DeliverySamples), causes)
}

// renderSaturationPeriods lists the saturated periods as rows: from and to
// (offsets into the run, or times when the run has no start), the phases
// they overlap and their causes.
func renderSaturationPeriods(r *Soak) [][]string {
	at := func(t time.Time) string {
		if r.Start.IsZero() || t.IsZero() {
			return renderTime(t)
		}
		return renderLatency(t.Sub(r.Start))
	}
	rows := make([][]string, 0, len(r.Saturation.Periods))
	for _, p := range r.Saturation.Periods {
		rows = append(rows, []string{at(p.Start), at(p.End),
			renderOr(strings.Join(r.PhasesDuring(p.Start, p.End), ", "), "-"),
			renderOr(strings.Join(p.Causes, ", "), "-")})
	}
	return rows
}

// renderDeliveryHeader and renderDeliveryRow are the deliveries table of
// the text and HTML reports: the counts, then the two completeness
// figures side by side, real-time (pushed within the deadline) and
// eventual (pushed or recovered by catch-up at all), and the loss ratio.
// A report of a release before catch-up (no CatchUp) has neither, and
// keeps the table it was written with.
//
// first names the first column: "deliveries" in the text report, "kind"
// in the HTML one.
func renderDeliveryHeader(r *Soak, first string) []string {
	if r.CatchUp == "" {
		return []string{first, "expected", "delivered", "lost", "undelivered", "late", "duplicate", "reordered", "loss"}
	}
	return []string{first, "expected", "delivered", "recovered", "lost", "undelivered", "late",
		"duplicate", "reordered", "real-time", "eventual", "loss"}
}

func renderDeliveryRow(r *Soak, kind string, d Deliveries) []string {
	if r.CatchUp == "" {
		return []string{kind, renderCount(d.Expected), renderCount(d.Delivered), renderCount(d.Lost),
			renderCount(d.Undelivered), renderCount(d.Late), renderCount(d.Duplicate), renderCount(d.Reordered),
			renderPercent(d.LossRatio)}
	}
	return []string{kind, renderCount(d.Expected), renderCount(d.Delivered), renderCount(d.Recovered), renderCount(d.Lost),
		renderCount(d.Undelivered), renderCount(d.Late), renderCount(d.Duplicate), renderCount(d.Reordered),
		renderPercent(d.Realtime()), renderPercent(d.Eventual()), renderPercent(d.LossRatio)}
}

// latencyMeans says some latency has a mean: reports stored before
// reports had means have none, and show the table they showed then.
func latencyMeans(l map[string]Percentiles) bool {
	for _, p := range l {
		if p.Mean > 0 {
			return true
		}
	}
	return false
}

// renderShards names the shard runs a merged report was made of, "" for
// any other report.
func renderShards(r *Soak) string {
	if len(r.Shards) == 0 {
		return ""
	}
	runs := make([]string, len(r.Shards))
	for i, sh := range r.Shards {
		runs[i] = fmt.Sprintf("%s %s %s", sh.Shard, sh.ID, strings.ToUpper(sh.Result))
	}
	return fmt.Sprintf("merged from %d shards: %s", len(r.Shards), strings.Join(runs, ", "))
}
