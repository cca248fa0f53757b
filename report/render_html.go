package report

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"

	"github.com/imcanary/imcanary/metrics"
)

// WriteHTML writes r as one self-contained HTML page: the verdict, the
// tables of the text summary (the slow-reader drill and the prober's
// saturation among them) and four charts drawn as inline SVG from the
// samples, with the saturated spans shaded. The page loads nothing (no script, font, image or style sheet
// from anywhere), so it opens from a file, an e-mail attachment or an
// air-gapped host alike.
func WriteHTML(w io.Writer, r *Soak) error {
	if r == nil {
		return errors.New("report: write html: nil report")
	}
	bw := bufio.NewWriter(w)
	if err := renderPage.Execute(bw, renderNewPage(r)); err != nil {
		return fmt.Errorf("report: write html: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("report: write html: %w", err)
	}
	return nil
}

// renderPageData is everything the template shows, already formatted: the
// template only lays it out, so the text and HTML reports cannot disagree
// about a number.
type renderPageData struct {
	Verdict, VerdictClass string
	Headline              string
	Profile, Target       string
	ID, Start, Length     string
	Phases                string
	// Shard is a shard's own report's shard; Shards the runs a merged
	// report was made of.
	Shard, Shards  string
	Failed         []string
	Settings       []renderKV
	Cards          []renderCard
	Thresholds     []renderThresholdRow
	DeliveryHeader []string
	Deliveries     [][]string
	Latency        [][]string
	// LatencyMean says the latency rows have a mean: a report stored
	// before reports had one shows the table it showed then.
	LatencyMean bool
	// ConnectPath is the connect path's table, its header first; nil
	// when the report has none.
	ConnectPath           [][]string
	ConnectNote           string
	Rejected, Disconnects []renderKV
	Errors                []renderKV
	Notes                 []string
	Charts                []renderChart
	// Samples counts the samples, SamplesText is that count as shown.
	Samples     int
	SamplesText string
	// Abbreviated lists the phase labels that had to be shortened on a
	// chart, "d drain", for the note under the charts.
	Abbreviated []string
	// Drill and Saturation are nil when the run had none.
	Drill      *renderDrillData
	Storm      *renderDrillData
	Saturation *renderSaturationData
	// Shaded says a chart shades saturated spans.
	Shaded bool
	// Comparisons set the run beside earlier ones; CompareChart draws
	// their latency, nil when no compared run was found.
	Comparisons  []renderComparisonData
	CompareChart *renderChart
}

// renderDrillData is the slow-reader drill's section.
type renderDrillData struct {
	Reaction string
	Rows     []renderKV
}

// renderSaturationData is the prober's saturation section.
type renderSaturationData struct {
	Summary string
	Periods [][]string
}

type renderKV struct{ Key, Value string }

// renderCard is one box of headline numbers.
type renderCard struct {
	Title string
	Big   string
	Sub   string
	Rows  []renderKV
	Bad   bool
}

type renderThresholdRow struct {
	Name, Limit, Actual, Result string
	// Cause says why a failed threshold failed, where the run knows.
	Cause string
	Pass  bool
}

func renderNewPage(r *Soak) renderPageData {
	p := renderPageData{
		Verdict: renderVerdict(r.Result),
		Profile: renderOr(r.Profile.Name, "-"),
		Target:  renderOr(r.Target, "-"),
		ID:      r.ID,
		Start:   renderTime(r.Start),
		Length:  renderOr(renderRunLength(r), "unknown"),
		Phases:  renderPhases(r),
		Shard:   r.Shard,
		Shards:  renderShards(r),
		Failed:  renderFailedThresholds(r),
		Notes:   r.Notes,
		Charts:  renderCharts(r),
		Samples: len(r.Samples),
	}
	p.SamplesText = renderCount(int64(p.Samples))
	p.Comparisons = renderComparisons(r)
	p.CompareChart = renderCompareChart(r)
	p.verdict(r)
	p.extras(r)
	p.settings(r)
	p.cards(r)
	p.tables(r)
	return p
}

// verdict sets the verdict's class and headline.
func (p *renderPageData) verdict(r *Soak) {
	switch r.Result {
	case metrics.ResultPass:
		p.VerdictClass = "pass"
		p.Headline = "Every threshold held."
	case metrics.ResultAborted:
		p.VerdictClass = "aborted"
		p.Headline = "The run was stopped before its end; an aborted run never passes."
	case metrics.ResultInconclusive:
		p.VerdictClass = "inconclusive"
		p.Headline = "A threshold failed while imcanary itself was saturated: the failure may be its own."
	default:
		p.VerdictClass = "fail"
		p.Headline = "The run failed."
	}
	if n := len(p.Failed); n > 0 {
		list := strings.Join(p.Failed, ", ")
		p.Headline = fmt.Sprintf("%d of %d thresholds failed: %s.", n, len(r.Thresholds), list)
		switch r.Result {
		case metrics.ResultAborted:
			p.Headline = "Stopped before its end. " + p.Headline
		case metrics.ResultInconclusive:
			p.Headline = fmt.Sprintf("%d of %d thresholds failed (%s) while imcanary itself was saturated: the failure may be its own.",
				n, len(r.Thresholds), list)
		}
	}
}

// extras sets what only some runs have (a drill, a storm, saturation) and
// what the charts share (shading, abbreviated phases).
func (p *renderPageData) extras(r *Soak) {
	if d := r.Drill; d != nil {
		p.Drill = &renderDrillData{Reaction: renderOr(d.Reaction, "-"), Rows: renderDrillRows(r)}
	}
	if s := r.Storm; s != nil {
		p.Storm = &renderDrillData{Reaction: renderStormHeadline(s), Rows: renderStormRows(r)}
	}
	if s := r.Saturation; s != nil {
		p.Saturation = &renderSaturationData{Summary: renderSaturationSummary(s), Periods: renderSaturationPeriods(r)}
	}
	for _, c := range p.Charts {
		p.Shaded = p.Shaded || len(c.Bands) > 0
		// Every chart shares the timeline, so one chart's list is all of
		// them; the union keeps that true if they ever differ.
		for _, a := range c.Abbreviated {
			if !slices.Contains(p.Abbreviated, a) {
				p.Abbreviated = append(p.Abbreviated, a)
			}
		}
	}

}

// settings lists the profile's settings.
func (p *renderPageData) settings(r *Soak) {
	pr := r.Profile
	p.Settings = []renderKV{
		{"users", renderCount(int64(pr.Users))},
		{"group size", renderCount(int64(pr.GroupSize))},
		{"rate", renderRate(pr.Rate) + " msg/s per user"},
		{"deadline", renderLatency(pr.Deadline)},
	}
	if pr.Groups != "" {
		p.Settings = append(p.Settings, renderKV{"group layout", pr.Groups})
	}
	if pr.Devices > 1 {
		p.Settings = append(p.Settings, renderKV{"devices per user", renderCount(int64(pr.Devices))})
	}
	if r.CatchUp != "" {
		p.Settings = append(p.Settings, renderKV{"catch-up", r.CatchUp})
	}
	if pr.LateLogins > 0 {
		p.Settings = append(p.Settings, renderKV{"late logins", renderPercent(pr.LateLogins) + " after " + renderSpan(pr.LateAfter)})
	}
	if d := r.Drill; d != nil {
		p.Settings = append(p.Settings, renderKV{"slow readers", renderPercent(d.Fraction)})
	}

}

// cards makes the summary cards: users, messages, deliveries, disconnects.
func (p *renderPageData) cards(r *Soak) {
	u, m := r.Users, r.Messages
	all := r.Deliveries["all"]
	var disconnects int64
	for _, v := range r.Disconnects {
		disconnects += v
	}
	p.Cards = []renderCard{
		{Title: "Users", Big: renderCount(int64(u.LoggedIn)), Sub: "of " + renderCount(int64(u.Configured)) + " logged in",
			Bad: u.LoggedIn < u.Configured,
			Rows: []renderKV{
				{"failed logins", renderCount(u.FailedLogins)},
				{"min online", renderPercent(u.MinOnlineRatio)},
				{"groups", renderCount(int64(u.Groups))},
			}},
		{Title: "Messages", Big: renderCount(m.Sent), Sub: "sent, " + renderSendRate(r),
			Rows: []renderKV{
				{"acked", renderCount(m.Acked)},
				{"unacked", renderCount(m.Unacked)},
				{"offline (skipped)", renderCount(m.Offline)},
				{"rejected", renderCount(renderTotal(m.Rejected))},
			}},
		// Titled by what the big figure is: "Deliveries" over "0%"
		// read as nothing delivered.
		{Title: "Lost deliveries", Big: renderPercent(all.LossRatio), Sub: "of " + renderCount(all.Expected) + " expected, lost or undelivered",
			Bad:  all.Lost+all.Undelivered > 0,
			Rows: deliveryCard(r, all)},
		{Title: "Disconnects", Big: renderCount(disconnects), Sub: "our own shutdown excluded" + renderIf(r.Drill != nil, ", slow readers apart"),
			Bad:  disconnects > 0,
			Rows: renderKVs(r.Disconnects)},
	}

}

// tables fills the tables: thresholds, deliveries, latency, connect path,
// rejections, disconnects and errors.
func (p *renderPageData) tables(r *Soak) {
	m := r.Messages
	for _, t := range r.Thresholds {
		row := renderThresholdRow{Name: t.Name, Limit: renderThresholdValue(t.Limit), Actual: renderThresholdValue(t.Actual),
			Result: "PASS", Pass: t.Pass, Cause: t.Cause}
		if !t.Pass {
			row.Result = "FAIL"
		}
		p.Thresholds = append(p.Thresholds, row)
	}
	p.DeliveryHeader = renderDeliveryHeader(r, "kind")
	for _, k := range renderKeyOrder(r.Deliveries, renderDeliveryKinds...) {
		p.Deliveries = append(p.Deliveries, renderDeliveryRow(r, k, r.Deliveries[k]))
	}
	p.LatencyMean = latencyMeans(r.Latency)
	for _, k := range renderKeyOrder(r.Latency, renderLatencyKinds...) {
		l := r.Latency[k]
		row := []string{k, "0", "-", "-", "-", "-", "-"}
		if l.Count > 0 {
			row = []string{k, renderCount(l.Count), renderLatency(l.P50),
				renderLatency(l.P95), renderLatency(l.P99), renderLatency(l.Max), renderLatency(l.Mean)}
		}
		if !p.LatencyMean {
			row = row[:len(row)-1]
		}
		p.Latency = append(p.Latency, row)
	}
	if c := r.ConnectPath; c != nil {
		p.ConnectPath, p.ConnectNote = renderConnectTable(c), connectPathNote
	}
	p.Rejected = renderKVs(m.Rejected)
	p.Disconnects = renderKVs(r.Disconnects)
	for _, e := range r.Errors {
		p.Errors = append(p.Errors, renderKV{Key: renderCount(e.Count), Value: e.Error})
	}
}

// renderKVs lists a count map sorted by key.
func renderKVs(m map[string]int64) []renderKV {
	kvs := make([]renderKV, 0, len(m))
	for _, k := range renderKeyOrder(m) {
		kvs = append(kvs, renderKV{Key: k, Value: renderCount(m[k])})
	}
	return kvs
}

// renderPage is parsed once: a template error is a programming error that
// the tests catch, so Must is right here.
var renderPage = template.Must(template.Must(template.Must(template.Must(template.New("report").
	Parse(renderPageTemplate)).Parse(renderChartTemplate)).Parse(renderStyleTemplate)).Parse(renderSearchTemplate))

// renderStyleTemplate is the style sheet of the report pages, the soak
// run's and the search's.
//
//go:embed style.html
var renderStyleTemplate string

// renderSearchTemplate is the page of a search for the server's limit.
//
//go:embed search.html
var renderSearchTemplate string

// renderChartTemplate draws one renderChart as a figure with an inline
// SVG: the report's charts and those of other pages (RenderChart) are the
// same markup. Every value in it was made a string by renderBuildChart.
//
//go:embed chart.html
var renderChartTemplate string

// renderPageTemplate is the report page. Its style sheet uses only fonts
// the reader's system has: a report must not fetch anything, and a web
// font would be a request.
//
//go:embed report.html
var renderPageTemplate string

// deliveryCard is the rows of the summary's deliveries card: with
// catch-up, real-time and eventual completeness and the recovered count
// first; a report of a release before catch-up keeps the rows it had.
func deliveryCard(r *Soak, all Deliveries) []renderKV {
	rows := []renderKV{
		{"delivered", renderCount(all.Delivered)},
		{"lost + undelivered", renderCount(all.Lost + all.Undelivered)},
		{"late", renderCount(all.Late) + " (" + renderPercent(all.LateRatio) + ")"},
		{"duplicate", renderCount(all.Duplicate)},
	}
	if r.CatchUp == "" {
		return rows
	}
	return append([]renderKV{
		{"real-time completeness", renderPercent(all.Realtime())},
		{"eventual completeness", renderPercent(all.Eventual())},
		{"recovered by catch-up (" + r.CatchUp + ")", renderCount(all.Recovered) +
			renderIf(all.LatePush > 0, ", "+renderCount(all.LatePush)+" of them pushed later (slow, not missing)")},
	}, rows...)
}

// PageChanges are the changes made on purpose to the report page since
// a58460c, the last release that stored pages, as pairs of the text then
// and the text now. A page rendered now from a report of that release is
// the page it stored with these made: the tests of old data directories
// hold the rest of the page to what was stored.
var PageChanges = []string{
	// Issue 37: the deliveries card's big figure is the loss ratio, and
	// "Deliveries" over "0%" read as nothing delivered.
	"<h3>Deliveries</h3>", "<h3>Lost deliveries</h3>",
	`<div class="sub">lost of `, `<div class="sub">of `,
	` expected</div>`, ` expected, lost or undelivered</div>`,
}
