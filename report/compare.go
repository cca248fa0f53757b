package report

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The runs a soak report is compared with, as Comparison.Against names
// them.
const (
	// AgainstPrevious is the newest earlier run of the same profile and
	// target that was not aborted.
	AgainstPrevious = "previous"
	// AgainstBaseline is the run pinned as the profile's baseline
	// (imcanary soak pin RUN_ID).
	AgainstBaseline = "baseline"
)

// Comparison is a soak run beside an earlier run of the same profile: the
// deltas of its headline numbers, and the earlier run's latency series for
// a chart. A report carries one per compared run, even when that run is
// missing, so that "no baseline" is said rather than left out.
type Comparison struct {
	// Against is AgainstPrevious or AgainstBaseline.
	Against string `json:"against"`
	// ID, Start and Result are the compared run's; empty when Missing.
	ID     string    `json:"id,omitempty"`
	Start  time.Time `json:"start,omitzero"`
	Result string    `json:"result,omitempty"`
	// Missing says in words why there is no run to compare with (the
	// first run of a profile, no baseline pinned, a baseline pruned from
	// the history); empty when there is one.
	Missing string `json:"missing,omitempty"`
	// SettingsChanged names the settings that differ between the two
	// runs, by their JSON names in Profile (and "catch_up", "target",
	// "drill.*"): the deltas then compare different experiments.
	SettingsChanged []string `json:"settings_changed,omitempty"`
	// Deltas are this run's numbers beside the compared run's.
	Deltas []Delta `json:"deltas,omitempty"`
	// Series is the compared run's delivery latency per sample, for the
	// chart that draws both runs.
	Series []ComparedSample `json:"series,omitempty"`
}

// Delta is one number of two runs. Was is the compared run's value, Now
// this run's, both in Unit: "seconds", "ratio", "count", "per_second" or,
// for a search, "value" (the varied value's own unit).
type Delta struct {
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	Was    float64 `json:"was"`
	Now    float64 `json:"now"`
	Change float64 `json:"change"` // Now - Was
	// Relative is Change / Was; absent when Was is zero, where no ratio
	// is defined.
	Relative *float64 `json:"relative,omitempty"`
	// Worse says the change goes the bad way: more latency, loss, late,
	// duplicates or disconnects; less throughput or online ratio.
	Worse bool `json:"worse"`
}

// ComparedSample is one sample of a compared run: its delivery latency
// over the interval that ended Offset seconds after that run's start.
type ComparedSample struct {
	Offset float64       `json:"offset_seconds"`
	P50    time.Duration `json:"p50_ns"`
	P99    time.Duration `json:"p99_ns"`
}

// Delta units.
const (
	unitSeconds   = "seconds"
	unitRatio     = "ratio"
	unitCount     = "count"
	unitPerSecond = "per_second"
	// unitValue is a search's varied value, in its own unit.
	unitValue = "value"
)

// MissingComparison is the Comparison of a run that is not there, with
// why in words.
func MissingComparison(against, why string) Comparison {
	return Comparison{Against: against, Missing: why}
}

// Compare returns r beside was, an earlier run of the same profile.
func Compare(against string, r, was *Soak) Comparison {
	c := Comparison{Against: against, ID: was.ID, Start: was.Start, Result: was.Result}
	c.SettingsChanged = settingsChanged(was, r)
	worseIfUp := func(name, unit string, w, n float64) {
		c.Deltas = append(c.Deltas, newDelta(name, unit, w, n, n > w))
	}
	worseIfDown := func(name, unit string, w, n float64) {
		c.Deltas = append(c.Deltas, newDelta(name, unit, w, n, n < w))
	}
	for _, k := range renderLatencyKinds {
		pw, okw := was.Latency[k]
		pn, okn := r.Latency[k]
		if !okw || !okn || pw.Count == 0 || pn.Count == 0 {
			// A latency one run did not measure has no delta.
			continue
		}
		for _, q := range []struct {
			name string
			w, n time.Duration
		}{{"p50", pw.P50, pn.P50}, {"p95", pw.P95, pn.P95}, {"p99", pw.P99, pn.P99}, {"max", pw.Max, pn.Max}} {
			worseIfUp(k+" "+q.name, unitSeconds, q.w.Seconds(), q.n.Seconds())
		}
	}
	aw, an := was.Deliveries["all"], r.Deliveries["all"]
	worseIfUp("loss", unitRatio, aw.LossRatio, an.LossRatio)
	worseIfUp("late", unitRatio, aw.LateRatio, an.LateRatio)
	worseIfUp("duplicates", unitCount, float64(aw.Duplicate), float64(an.Duplicate))
	worseIfUp("reordered", unitCount, float64(aw.Reordered), float64(an.Reordered))
	if aw.Recovered > 0 || an.Recovered > 0 {
		// Recovered by catch-up: delivered in the end, not pushed.
		worseIfUp("recovered", unitCount, float64(aw.Recovered), float64(an.Recovered))
	}
	worseIfDown("sent per second", unitPerSecond, was.Messages.SentPerSec, r.Messages.SentPerSec)
	worseIfDown("delivered", unitCount, float64(aw.Delivered), float64(an.Delivered))
	worseIfUp("disconnects", unitCount, float64(renderTotal(was.Disconnects)), float64(renderTotal(r.Disconnects)))
	worseIfDown("min online", unitRatio, was.Users.MinOnlineRatio, r.Users.MinOnlineRatio)
	if was.Drill != nil && r.Drill != nil {
		tw, tn := was.Drill.TimeToDisconnect, r.Drill.TimeToDisconnect
		if tw.Count > 0 && tn.Count > 0 {
			// How fast the server sheds a slow reader: a change either
			// way is news, but only slower shedding hurts the others.
			worseIfUp("slow reader time to disconnect p50", unitSeconds, tw.P50.Seconds(), tn.P50.Seconds())
		}
	}
	if sw, sn := was.Storm, r.Storm; sw != nil && sn != nil && sw.Dropped > 0 && sn.Dropped > 0 {
		// A reconnect storm's recovery: the times only where both runs
		// got that far back (the share back says the rest), and the
		// logins of the sessions that came back.
		worseIfDown("storm sessions back", unitRatio, float64(sw.Back)/float64(sw.Dropped), float64(sn.Back)/float64(sn.Dropped))
		if sw.Reached99 && sn.Reached99 {
			worseIfUp("storm recovery 99%", unitSeconds, sw.Recovery99.Seconds(), sn.Recovery99.Seconds())
		}
		if sw.Reached100 && sn.Reached100 {
			worseIfUp("storm recovery 100%", unitSeconds, sw.Recovery100.Seconds(), sn.Recovery100.Seconds())
		}
		if sw.Login.Count > 0 && sn.Login.Count > 0 {
			worseIfUp("storm login p50", unitSeconds, sw.Login.P50.Seconds(), sn.Login.P50.Seconds())
			worseIfUp("storm login p99", unitSeconds, sw.Login.P99.Seconds(), sn.Login.P99.Seconds())
		}
		worseIfUp("storm lost", unitCount, float64(sw.Deliveries.Lost), float64(sn.Deliveries.Lost))
	}
	for _, s := range was.Samples {
		c.Series = append(c.Series, ComparedSample{Offset: renderFinite(s.T.Sub(was.Start).Seconds()), P50: s.P50, P99: s.P99})
	}
	return c
}

func newDelta(name, unit string, was, now float64, worse bool) Delta {
	d := Delta{Name: name, Unit: unit, Was: renderFinite(was), Now: renderFinite(now)}
	d.Change = d.Now - d.Was
	if d.Was != 0 {
		rel := renderFinite(d.Change / d.Was) // a tiny Was can overflow it
		d.Relative = &rel
	}
	d.Worse = worse
	return d
}

// settingsChanged lists the settings that differ between a and b, by
// their JSON names: the profile (its name aside), catch-up, the target
// and the drill's settings.
func settingsChanged(a, b *Soak) []string { return changedKeys(settingsOf(a), settingsOf(b)) }

// changedKeys lists, sorted, the keys whose values differ between a and
// b, a key that only one has included.
func changedKeys(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// settingsOf flattens what a run was configured to do into key → value
// text, keys as the report's JSON names them.
func settingsOf(r *Soak) map[string]string {
	p := r.Profile
	p.Name = ""
	out := map[string]string{"catch_up": r.CatchUp, "target": r.Target}
	flatten(out, "", p)
	if d := r.Drill; d != nil {
		flatten(out, "drill.", struct {
			Fraction   float64       `json:"fraction"`
			ReadDelay  time.Duration `json:"read_delay_ns"`
			Pause      time.Duration `json:"pause_ns"`
			PauseEvery time.Duration `json:"pause_every_ns"`
		}{d.Fraction, d.ReadDelay, d.Pause, d.PauseEvery})
	} else {
		out["drill"] = "none"
	}
	delete(out, "name")
	return out
}

func flatten(out map[string]string, prefix string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // plain numbers and strings always encode
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return
	}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
				continue
			}
			out[prefix+k] = fmt.Sprint(v)
		}
	}
	walk(prefix, m)
}

// renderComparisonTitle is the heading line of a comparison: what run, or
// why none.
func renderComparisonTitle(c Comparison) string {
	if c.Missing != "" {
		return fmt.Sprintf("compared with the %s run: none: %s", c.Against, c.Missing)
	}
	return fmt.Sprintf("compared with the %s run %s (%s, started %s)", c.Against, c.ID, renderVerdict(c.Result), renderTime(c.Start))
}

// renderComparisonSettings says which settings changed, or "" when none
// did.
func renderComparisonSettings(c Comparison) string {
	if len(c.SettingsChanged) == 0 {
		return ""
	}
	return "settings changed since that run, so the deltas compare different experiments: " + strings.Join(c.SettingsChanged, ", ")
}

// renderDeltaRow is a delta as the text and HTML tables show it: name,
// was, now, change, relative change, and "worse", "better" or "".
func renderDeltaRow(d Delta) []string {
	f := func(v float64) string {
		switch d.Unit {
		case unitSeconds:
			return renderLatency(time.Duration(math.Round(v * float64(time.Second))))
		case unitRatio:
			return renderPercent(v)
		case unitPerSecond:
			return renderRate(v)
		case unitValue:
			return searchValue(v)
		}
		return renderCount(int64(math.Round(v)))
	}
	change := "0"
	switch {
	case d.Change == 0:
	case d.Unit == unitRatio:
		// A change of a ratio is in percentage points: "+0.5%" would
		// read as relative.
		change = renderSigned(d.Change, strings.TrimSuffix(renderPercent(math.Abs(d.Change)), "%")+" pp")
	default:
		change = renderSigned(d.Change, f(math.Abs(d.Change)))
	}
	rel := "-"
	if d.Relative != nil {
		rel = renderRelative(*d.Relative)
	}
	judged := ""
	if d.Change != 0 {
		judged = "better"
		if d.Worse {
			judged = "worse"
		}
	}
	return []string{d.Name, f(d.Was), f(d.Now), change, rel, judged}
}

func renderSigned(v float64, abs string) string {
	if v < 0 {
		return "-" + abs
	}
	return "+" + abs
}

// renderRelative prints a relative change as a signed percentage, one
// decimal below ten percent.
func renderRelative(v float64) string {
	p := v * 100
	var s string
	if math.Abs(p) < 9.95 {
		s = trimZeroDecimal(strconv.FormatFloat(p, 'f', 1, 64)) + "%"
	} else {
		s = strconv.FormatFloat(p, 'f', 0, 64) + "%"
	}
	if p > 0 {
		return "+" + s
	}
	return s
}

var renderDeltaHeader = []string{"measure", "was", "now", "change", "relative", ""}

// renderComparisonData is one comparison as the HTML page shows it.
type renderComparisonData struct {
	Title, Settings string
	Rows            [][]string
}

func renderComparisons(r *Soak) []renderComparisonData {
	var out []renderComparisonData
	for _, c := range r.Comparisons {
		d := renderComparisonData{Title: renderComparisonTitle(c), Settings: renderComparisonSettings(c)}
		for _, dl := range c.Deltas {
			d.Rows = append(d.Rows, renderDeltaRow(dl))
		}
		out = append(out, d)
	}
	return out
}

// renderCompareChart draws this run's delivery p99 beside each compared
// run's, on this run's timeline: a compared run's value at a sample is
// that of its own latest sample at or before the same time since its
// start, and a gap past its end. Nil when nothing was compared.
func renderCompareChart(r *Soak) *renderChart {
	tl := renderNewTimeline(r)
	gap := func(d time.Duration) float64 {
		if d <= 0 {
			return math.NaN() // nothing arrived in the interval
		}
		return d.Seconds()
	}
	this := make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		this[i] = gap(s.P99)
	}
	series := []renderSeries{{Name: "this run p99", Color: renderColorBlue, Values: this}}
	styles := map[string][2]string{
		AgainstPrevious: {renderColorOrange, "5 3"},
		AgainstBaseline: {renderColorPurple, "2 2"},
	}
	for _, c := range r.Comparisons {
		if c.Missing != "" {
			continue
		}
		v := make([]float64, len(tl.X))
		for i, x := range tl.X {
			v[i] = math.NaN()
			// Samples are in time order: the last one at or before x.
			j, _ := slices.BinarySearchFunc(c.Series, x, func(s ComparedSample, x float64) int {
				if s.Offset <= x {
					return -1
				}
				return 1
			})
			if j > 0 {
				v[i] = gap(c.Series[j-1].P99)
			}
		}
		st := styles[c.Against]
		series = append(series, renderSeries{Name: c.Against + " p99 (" + c.ID + ")", Color: st[0], Dash: st[1], Values: v})
	}
	if len(series) == 1 {
		return nil
	}
	ch := renderBuildChart(renderChartSpec{
		ID: "chart-compare", Title: "Delivery p99, this run and the compared runs",
		Desc: "Delivery latency p99 per sample interval of this run and of each compared run, by time since each run's start, " +
			"on a logarithmic axis.",
		YLabel: "delivery p99 (log)", Log: true, YFormat: renderTickLatency,
		Series: series,
	}, tl)
	return &ch
}
