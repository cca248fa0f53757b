package report

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// renderTextErrors is how many of the top errors the text summary shows;
// the rest are in the JSON and HTML reports. It keeps the summary within a
// terminal screen.
const renderTextErrors = 5

// renderTextPeriods is how many saturated periods the text summary lists.
const renderTextPeriods = 5

// WriteText writes a summary of r for a person at a terminal, about forty
// lines: the verdict line first, then the counts, the delivery, latency and
// threshold tables, the slow-reader drill and the prober's saturation if
// the run had them, the top errors, what changed since the compared runs
// and the notes. The output depends only
// on r (map keys are sorted), so it can be compared as a golden file.
func WriteText(w io.Writer, r *Soak) error {
	if r == nil {
		return errors.New("report: write text: nil report")
	}
	bw := bufio.NewWriter(w)
	tw := &renderTextWriter{w: bw}
	for _, section := range []func(*Soak){
		tw.soakHead, tw.soakCounts, tw.soakDeliveries, tw.soakLatency, tw.soakExtras,
		tw.soakSaturation, tw.soakErrors, tw.soakComparisons, tw.soakNotes,
	} {
		section(r)
	}
	if tw.err != nil {
		return fmt.Errorf("report: write text: %w", tw.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("report: write text: %w", err)
	}
	return nil
}

// soakHead writes the verdict line, the phases and the failed thresholds.
func (tw *renderTextWriter) soakHead(r *Soak) {
	length := renderRunLength(r)
	if length == "" {
		length = "unknown"
	}
	tw.printf("%s  soak %s  target %s  start %s  duration %s\n",
		renderVerdict(r.Result), renderOr(r.Profile.Name, "-"), renderOr(r.Target, "-"),
		renderTime(r.Start), length)
	var meta []string
	if p := renderPhases(r); p != "" {
		meta = append(meta, "phases "+p)
	}
	if r.ID != "" {
		meta = append(meta, "id "+r.ID)
	}
	if r.Shard != "" {
		meta = append(meta, "shard "+r.Shard)
	}
	if len(meta) > 0 {
		tw.printf("%s\n", strings.Join(meta, "; "))
	}
	if m := renderShards(r); m != "" {
		tw.printf("%s\n", m)
	}
	if failed := renderFailedThresholds(r); len(failed) > 0 {
		tw.printf("failed thresholds: %s\n", strings.Join(failed, ", "))
	}
	tw.printf("\n")

}

// soakCounts writes the users, messages, rejections and disconnects.
func (tw *renderTextWriter) soakCounts(r *Soak) {
	u, m := r.Users, r.Messages
	tw.table(renderLeft, [][]string{
		{"users", fmt.Sprintf("%s configured, %s logged in, %s failed logins, min online %s, %s groups",
			renderCount(int64(u.Configured)), renderCount(int64(u.LoggedIn)), renderCount(u.FailedLogins),
			renderPercent(u.MinOnlineRatio), renderCount(int64(u.Groups)))},
		{"messages", fmt.Sprintf("%s sent (%s), %s acked, %s unacked, %s offline, %s write errors",
			renderCount(m.Sent), renderSendRate(r), renderCount(m.Acked), renderCount(m.Unacked),
			renderCount(m.Offline), renderCount(m.WriteErrors))},
		{"rejected", renderCountsTotal(m.Rejected)},
		{"disconnects", renderCountsTotal(r.Disconnects) + renderIf(r.Drill != nil, ", slow readers apart")},
	})
	tw.printf("\n")

}

// soakDeliveries writes the deliveries by kind.
func (tw *renderTextWriter) soakDeliveries(r *Soak) {
	rows := [][]string{renderDeliveryHeader(r, "deliveries")}
	for _, k := range renderKeyOrder(r.Deliveries, renderDeliveryKinds...) {
		rows = append(rows, renderDeliveryRow(r, k, r.Deliveries[k]))
	}
	if len(rows) == 1 {
		tw.printf("deliveries  none\n")
	} else {
		tw.table(renderNumbers, rows)
	}
	tw.printf("\n")

}

// soakLatency writes the latency percentiles by kind.
func (tw *renderTextWriter) soakLatency(r *Soak) {
	rows := [][]string{{"latency", "count", "p50", "p95", "p99", "max", "mean"}}
	mean := latencyMeans(r.Latency)
	for _, k := range renderKeyOrder(r.Latency, renderLatencyKinds...) {
		p := r.Latency[k]
		row := []string{k, "0", "-", "-", "-", "-", "-"}
		if p.Count > 0 {
			row = []string{k, renderCount(p.Count), renderLatency(p.P50), renderLatency(p.P95),
				renderLatency(p.P99), renderLatency(p.Max), renderLatency(p.Mean)}
		}
		rows = append(rows, row)
	}
	if !mean {
		for i := range rows {
			rows[i] = rows[i][:len(rows[i])-1]
		}
	}
	if len(rows) == 1 {
		tw.printf("latency  none\n")
	} else {
		tw.table(renderNumbers, rows)
	}

}

// soakExtras writes what only some runs have: the connect path, the
// thresholds, a slow-reader drill and a reconnect storm.
func (tw *renderTextWriter) soakExtras(r *Soak) {
	var rows [][]string
	if c := r.ConnectPath; c != nil {
		tw.printf("\n")
		tw.table(renderNumbers, renderConnectTable(c))
		tw.printf("%s\n", connectPathNote)
	}

	if len(r.Thresholds) > 0 {
		tw.printf("\n")
		rows = [][]string{{"threshold", "limit", "actual", "result"}}
		for _, t := range r.Thresholds {
			res := "PASS"
			if !t.Pass {
				res = "FAIL"
			}
			rows = append(rows, []string{t.Name, renderThresholdValue(t.Limit), renderThresholdValue(t.Actual), res})
		}
		tw.table(renderNumbers, rows)
		for _, t := range r.Thresholds {
			if !t.Pass && t.Cause != "" {
				tw.printf("%s failed: %s\n", t.Name, t.Cause)
			}
		}
	}

	if d := r.Drill; d != nil {
		tw.printf("\n")
		rows = [][]string{{"slow-reader drill", renderOr(d.Reaction, "-")}}
		for _, kv := range renderDrillRows(r) {
			rows = append(rows, []string{"  " + kv.Key, kv.Value})
		}
		tw.table(renderLeft, rows)
	}

	if s := r.Storm; s != nil {
		tw.printf("\n")
		rows = [][]string{{"reconnect storm", renderStormHeadline(s)}}
		for _, kv := range renderStormRows(r) {
			rows = append(rows, []string{"  " + kv.Key, kv.Value})
		}
		tw.table(renderLeft, rows)
	}

}

// soakSaturation writes when imcanary was saturated, if it was.
func (tw *renderTextWriter) soakSaturation(r *Soak) {
	if s := r.Saturation; s != nil {
		tw.printf("\nimcanary saturated  %s\n", renderSaturationSummary(s))
		var rows [][]string
		for i, p := range renderSaturationPeriods(r) {
			if i == renderTextPeriods {
				break
			}
			rows = append(rows, []string{"  " + p[0] + " – " + p[1], p[2], p[3]})
		}
		tw.table(renderLeft, rows)
		if n := len(s.Periods) - renderTextPeriods; n > 0 {
			tw.printf("  (%s more in the full report)\n", renderCount(int64(n)))
		}
	}

}

// soakErrors writes the most frequent errors.
func (tw *renderTextWriter) soakErrors(r *Soak) {
	if len(r.Errors) > 0 {
		tw.printf("\ntop errors\n")
		var rows [][]string
		for i, e := range r.Errors {
			if i == renderTextErrors {
				break
			}
			rows = append(rows, []string{renderCount(e.Count), "  " + renderTruncate(e.Error, 100)})
		}
		tw.table(renderCounted, rows)
		if n := len(r.Errors) - renderTextErrors; n > 0 {
			tw.printf("  (%s more in the full report)\n", renderCount(int64(n)))
		}
	}

}

// soakComparisons writes what changed against each compared run.
func (tw *renderTextWriter) soakComparisons(r *Soak) {
	for _, c := range r.Comparisons {
		tw.printf("\n%s\n", renderComparisonTitle(c))
		if s := renderComparisonSettings(c); s != "" {
			tw.printf("  %s\n", s)
		}
		// Only what changed, to keep the summary on a screen; the JSON
		// and HTML reports list every measure.
		rows := [][]string{renderDeltaHeader}
		same := 0
		for _, d := range c.Deltas {
			if d.Change == 0 {
				same++
				continue
			}
			rows = append(rows, renderDeltaRow(d))
		}
		if len(rows) > 1 {
			// The judgement column is empty in the header: the table
			// goes through a buffer so that no line keeps its padding.
			var buf bytes.Buffer
			t := &renderTextWriter{w: &buf}
			t.table(renderNumbers, rows)
			tw.err = errors.Join(tw.err, t.err)
			for line := range strings.Lines(buf.String()) {
				tw.printf("%s\n", strings.TrimRight(line, " \n"))
			}
		}
		switch {
		case c.Missing != "":
		case same == len(c.Deltas):
			tw.printf("  no measure changed\n")
		case same > 0:
			tw.printf("  (%s measures unchanged, listed in the full report)\n", renderCount(int64(same)))
		}
	}

}

// soakNotes writes the notes.
func (tw *renderTextWriter) soakNotes(r *Soak) {
	if len(r.Notes) > 0 {
		tw.printf("\nnotes\n")
		for _, n := range r.Notes {
			tw.printf("  - %s\n", strings.Join(strings.Fields(n), " "))
		}
	}
}

// WriteRoundText writes a canary round as a few lines: the result with the
// target and time, then one line per kind of message with its deliveries,
// slowest latency and the reasons it failed.
func WriteRoundText(w io.Writer, c *Round) error {
	if c == nil {
		return errors.New("report: write round text: nil round")
	}
	bw := bufio.NewWriter(w)
	tw := &renderTextWriter{w: bw}
	took := ""
	if !c.Start.IsZero() && !c.End.IsZero() && !c.End.Before(c.Start) {
		took = " in " + renderLatency(c.End.Sub(c.Start))
	}
	tw.printf("%s  canary  target %s  start %s%s\n",
		renderVerdict(c.Result), renderOr(c.Target, "-"), renderTime(c.Start), took)
	rows := make([][]string, 0, len(c.Checks))
	for _, ch := range c.Checks {
		res := "pass"
		if !ch.Pass {
			res = "FAIL"
		}
		row := []string{"  " + ch.Kind, res,
			renderCount(int64(ch.Delivered)) + "/" + renderCount(int64(ch.Expected)) + " delivered",
			"max " + renderOr(maxLatency(ch), "—")}
		if len(ch.Reasons) > 0 {
			row = append(row, strings.Join(ch.Reasons, ", "))
		}
		rows = append(rows, row)
	}
	tw.table(renderLeft, rows)
	if c.Cause != "" {
		tw.printf("  cause: %s\n", c.Cause)
	}
	if tw.err != nil {
		return fmt.Errorf("report: write round text: %w", tw.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("report: write round text: %w", err)
	}
	return nil
}

// maxLatency is a canary check's slowest delivery, "" when nothing was
// delivered: a round that could not send has no latency, not one of 0s.
func maxLatency(ch Check) string {
	if ch.Delivered == 0 && ch.MaxLatency == 0 {
		return ""
	}
	return renderLatency(ch.MaxLatency)
}

// renderTextWriter keeps the first write error so that the renderer reads
// as a list of lines rather than a ladder of error checks.
type renderTextWriter struct {
	w   io.Writer
	err error
}

func (tw *renderTextWriter) printf(format string, args ...any) {
	if tw.err != nil {
		return
	}
	_, tw.err = fmt.Fprintf(tw.w, format, args...)
}

// renderTableStyle says how a table's columns align.
type renderTableStyle int

const (
	// renderLeft aligns every column left: label and value lines.
	renderLeft renderTableStyle = iota
	// renderNumbers keeps the first column (row names) left and aligns
	// the others right, so that numbers line up on their last digit.
	renderNumbers
	// renderCounted aligns a count in the first column right and leaves
	// the text after it as it is: the top errors.
	renderCounted
)

// table writes rows through a tabwriter. tabwriter aligns all columns one
// way; for renderNumbers the first column is padded here to one width, so
// that right alignment leaves the names reading left-aligned, and the
// padding that tabwriter puts before it is cut off again.
func (tw *renderTextWriter) table(style renderTableStyle, rows [][]string) {
	if tw.err != nil || len(rows) == 0 {
		return
	}
	const padding = 2
	var flags uint
	if style != renderLeft {
		flags = tabwriter.AlignRight
	}
	width := 0
	if style == renderNumbers {
		for _, row := range rows {
			if len(row) > 0 {
				width = max(width, utf8.RuneCountInString(row[0]))
			}
		}
	}
	var buf bytes.Buffer
	t := tabwriter.NewWriter(&buf, 0, 0, padding, ' ', flags)
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i == 0 && width > 0 {
				cell += strings.Repeat(" ", width-utf8.RuneCountInString(cell))
			}
			line.WriteString(cell)
			// Only a cell that ends in a tab is part of a column. The
			// last one is left open unless it holds numbers to align,
			// so no line carries trailing padding.
			if i < len(row)-1 || style == renderNumbers {
				line.WriteByte('\t')
			}
		}
		line.WriteByte('\n')
		if _, err := io.WriteString(t, line.String()); err != nil {
			tw.err = err
			return
		}
	}
	if tw.err = t.Flush(); tw.err != nil {
		return
	}
	out := buf.String()
	if style == renderNumbers {
		var b strings.Builder
		for _, l := range strings.SplitAfter(out, "\n") {
			b.WriteString(strings.TrimPrefix(l, strings.Repeat(" ", padding)))
		}
		out = b.String()
	}
	_, tw.err = io.WriteString(tw.w, out)
}

// renderCount prints a count with thousands separators, 150,000, which a
// person reads at a glance where 150000 needs counting.
// FormatCount prints a count as every report and page of imcanary does:
// grouped by thousands from 1,000 up.
func FormatCount(n int64) string { return renderCount(n) }

func renderCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// renderCountsTotal prints a count map sorted by key, with its total when
// there is more than one key.
func renderCountsTotal(m map[string]int64) string {
	s := renderCounts(m)
	if len(m) > 1 {
		s += fmt.Sprintf(" (%s total)", renderCount(renderTotal(m)))
	}
	return s
}

func renderOr(s, empty string) string {
	if strings.TrimSpace(s) == "" {
		return empty
	}
	return s
}
