package report

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteSearchHTML writes s as one self-contained HTML page, as WriteHTML
// does a soak run: the verdict, the thresholds that broke first, charts of
// latency, throughput and loss against the varied value, each step's
// figures and the comparisons with earlier searches.
func WriteSearchHTML(w io.Writer, s *Search) error {
	if s == nil {
		return errors.New("report: write search html: nil report")
	}
	bw := bufio.NewWriter(w)
	if err := renderPage.ExecuteTemplate(bw, "search", renderNewSearchPage(s)); err != nil {
		return fmt.Errorf("report: write search html: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("report: write search html: %w", err)
	}
	return nil
}

// renderSearchData is what the search page shows, already formatted.
type renderSearchData struct {
	Verdict, VerdictClass string
	Headline              string
	Profile, Target       string
	ID, Start, Length     string
	Vary, Unit            string
	Settings              []renderKV
	Broke                 []renderThresholdRow
	BrokeAt               string
	Charts                []renderChart
	Steps                 [][]string
	// StepClass is each step's row class: "failed" or "".
	StepClass   []string
	Comparisons []renderComparisonData
	Notes       []string
}

func renderNewSearchPage(s *Search) renderSearchData {
	p := renderSearchData{
		Verdict: searchResultWord(s.Result), Headline: s.Verdict(),
		Profile: renderOr(s.Profile, "-"), Target: renderOr(s.Target, "-"), ID: s.ID,
		Start: renderTime(s.StartTime), Vary: s.Vary, Unit: searchUnit(s.Vary), Notes: s.Notes,
	}
	switch s.Result {
	case SearchFound, SearchNoLimit:
		p.VerdictClass = "pass"
	case SearchBelowStart:
		p.VerdictClass = "fail"
	case SearchInconclusive:
		p.VerdictClass = "inconclusive"
	default:
		p.VerdictClass = "aborted"
	}
	if !s.StartTime.IsZero() && !s.EndTime.IsZero() && !s.EndTime.Before(s.StartTime) {
		p.Length = renderSpan(s.EndTime.Sub(s.StartTime))
	}
	p.Settings = []renderKV{
		{"varying", s.Vary}, {"from", searchValue(s.Start)}, {"up by", searchValue(s.Factor) + "×"},
		{"to within", renderPercent(s.Precision)}, {"at most", searchValue(s.Max)},
	}
	for _, kv := range []struct {
		key, vary string
		v         string
	}{
		{"users", "users", strconv.Itoa(s.Settings.Users)},
		{"rate", "rate", searchValue(s.Settings.Rate) + "/s per user"},
		{"group size", "group_size", strconv.Itoa(s.Settings.GroupSize)},
	} {
		if kv.vary != s.Vary {
			p.Settings = append(p.Settings, renderKV{kv.key, kv.v})
		}
	}
	if s.Settings.Duration > 0 {
		p.Settings = append(p.Settings, renderKV{"each step", renderSpan(s.Settings.Ramp) + " ramp, " +
			renderSpan(s.Settings.Duration) + " sending, " + renderSpan(s.Settings.Drain) + " drain"})
	}
	if len(s.Broke) > 0 {
		p.BrokeAt = searchValue(s.FirstFail) + " " + p.Unit
		for _, t := range s.Broke {
			p.Broke = append(p.Broke, renderThresholdRow{Name: t.Name, Limit: t.Limit, Actual: t.Actual, Result: "FAIL", Cause: t.Cause})
		}
	}
	for i, st := range s.Steps {
		var failed []string
		for _, t := range st.Failed {
			failed = append(failed, t.Name)
		}
		if len(st.Saturation) > 0 {
			failed = append(failed, "imcanary saturated: "+strings.Join(st.Saturation, ", "))
		}
		p.Steps = append(p.Steps, []string{strconv.Itoa(i + 1), searchValue(st.Value), renderVerdict(st.Result),
			renderRate(st.SentPerSec), renderRate(st.DeliveredPerSec), renderLatency(st.P99Delivery), renderLatency(st.P99Ack),
			renderPercent(st.Realtime), renderPercent(st.LossRatio), renderOr(strings.Join(failed, ", "), "-")})
		class := ""
		if st.Result != "pass" {
			class = "failed"
		}
		p.StepClass = append(p.StepClass, class)
	}
	for _, c := range s.Comparisons {
		p.Comparisons = append(p.Comparisons, renderComparisonData{
			Title: searchComparisonTitle(c), Settings: searchComparisonSettings(c), Rows: searchDeltaRows(c)})
	}
	p.Charts = renderSearchCharts(s)
	return p
}

// renderSearchCharts draws the steps against the varied value: each
// series joins its own steps in order of value, so that an earlier search
// whose steps fell elsewhere is drawn beside this one's on one axis.
func renderSearchCharts(s *Search) []renderChart {
	type run struct {
		name, dash string
		steps      []SearchStep
	}
	runs := []run{{steps: s.Steps}}
	// A compared search is drawn once, named for what it is compared as
	// (the previous search is often the baseline too): the legend has room
	// for two series of this search and two of others.
	dashes := []string{"6 4", "1 3"}
	seen := map[string]int{}
	for _, c := range s.Comparisons {
		if c.Missing != "" || len(c.Steps) == 0 {
			continue
		}
		if i, ok := seen[c.ID]; ok {
			runs[i].name += ", " + c.Against
			continue
		}
		seen[c.ID] = len(runs)
		runs = append(runs, run{name: c.Against, dash: dashes[min(len(runs)-1, len(dashes)-1)], steps: c.Steps})
	}
	// The axis: every value of every run, once, in order.
	var xs []float64
	for _, r := range runs {
		for _, st := range r.steps {
			xs = append(xs, st.Value)
		}
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	tl := renderTimeline{X: xs, XFormat: searchValue}
	if len(xs) > 0 {
		tl.Max = xs[len(xs)-1] * 1.05
	}
	if !(tl.Max > 0) {
		tl.Max = 1
	}
	for _, m := range []struct {
		name string
		v    float64
	}{{"knee", s.Knee}, {"first failing", s.FirstFail}} {
		if m.v > 0 {
			tl.PhaseNames = append(tl.PhaseNames, m.name+" "+searchValue(m.v))
			tl.PhaseX = append(tl.PhaseX, m.v)
			tl.PhaseTitles = append(tl.PhaseTitles, m.name+": "+searchValue(m.v)+" "+searchUnit(s.Vary))
		}
	}
	// at is r's value of f at each x, NaN where r has no step there.
	at := func(r run, f func(SearchStep) float64) []float64 {
		v := make([]float64, len(xs))
		for i := range v {
			v[i] = math.NaN()
		}
		for _, st := range r.steps {
			if i, ok := slices.BinarySearch(xs, st.Value); ok {
				v[i] = f(st)
			}
		}
		return v
	}
	seconds := func(d time.Duration) float64 {
		if d <= 0 {
			return math.NaN()
		}
		return d.Seconds()
	}
	var lat, thr, loss []renderSeries
	for i, r := range runs {
		name := func(own string) string { return cmp.Or(r.name, own) }
		lat = append(lat, renderSeries{Name: name("p99 delivery"), Color: renderColorOrange, Dash: r.dash,
			Values: at(r, func(st SearchStep) float64 { return seconds(st.P99Delivery) })})
		thr = append(thr, renderSeries{Name: name("delivered/s"), Color: renderColorGreen, Dash: r.dash,
			Values: at(r, func(st SearchStep) float64 { return st.DeliveredPerSec })})
		loss = append(loss, renderSeries{Name: name("lost"), Color: renderColorFail, Dash: r.dash,
			Values: at(r, func(st SearchStep) float64 { return st.LossRatio })})
		if i == 0 {
			loss = append(loss, renderSeries{Name: "not pushed in time", Color: renderColorOrange, Dash: "2 2",
				Values: at(r, func(st SearchStep) float64 { return 1 - st.Realtime })})
		}
		if i == 0 {
			// This search's own acks and sends; the compared ones' are
			// in their reports.
			lat = append(lat, renderSeries{Name: "p99 ack", Color: renderColorBlue, Dash: "2 2",
				Values: at(r, func(st SearchStep) float64 { return seconds(st.P99Ack) })})
			thr = append(thr, renderSeries{Name: "sent/s", Color: renderColorBlue, Dash: "2 2",
				Values: at(r, func(st SearchStep) float64 { return st.SentPerSec })})
		}
	}
	t := s.Settings.Thresholds
	var latRefs, lossRefs []renderRefSpec
	if t.P99Delivery > 0 {
		latRefs = append(latRefs, renderRefSpec{Label: "p99 delivery limit " + renderLatency(t.P99Delivery), Color: renderColorFail, Value: t.P99Delivery.Seconds()})
	}
	if t.P99Ack > 0 && t.P99Ack != t.P99Delivery {
		latRefs = append(latRefs, renderRefSpec{Label: "p99 ack limit " + renderLatency(t.P99Ack), Color: renderColorMuted, Value: t.P99Ack.Seconds()})
	}
	if t.MaxLoss > 0 {
		lossRefs = append(lossRefs, renderRefSpec{Label: "loss limit " + renderPercent(t.MaxLoss), Color: renderColorFail, Value: t.MaxLoss})
	}
	x := s.Vary + " (" + searchUnit(s.Vary) + ")"
	return []renderChart{
		renderBuildChart(renderChartSpec{
			ID: "chart-search-latency", Title: "p99 latency against " + s.Vary,
			Desc:   "Each step's p99 delivery and ack latency against its " + s.Vary + ", on a logarithmic axis, with the knee and the first failing value marked.",
			XLabel: x, YLabel: "p99 latency (log)", Log: true, YFormat: renderTickLatency, Sparse: true,
			Series: lat, Refs: latRefs,
		}, tl),
		renderBuildChart(renderChartSpec{
			ID: "chart-search-throughput", Title: "Messages sent and delivered per second against " + s.Vary,
			Desc:   "Each step's messages sent per second and deliveries per second while it sent, against its " + s.Vary + ".",
			XLabel: x, YLabel: "per second", Sparse: true, Series: thr,
		}, tl),
		renderBuildChart(renderChartSpec{
			ID: "chart-search-loss", Title: "Deliveries lost or not pushed in time against " + s.Vary,
			Desc: "Each step's lost deliveries, and those not pushed within the deadline (fetched by catch-up, or pushed late), " +
				"as a share of those expected, against its " + s.Vary + ".",
			XLabel: x, YLabel: "share of deliveries", YFormat: renderPercent, Sparse: true, Series: loss, Refs: lossRefs,
		}, tl),
	}
}
