package report

import (
	"bufio"
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
	Failed                []string
	Settings              []renderKV
	Cards                 []renderCard
	Thresholds            []renderThresholdRow
	DeliveryHeader        []string
	Deliveries            [][]string
	Latency               [][]string
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
	Pass                        bool
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
		Failed:  renderFailedThresholds(r),
		Notes:   r.Notes,
		Charts:  renderCharts(r),
		Samples: len(r.Samples),
	}
	p.SamplesText = renderCount(int64(p.Samples))
	p.Comparisons = renderComparisons(r)
	p.CompareChart = renderCompareChart(r)
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
		{Title: "Deliveries", Big: renderPercent(all.LossRatio), Sub: "lost of " + renderCount(all.Expected) + " expected",
			Bad:  all.Lost+all.Undelivered > 0,
			Rows: deliveryCard(r, all)},
		{Title: "Disconnects", Big: renderCount(disconnects), Sub: "our own shutdown excluded" + renderIf(r.Drill != nil, ", slow readers apart"),
			Bad:  disconnects > 0,
			Rows: renderKVs(r.Disconnects)},
	}

	for _, t := range r.Thresholds {
		row := renderThresholdRow{Name: t.Name, Limit: renderThresholdValue(t.Limit), Actual: renderThresholdValue(t.Actual),
			Result: "PASS", Pass: t.Pass}
		if !t.Pass {
			row.Result = "FAIL"
		}
		p.Thresholds = append(p.Thresholds, row)
	}
	p.DeliveryHeader = renderDeliveryHeader(r, "kind")
	for _, k := range renderKeyOrder(r.Deliveries, renderDeliveryKinds...) {
		p.Deliveries = append(p.Deliveries, renderDeliveryRow(r, k, r.Deliveries[k]))
	}
	for _, k := range renderKeyOrder(r.Latency, renderLatencyKinds...) {
		l := r.Latency[k]
		if l.Count == 0 {
			p.Latency = append(p.Latency, []string{k, "0", "-", "-", "-", "-"})
			continue
		}
		p.Latency = append(p.Latency, []string{k, renderCount(l.Count), renderLatency(l.P50),
			renderLatency(l.P95), renderLatency(l.P99), renderLatency(l.Max)})
	}
	if c := r.ConnectPath; c != nil {
		p.ConnectPath, p.ConnectNote = renderConnectTable(c), connectPathNote
	}
	p.Rejected = renderKVs(m.Rejected)
	p.Disconnects = renderKVs(r.Disconnects)
	for _, e := range r.Errors {
		p.Errors = append(p.Errors, renderKV{Key: renderCount(e.Count), Value: e.Error})
	}
	return p
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
var renderPage = template.Must(template.Must(template.New("report").Parse(renderPageTemplate)).Parse(renderChartTemplate))

// renderChartTemplate draws one renderChart as a figure with an inline
// SVG: the report's charts and those of other pages (RenderChart) are the
// same markup. Every value in it was made a string by renderBuildChart.
const renderChartTemplate = `{{define "chart"}}{{$c := .}}<figure>
<figcaption id="{{.ID}}-caption">{{.Title}}</figcaption>
<svg viewBox="0 0 {{.W}} {{.H}}" width="{{.W}}" height="{{.H}}" role="img" aria-labelledby="{{.ID}}-title {{.ID}}-desc">
<title id="{{.ID}}-title">{{.Title}}</title>
<desc id="{{.ID}}-desc">{{.Desc}}</desc>
<rect x="{{.Left}}" y="{{.Top}}" width="{{.PlotW}}" height="{{.PlotH}}" fill="#fbfcfd" stroke="#d1d9e0"/>
{{range .Bands}}<rect class="saturated" x="{{.X}}" y="{{$c.Top}}" width="{{.W}}" height="{{$c.PlotH}}" fill="#8250df" fill-opacity="0.14"><title>{{.Title}}</title></rect>
{{end}}<g class="grid" stroke="#eaeef2" stroke-width="1">
{{range .YTicks}}<line x1="{{$c.Left}}" x2="{{$c.Right}}" y1="{{.Pos}}" y2="{{.Pos}}"/>
{{end}}{{range .XTicks}}<line x1="{{.Pos}}" x2="{{.Pos}}" y1="{{$c.Top}}" y2="{{$c.Bottom}}"/>
{{end}}</g>
<g class="y-ticks" text-anchor="end">
{{range .YTicks}}<text x="{{$c.Left}}" y="{{.Pos}}" dx="-6" dy="4">{{.Label}}</text>
{{end}}</g>
<g class="x-ticks" text-anchor="middle">
{{range .XTicks}}<line x1="{{.Pos}}" x2="{{.Pos}}" y1="{{$c.Bottom}}" y2="{{$c.Bottom}}" stroke="#8c959f"/><text x="{{.Pos}}" y="{{$c.Bottom}}" dy="16">{{.Label}}</text>
{{end}}</g>
<text class="axis-title" x="{{.Right}}" y="{{.H}}" dy="-6" text-anchor="end">{{.XLabel}} →</text>
<text class="axis-title" x="{{.YLabelX}}" y="{{.YLabelY}}" text-anchor="middle" transform="rotate(-90 {{.YLabelX}} {{.YLabelY}})">{{.YLabel}}</text>
{{range .Phases}}<g class="phase"><title>{{.Title}}</title><line x1="{{.X}}" x2="{{.X}}" y1="{{$c.Top}}" y2="{{$c.Bottom}}" stroke="#8c959f" stroke-width="1.2" stroke-dasharray="6 4"/><text x="{{.LabelX}}" y="{{.LabelY}}" text-anchor="{{.Anchor}}">{{.Label}}</text></g>
{{end}}{{range .Refs}}<g class="ref"><line x1="{{$c.Left}}" x2="{{$c.Right}}" y1="{{.Y}}" y2="{{.Y}}" stroke="{{.Color}}" stroke-width="1.2" stroke-dasharray="3 3"/><text x="{{.LabelX}}" y="{{.LabelY}}" text-anchor="end" fill="{{.Color}}">{{.Label}}</text></g>
{{end}}<g class="series" fill="none" stroke-width="2" stroke-linejoin="round" stroke-linecap="round">
{{range .Lines}}<polyline points="{{.Points}}" stroke="{{.Color}}"{{with .Dash}} stroke-dasharray="{{.}}"{{end}}><title>{{.Name}}</title></polyline>
{{end}}{{range .Dots}}<circle cx="{{.X}}" cy="{{.Y}}" r="3" fill="{{.Color}}" stroke="none"/>
{{end}}</g>
{{with .Empty}}<text class="empty" x="{{$c.EmptyX}}" y="{{$c.EmptyY}}" text-anchor="middle">{{.}}</text>
{{end}}<g class="legend">
{{range .Legend}}<line x1="{{.X1}}" x2="{{.X2}}" y1="{{.Y}}" y2="{{.Y}}" stroke="{{.Color}}" stroke-width="3"{{with .Dash}} stroke-dasharray="{{.}}"{{end}}/><text x="{{.TextX}}" y="{{.TextY}}">{{.Name}}</text>
{{end}}</g>
</svg>
</figure>
{{end}}`

// The style sheet uses only fonts the reader's system has: a report must
// not fetch anything, and a web font would be a request.
const renderPageTemplate = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Verdict}} · soak {{.Profile}} · {{.Target}}</title>
<style>
:root {
  --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa;
  --pass: #1a7f37; --pass-bg: #dafbe1; --fail: #cf222e; --fail-bg: #ffebe9;
  --aborted: #9a6700; --aborted-bg: #fff8c5;
  --inconclusive: #6639ba; --inconclusive-bg: #fbefff;
}
* { box-sizing: border-box; }
body {
  margin: 0; color: var(--fg); background: #fff;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "Noto Sans", "DejaVu Sans", "Helvetica Neue", Arial, sans-serif;
}
main, .banner-inner { max-width: 1200px; margin: 0 auto; padding: 0 24px; }
.banner { border-bottom: 1px solid var(--line); padding: 24px 0 20px; }
.banner.pass { background: var(--pass-bg); border-top: 8px solid var(--pass); }
.banner.fail { background: var(--fail-bg); border-top: 8px solid var(--fail); }
.banner.aborted { background: var(--aborted-bg); border-top: 8px solid var(--aborted); }
.banner.inconclusive { background: var(--inconclusive-bg); border-top: 8px solid var(--inconclusive); }
.banner-inner { display: flex; gap: 24px; align-items: center; }
.verdict {
  flex: none; font-size: 40px; font-weight: 800; letter-spacing: .04em; color: #fff;
  padding: 10px 26px; border-radius: 10px; line-height: 1.1;
}
.pass .verdict { background: var(--pass); }
.fail .verdict { background: var(--fail); }
.aborted .verdict { background: var(--aborted); }
.inconclusive .verdict { background: var(--inconclusive); }
h1 { font-size: 24px; margin: 0 0 2px; font-weight: 650; }
.headline { font-size: 17px; margin: 0 0 6px; font-weight: 600; }
.pass .headline { color: var(--pass); }
.fail .headline { color: var(--fail); }
.aborted .headline { color: var(--aborted); }
.inconclusive .headline { color: var(--inconclusive); }
.meta { color: var(--muted); margin: 0; font-size: 14px; }
.meta b { color: var(--fg); font-weight: 600; }
.meta span + span::before { content: "·"; margin: 0 8px; color: var(--line); }
h2 { font-size: 18px; margin: 32px 0 12px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
section { margin: 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(250px, 1fr)); gap: 16px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; background: #fff; }
.card h3 { margin: 0; font-size: 13px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
.card .big { font-size: 30px; font-weight: 700; line-height: 1.2; margin-top: 4px; font-variant-numeric: tabular-nums; }
.card.bad .big { color: var(--fail); }
.card .sub { color: var(--muted); font-size: 13px; margin-bottom: 8px; }
.card dl { margin: 0; display: grid; grid-template-columns: 1fr auto; gap: 2px 12px; font-size: 14px; }
.card dt { color: var(--muted); }
.card dd { margin: 0; text-align: right; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; width: 100%; font-size: 14px; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 12px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: var(--soft); font-weight: 600; color: var(--muted); font-size: 13px; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) td { background: #fbfcfd; }
td.name { font-family: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
tr.failed td { background: var(--fail-bg) !important; }
.pill { display: inline-block; min-width: 52px; text-align: center; font-weight: 700; font-size: 12px; padding: 1px 8px; border-radius: 999px; color: #fff; }
.pill.pass { background: var(--pass); }
.pill.fail { background: var(--fail); }
.two { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 0 32px; align-items: start; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 20px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 8px; padding: 12px 12px 4px; }
figcaption { font-weight: 600; font-size: 15px; margin: 0 0 2px 4px; }
svg { display: block; width: 100%; height: auto; font-family: inherit; }
svg text { font-size: 11px; fill: var(--muted); }
svg .legend text { font-size: 12px; fill: var(--fg); }
svg .axis-title { font-size: 11px; fill: var(--muted); }
svg .phase text { font-size: 11px; fill: #424a53; font-weight: 600; }
svg .ref text { font-size: 11px; font-weight: 600; }
svg .phase text, svg .ref text { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg .empty { font-size: 16px; fill: var(--muted); }
.chart-note { color: var(--muted); font-size: 13px; margin: 8px 0 0; }
.reaction { font-size: 16px; font-weight: 600; margin: 0 0 10px; }
.saturation-summary { margin: 0 0 10px; color: var(--inconclusive); font-weight: 600; }
table.kv td { text-align: left; white-space: normal; }
table.kv td:first-child { width: 1%; white-space: nowrap; color: var(--muted); }
.none { color: var(--muted); }
th.count, td.count { text-align: right; width: 1%; }
th.count + th, td.err { text-align: left; }
td.err { white-space: normal; word-break: break-word; font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
ul.notes { margin: 0; padding-left: 20px; }
ul.notes li { margin: 4px 0; }
{{if .Comparisons}}.compare-title { font-weight: 600; margin: 16px 0 6px; }
.compare-settings { color: var(--aborted); font-weight: 600; margin: 0 0 6px; }
.charts.compare { grid-template-columns: minmax(0, 590px); }
tr.worse td { background: var(--fail-bg) !important; }
{{end}}footer { color: var(--muted); font-size: 12px; margin: 40px 0 24px; }
@media print { .banner { -webkit-print-color-adjust: exact; print-color-adjust: exact; } }
</style>
</head>
<body>
<header class="banner {{.VerdictClass}}">
<div class="banner-inner">
<div class="verdict" role="status" aria-label="verdict {{.Verdict}}">{{.Verdict}}</div>
<div>
<h1>Soak run <b>{{.Profile}}</b> against <b>{{.Target}}</b></h1>
<p class="headline">{{.Headline}}</p>
<p class="meta"><span>started <b>{{.Start}}</b></span><span>ran <b>{{.Length}}</b></span>{{with .Phases}}<span>{{.}}</span>{{end}}{{with .ID}}<span>id {{.}}</span>{{end}}</p>
<p class="meta">{{range .Settings}}<span>{{.Key}} <b>{{.Value}}</b></span>{{end}}</p>
</div>
</div>
</header>
<main>
<section aria-labelledby="h-thresholds">
<h2 id="h-thresholds">Thresholds</h2>
{{if .Thresholds}}<table>
<thead><tr><th>threshold</th><th>limit</th><th>actual</th><th>result</th></tr></thead>
<tbody>
{{range .Thresholds}}<tr{{if not .Pass}} class="failed"{{end}}><td class="name">{{.Name}}</td><td>{{.Limit}}</td><td>{{.Actual}}</td><td><span class="pill {{if .Pass}}pass{{else}}fail{{end}}">{{.Result}}</span></td></tr>
{{end}}</tbody>
</table>{{else}}<p class="none">No thresholds were evaluated.</p>{{end}}
</section>
{{with .Saturation}}
<section aria-labelledby="h-saturation">
<h2 id="h-saturation">imcanary saturated</h2>
<p class="saturation-summary">{{.Summary}}</p>
{{if .Periods}}<table>
<thead><tr><th>from</th><th>to</th><th>phases</th><th>causes</th></tr></thead>
<tbody>
{{range .Periods}}<tr>{{range $i, $c := .}}{{if eq $i 0}}<td class="name">{{$c}}</td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody>
</table>{{else}}<p class="none">Saturated only between samples: no period was recorded.</p>{{end}}
</section>
{{end}}
<section aria-labelledby="h-summary">
<h2 id="h-summary">Summary</h2>
<div class="cards">
{{range .Cards}}<div class="card{{if .Bad}} bad{{end}}"><h3>{{.Title}}</h3><div class="big">{{.Big}}</div><div class="sub">{{.Sub}}</div>
<dl>{{range .Rows}}<dt>{{.Key}}</dt><dd>{{.Value}}</dd>{{else}}<dt>none</dt><dd></dd>{{end}}</dl></div>
{{end}}</div>
</section>
{{with .Drill}}
<section aria-labelledby="h-drill">
<h2 id="h-drill">Slow-reader drill</h2>
<p class="reaction">{{.Reaction}}</p>
<table class="kv"><tbody>
{{range .Rows}}<tr><td>{{.Key}}</td><td>{{.Value}}</td></tr>
{{end}}</tbody></table>
</section>
{{end}}
{{with .Storm}}<section aria-labelledby="h-storm">
<h2 id="h-storm">Reconnect storm</h2>
<p class="reaction">{{.Reaction}}</p>
<table class="kv"><tbody>
{{range .Rows}}<tr><td>{{.Key}}</td><td>{{.Value}}</td></tr>
{{end}}</tbody></table>
</section>
{{end}}<section aria-labelledby="h-charts">
<h2 id="h-charts">Over time</h2>
<div class="charts">
{{range .Charts}}{{template "chart" .}}{{end}}</div>
<p class="chart-note">{{if .Samples}}{{.SamplesText}} sample{{if ne .Samples 1}}s{{end}}. Dashed grey lines mark the start of each phase{{with .Abbreviated}} (too short to name in full: {{range $i, $a := .}}{{if $i}}, {{end}}{{$a}}{{end}}){{end}}. Latency is per sample interval; gaps mean nothing arrived.{{if .Shaded}} Shaded spans: imcanary itself was saturated.{{end}}{{else}}This run recorded no samples.{{end}}</p>
</section>
{{if .Comparisons}}
<section aria-labelledby="h-compare">
<h2 id="h-compare">Compared with earlier runs</h2>
{{range .Comparisons}}<p class="compare-title">{{.Title}}</p>
{{with .Settings}}<p class="compare-settings">{{.}}</p>
{{end}}{{if .Rows}}<table class="deltas">
<thead><tr><th>measure</th><th>was</th><th>now</th><th>change</th><th>relative</th><th></th></tr></thead>
<tbody>
{{range .Rows}}<tr{{if eq (index . 5) "worse"}} class="worse"{{end}}>{{range $i, $c := .}}{{if eq $i 0}}<td class="name">{{$c}}</td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody>
</table>
{{end}}{{end}}{{with .CompareChart}}<div class="charts compare">{{template "chart" .}}</div>
<p class="chart-note">Each compared run is drawn at this run's sample times, by time since its own start: each point is that run's latest sample up to then.</p>
{{end}}</section>
{{end}}
<section aria-labelledby="h-deliveries">
<h2 id="h-deliveries">Deliveries</h2>
{{if .Deliveries}}<table>
<thead><tr>{{range .DeliveryHeader}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range .Deliveries}}<tr>{{range $i, $c := .}}{{if eq $i 0}}<td class="name">{{$c}}</td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody>
</table>{{else}}<p class="none">No deliveries were recorded.</p>{{end}}
</section>

{{with .ConnectPath}}<section aria-labelledby="h-connect">
<h2 id="h-connect">Connect path</h2>
<table>
<thead><tr>{{range index . 0}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range $i, $r := .}}{{if $i}}<tr>{{range $j, $c := $r}}{{if eq $j 0}}<td class="name">{{$c}}</td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}{{end}}</tbody>
</table>
<p class="chart-note">{{$.ConnectNote}}</p>
</section>
{{end}}<div class="two">
<section aria-labelledby="h-latency">
<h2 id="h-latency">Latency</h2>
{{if .Latency}}<table>
<thead><tr><th>stage</th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr></thead>
<tbody>
{{range .Latency}}<tr>{{range $i, $c := .}}{{if eq $i 0}}<td class="name">{{$c}}</td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody>
</table>{{else}}<p class="none">No latencies were recorded.</p>{{end}}
</section>
<section aria-labelledby="h-rejected">
<h2 id="h-rejected">Rejected by the server</h2>
{{if .Rejected}}<table><tbody>
{{range .Rejected}}<tr><td class="name">{{.Key}}</td><td>{{.Value}}</td></tr>
{{end}}</tbody></table>{{else}}<p class="none">None.</p>{{end}}
</section>
</div>

<section aria-labelledby="h-errors">
<h2 id="h-errors">Top errors</h2>
{{if .Errors}}<table>
<thead><tr><th class="count">count</th><th>error</th></tr></thead>
<tbody>
{{range .Errors}}<tr><td class="count">{{.Key}}</td><td class="err">{{.Value}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="none">None.</p>{{end}}
</section>

{{if .Notes}}<section aria-labelledby="h-notes">
<h2 id="h-notes">Notes</h2>
<ul class="notes">
{{range .Notes}}<li>{{.}}</li>
{{end}}</ul>
</section>{{end}}

<footer>imcanary soak report{{with .ID}} {{.}}{{end}}. Times are UTC; latencies are rounded to two or three significant digits.</footer>
</main>
</body>
</html>
`

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
