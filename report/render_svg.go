package report

// Charts for the HTML report, drawn as inline SVG so that the page needs
// nothing but itself. This file only computes geometry: every coordinate
// and label becomes a string here, and html/template writes (and escapes)
// the elements, so no value from a report reaches the page unescaped and
// no NaN or Inf reaches an attribute.

import (
	"cmp"
	"math"
	"strings"
	"time"
)

// Chart size in SVG user units. The page shows two charts side by side at
// about this size in pixels, so 11px labels stay 11px on a laptop screen.
const (
	renderChartW      = 560
	renderChartH      = 300
	renderPlotLeft    = 64
	renderPlotRight   = 16
	renderPlotTop     = 36
	renderPlotBottom  = 44
	renderCharWidth   = 6.6 // average glyph advance of the 12px legend font
	renderMaxXTicks   = 8   // labels such as "1m30s" need ~60 units each
	renderMaxYTicks   = 6
	renderMaxSegments = 10000 // a guard: one sample interval is seconds, runs are hours
)

// renderChart is one chart, ready for the template.
type renderChart struct {
	ID, Title, Desc string
	W, H            int
	// Plot area edges, as text for attributes.
	Left, Top, Right, Bottom, PlotW, PlotH string
	XTicks, YTicks                         []renderTick
	XLabel, YLabel                         string
	YLabelX, YLabelY                       string
	Phases                                 []renderMark
	Refs                                   []renderRef
	Lines                                  []renderLine
	Dots                                   []renderDot
	// Bands shade the spans in which the prober was saturated.
	Bands  []renderBand
	Legend []renderLegendItem
	// Empty is the message shown instead of data when there is none.
	Empty          string
	EmptyX, EmptyY string
	// Abbreviated lists the phase labels shortened for want of room,
	// "d drain".
	Abbreviated []string
}

type renderTick struct{ Pos, Label string }

// renderMark is a phase boundary: a vertical dashed line, its label and
// the label's text-anchor ("start" right of the line, "end" left of it),
// and a tooltip with the phase's full name and span.
type renderMark struct{ X, LabelX, LabelY, Label, Anchor, Title string }

// renderRef is a horizontal reference line (a limit, the configured user
// count) with its label at the right end.
type renderRef struct{ Y, LabelX, LabelY, Label, Color string }

type renderLine struct{ Name, Color, Dash, Points string }

type renderDot struct{ X, Y, Color string }

// renderBand is a shaded span of the plot: x and width, and its tooltip.
type renderBand struct{ X, W, Title string }

// renderBandSpec is a span to shade, in seconds since the start.
type renderBandSpec struct {
	From, To float64
	Title    string
}

type renderLegendItem struct {
	X1, X2, Y, TextX, TextY string
	Name, Color, Dash       string
}

// renderSeries is one line: a value per sample, NaN where there is none.
type renderSeries struct {
	Name, Color, Dash string
	Values            []float64
}

// renderChartSpec says what to draw; renderBuildChart says where.
type renderChartSpec struct {
	ID, Title, Desc string
	YLabel          string
	// XLabel names the time axis; "" is "time since start".
	XLabel string
	// Log draws the y axis in decades; values at or below zero are gaps.
	Log bool
	// AutoLog switches to Log when the series differ in size so much
	// that the smallest would lie flat on a linear axis (five
	// disconnects next to thousands of late deliveries).
	AutoLog bool
	// Final adds each series' last value to its legend entry.
	Final bool
	// Integer keeps the y ticks on whole numbers (counts).
	Integer bool
	// Sparse joins each series' values across the NaNs between them,
	// for series that have a value at some x of the axis only.
	Sparse bool
	// YFormat labels a y tick.
	YFormat func(float64) string
	Series  []renderSeries
	Refs    []renderRefSpec
}

type renderRefSpec struct {
	Label, Color string
	Value        float64
}

// renderTimeline is the x axis shared by every chart of a report: seconds
// since the start of the run for each sample and for each phase start.
type renderTimeline struct {
	X          []float64
	Min, Max   float64
	PhaseNames []string
	PhaseX     []float64
	// PhaseTitles describe each phase for its tooltip: name and span.
	PhaseTitles []string
	// Bands are the saturated periods on the same axis.
	Bands []renderBandSpec
	// XFormat, if set, makes the x axis a linear one of values, not of
	// time, and labels its ticks: a search's varied value.
	XFormat func(float64) string
}

func renderNewTimeline(r *Soak) renderTimeline {
	var tl renderTimeline
	origin := r.Start
	if origin.IsZero() && len(r.Samples) > 0 {
		origin = r.Samples[0].T
	}
	since := func(t time.Time) float64 {
		if t.IsZero() || origin.IsZero() {
			return 0
		}
		return renderFinite(t.Sub(origin).Seconds())
	}
	tl.X = make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		tl.X[i] = since(s.T)
		tl.Min = min(tl.Min, tl.X[i])
		tl.Max = max(tl.Max, tl.X[i])
	}
	for i, p := range r.Phases {
		if p.Start.IsZero() {
			continue
		}
		x := since(p.Start)
		tl.PhaseNames = append(tl.PhaseNames, p.Name)
		tl.PhaseX = append(tl.PhaseX, x)
		title := p.Name + " from " + renderTickSpan(math.Round(x))
		end := r.End
		if i+1 < len(r.Phases) {
			end = r.Phases[i+1].Start
		}
		if !end.IsZero() && !end.Before(p.Start) {
			title += ", for " + renderSpan(end.Sub(p.Start))
		}
		tl.PhaseTitles = append(tl.PhaseTitles, title)
		tl.Min = min(tl.Min, x)
		tl.Max = max(tl.Max, x)
	}
	if !r.End.IsZero() && r.End.After(origin) {
		tl.Max = max(tl.Max, since(r.End))
	}
	if s := r.Saturation; s != nil {
		for _, p := range s.Periods {
			if p.Start.IsZero() || p.End.IsZero() {
				continue
			}
			title := "imcanary saturated"
			if len(p.Causes) > 0 {
				title += ": " + strings.Join(p.Causes, ", ")
			}
			tl.Bands = append(tl.Bands, renderBandSpec{From: since(p.Start), To: since(p.End), Title: title})
		}
	}
	// A run of one sample at its start still gets an axis a second wide.
	if tl.Max-tl.Min < 1 {
		tl.Max = tl.Min + 1
	}
	return tl
}

// renderBuildChart lays out one chart on the timeline.
func renderBuildChart(spec renderChartSpec, tl renderTimeline) renderChart {
	left, top := float64(renderPlotLeft), float64(renderPlotTop)
	right := float64(renderChartW - renderPlotRight)
	bottom := float64(renderChartH - renderPlotBottom)
	l := &renderChartLayout{spec: spec, tl: tl, left: left, top: top, right: right, bottom: bottom}
	l.c = renderChart{
		ID: spec.ID, Title: spec.Title, Desc: spec.Desc,
		W: renderChartW, H: renderChartH,
		Left: renderCoord(left), Top: renderCoord(top),
		Right: renderCoord(right), Bottom: renderCoord(bottom),
		PlotW: renderCoord(right - left), PlotH: renderCoord(bottom - top),
		XLabel: cmp.Or(spec.XLabel, "time since start"), YLabel: spec.YLabel,
		YLabelX: renderCoord(16), YLabelY: renderCoord((top + bottom) / 2),
	}

	l.xScale = func(x float64) float64 {
		return left + (x-tl.Min)/(tl.Max-tl.Min)*(right-left)
	}
	l.xAxis()
	if l.spec.AutoLog && !l.spec.Log && renderSpread(l.spec.Series, len(l.tl.X)) >= renderAutoLogSpread {
		l.spec.Log = true
		l.c.YLabel += " (log)"
	}

	yTicks, hasData := l.yDomain()
	l.format = l.spec.YFormat
	if l.format == nil {
		l.format = renderSI
	}
	for _, v := range yTicks {
		l.c.YTicks = append(l.c.YTicks, renderTick{Pos: renderCoord(l.yScale(v)), Label: l.format(v)})
	}
	l.phases(l.refs())
	if !hasData {
		l.empty()
	}
	l.series()
	l.legend()
	return l.c
}

// renderChartLayout is one chart being laid out: its plot's bounds, its
// scales and what it has so far.
type renderChartLayout struct {
	spec                     renderChartSpec
	tl                       renderTimeline
	left, top, right, bottom float64
	xScale, yScale           func(float64) float64
	format                   func(float64) string
	c                        renderChart
}

// xAxis sets the time ticks and the shaded bands.
func (l *renderChartLayout) xAxis() {
	if l.tl.XFormat != nil {
		ticks, _ := renderLinearTicks(l.tl.Min, l.tl.Max, false)
		for _, t := range ticks {
			if t >= l.tl.Min && t <= l.tl.Max {
				l.c.XTicks = append(l.c.XTicks, renderTick{Pos: renderCoord(l.xScale(t)), Label: l.tl.XFormat(t)})
			}
		}
	} else {
		for _, t := range renderTimeTicks(l.tl.Min, l.tl.Max) {
			l.c.XTicks = append(l.c.XTicks, renderTick{Pos: renderCoord(l.xScale(t)), Label: renderTickSpan(t)})
		}
	}
	for _, b := range l.tl.Bands {
		x1 := renderClamp(l.xScale(b.From), l.left, l.right)
		x2 := renderClamp(l.xScale(b.To), l.left, l.right)
		if x2-x1 < 1 {
			if x1 >= l.right || x2 <= l.left || b.To < b.From {
				continue
			}
			// A span narrower than a unit still shows.
			x2 = min(x1+1, l.right)
			x1 = x2 - 1
		}
		if len(l.c.Bands) < renderMaxSegments {
			l.c.Bands = append(l.c.Bands, renderBand{X: renderCoord(x1), W: renderCoord(x2 - x1), Title: b.Title})
		}
	}
}

// yDomain sets the y scale over every value and reference line, and
// returns its ticks and whether any value is plotted.
func (l *renderChartLayout) yDomain() (yTicks []float64, hasData bool) {
	// The y domain covers every value and reference line.
	lo, hi := math.Inf(1), math.Inf(-1)
	seen := false
	consider := func(v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) || (l.spec.Log && v <= 0) {
			return
		}
		lo, hi, seen = min(lo, v), max(hi, v), true
	}
	for _, s := range l.spec.Series {
		for i, v := range s.Values {
			if i < len(l.tl.X) {
				consider(v)
			}
		}
	}
	hasData = seen
	for _, ref := range l.spec.Refs {
		consider(ref.Value)
	}

	if l.spec.Log {
		var dlo, dhi float64 // decades
		if seen {
			dlo, dhi = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		} else {
			dlo, dhi = -3, 0 // 1ms to 1s: where delivery latencies live
		}
		if dhi <= dlo {
			dhi = dlo + 1
		}
		yTicks = renderLogTicks(dlo, dhi)
		l.yScale = func(v float64) float64 {
			return l.bottom - (math.Log10(v)-dlo)/(dhi-dlo)*(l.bottom-l.top)
		}
	} else {
		if !seen {
			lo, hi = 0, 1
		}
		lo = min(lo, 0)
		if hi <= lo {
			hi = lo + 1
		}
		var step float64
		yTicks, step = renderLinearTicks(lo, hi, l.spec.Integer)
		if n := len(yTicks); n > 0 && step > 0 {
			hi = max(hi, yTicks[n-1])
			lo = min(lo, yTicks[0])
		}
		if !(hi > lo) || math.IsInf(hi-lo, 0) {
			hi, lo = 1, 0
		}
		l.yScale = func(v float64) float64 {
			return l.bottom - (v-lo)/(hi-lo)*(l.bottom-l.top)
		}
	}
	return yTicks, hasData
}

// refs draws the reference lines and returns their labels' boxes.
func (l *renderChartLayout) refs() []renderBox {
	var refBoxes []renderBox
	for _, ref := range l.spec.Refs {
		if math.IsNaN(ref.Value) || math.IsInf(ref.Value, 0) || (l.spec.Log && ref.Value <= 0) {
			continue
		}
		y := renderClamp(l.yScale(ref.Value), l.top, l.bottom)
		l.c.Refs = append(l.c.Refs, renderRef{
			Y: renderCoord(y), LabelX: renderCoord(l.right - 4), LabelY: renderCoord(y - 4),
			Label: ref.Label, Color: ref.Color,
		})
		// The reference's label, l.right-aligned above its line, is
		// space the phase labels keep clear of.
		refBoxes = append(refBoxes, renderBox{X0: l.right - 4 - renderPhaseWidth(ref.Label), X1: l.right - 4,
			Y0: y - 4 - renderPhaseAscent, Y1: y - 4 + renderPhaseDescent})
	}

	return refBoxes
}

// phases marks the phases and lays their labels out around the
// references' (refBoxes).
func (l *renderChartLayout) phases(refBoxes []renderBox) {
	marks := make([]float64, len(l.tl.PhaseX))
	for i, x := range l.tl.PhaseX {
		marks[i] = l.xScale(x)
	}
	for i, lab := range renderPhaseLabels(l.tl.PhaseNames, marks, l.left, l.right, l.top, refBoxes) {
		anchor := "start"
		if lab.Left {
			anchor = "end"
		}
		l.c.Phases = append(l.c.Phases, renderMark{
			X: renderCoord(marks[i]), LabelX: renderCoord(lab.X), LabelY: renderCoord(renderPhaseBaseline(l.top, lab.Row)),
			Label: lab.Text, Anchor: anchor, Title: l.tl.PhaseTitles[i],
		})
		if lab.Short {
			l.c.Abbreviated = append(l.c.Abbreviated, renderPhaseAbbrev(l.tl.PhaseNames[i])+" "+l.tl.PhaseNames[i])
		}
	}
}

// empty says why nothing is plotted.
func (l *renderChartLayout) empty() {
	l.c.Empty = "no samples"
	if len(l.tl.X) > 0 {
		l.c.Empty = "no data"
	}
	l.c.EmptyX, l.c.EmptyY = renderCoord((l.left+l.right)/2), renderCoord((l.top+l.bottom)/2)
}

// series draws each series as lines between its defined values, a dot
// for a value alone.
func (l *renderChartLayout) series() {
	for _, s := range l.spec.Series {
		var seg []string
		var segX, segY float64
		flush := func() {
			switch {
			case len(seg) == 1:
				l.c.Dots = append(l.c.Dots, renderDot{X: renderCoord(segX), Y: renderCoord(segY), Color: s.Color})
			case len(seg) > 1 && len(l.c.Lines) < renderMaxSegments:
				l.c.Lines = append(l.c.Lines, renderLine{Name: s.Name, Color: s.Color, Dash: s.Dash, Points: strings.Join(seg, " ")})
			}
			seg = seg[:0]
		}
		for i, v := range s.Values {
			if i >= len(l.tl.X) {
				break
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || (l.spec.Log && v <= 0) {
				if !l.spec.Sparse || !math.IsNaN(v) {
					flush()
				}
				continue
			}
			segX = renderClamp(l.xScale(l.tl.X[i]), l.left, l.right)
			segY = renderClamp(l.yScale(v), l.top, l.bottom)
			seg = append(seg, renderCoord(segX)+","+renderCoord(segY))
		}
		flush()
	}

}

// legend runs along the top, above the plot.
func (l *renderChartLayout) legend() {
	// The legend runs along the l.top, above the plot.
	x := l.left
	for _, s := range l.spec.Series {
		name := s.Name
		if l.spec.Final {
			if v, ok := renderLast(s.Values, len(l.tl.X)); ok {
				name += " " + l.format(v)
				if v == math.Trunc(v) && math.Abs(v) < 1e15 {
					name = s.Name + " " + renderCount(int64(v))
				}
			}
		}
		l.c.Legend = append(l.c.Legend, renderLegendItem{
			X1: renderCoord(x), X2: renderCoord(x + 18), Y: renderCoord(16),
			TextX: renderCoord(x + 23), TextY: renderCoord(20),
			Name: name, Color: s.Color, Dash: s.Dash,
		})
		x += 23 + float64(len([]rune(name)))*renderCharWidth + 16
	}
}

// Phase labels: 11px semibold text, of which renderPhaseCharW is a
// generous advance per character, since a label estimated too narrow
// would overlap or be clipped: DejaVu Sans, the widest of the page's
// fonts, measures 6.5 ("drain") to 8.1 ("ramp") in Chromium. Rows are
// stacked renderPhaseRowH apart below the top edge of the plot.
const (
	renderPhaseCharW = 8.2
	renderPhasePad   = 4 // between a mark and its label
	renderPhaseGap   = 6 // between two labels on a row
	renderPhaseRowH  = 13
	// Three phases need three rows at most; a reference line's label at
	// the right may take two more.
	renderPhaseRows = 6
	// The text's extent above and below its baseline, and the first
	// row's baseline below the plot's top edge.
	renderPhaseAscent   = 10
	renderPhaseDescent  = 3
	renderPhaseFirstRow = 12
	// renderPhaseArrow ends a label drawn left of its mark, pointing at
	// the line where the phase begins.
	renderPhaseArrow = " →"
)

// renderPhaseBaseline is the y of row's baseline in a plot whose top edge
// is at top.
func renderPhaseBaseline(top float64, row int) float64 {
	return top + renderPhaseFirstRow + float64(row)*renderPhaseRowH
}

// renderBox is a rectangle of the chart that phase labels keep clear of
// (a reference line's label): x from X0 to X1, y from Y0 to Y1, in chart
// units.
type renderBox struct{ X0, X1, Y0, Y1 float64 }

// renderPhaseLabel is where one phase label goes: its text, the x of its
// anchor, its row (0 the top), whether it sits left of its mark (anchored
// at its end, with an arrow) and whether it was shortened.
type renderPhaseLabel struct {
	Text        string
	X           float64
	Row         int
	Left, Short bool
}

// renderPhaseWidth estimates the width of a phase label.
func renderPhaseWidth(text string) float64 {
	return float64(len([]rune(text))) * renderPhaseCharW
}

// renderPhaseAbbrev is the defined short form of a phase name, used when
// the full name has no room: its first letter (r, s, d). The mark's
// tooltip and the note under the charts give the full name.
func renderPhaseAbbrev(name string) string {
	for _, r := range name {
		return string(r)
	}
	return name
}

// renderPhaseLabels lays out the labels of phase marks at xs, in a plot
// from left to right whose top edge is at top (chart units), so that each
// one is readable whatever the phases' lengths: never past the plot's
// edges, never over another label or any box in avoid. A label goes, in
// order of preference, right of its mark and before the next one; left of
// its mark with an arrow pointing at it (a short last phase at the right
// edge); the same on a lower row, where it may cross other marks; and
// only then abbreviated, in the same order. A label that fits nowhere
// (more phases crowded together than there are rows) is abbreviated on
// the top row, inside the plot.
func renderPhaseLabels(names []string, xs []float64, left, right, top float64, avoid []renderBox) []renderPhaseLabel {
	type span struct{ lo, hi float64 }
	taken := make([][]span, renderPhaseRows)
	for row := range taken {
		base := renderPhaseBaseline(top, row)
		for _, b := range avoid {
			if b.Y0 < base+renderPhaseDescent && base-renderPhaseAscent < b.Y1 {
				taken[row] = append(taken[row], span{b.X0, b.X1})
			}
		}
	}
	free := func(row int, lo, hi float64) bool {
		if lo < left || hi > right {
			return false
		}
		for _, s := range taken[row] {
			if lo < s.hi+renderPhaseGap && s.lo < hi+renderPhaseGap {
				return false
			}
		}
		return true
	}
	out := make([]renderPhaseLabel, len(names))
	for i, name := range names {
		x := xs[i]
		// The next mark is the nearest one to the right, a label's
		// padding before it; marks at the same x (a phase of no length)
		// do not bound each other.
		next := right
		for j, xj := range xs {
			if j != i && xj > x && xj-renderPhasePad < next {
				next = xj - renderPhasePad
			}
		}
		place := func(text string, short bool) bool {
			for row := range renderPhaseRows {
				limit := right
				if row == 0 {
					limit = next
				}
				if lo, hi := x+renderPhasePad, x+renderPhasePad+renderPhaseWidth(text); hi <= limit && free(row, lo, hi) {
					taken[row] = append(taken[row], span{lo, hi})
					out[i] = renderPhaseLabel{Text: text, X: lo, Row: row, Short: short}
					return true
				}
				lt := text + renderPhaseArrow
				if lo, hi := x-renderPhasePad-renderPhaseWidth(lt), x-renderPhasePad; free(row, lo, hi) {
					taken[row] = append(taken[row], span{lo, hi})
					out[i] = renderPhaseLabel{Text: lt, X: hi, Row: row, Left: true, Short: short}
					return true
				}
			}
			return false
		}
		if place(name, false) || place(renderPhaseAbbrev(name), true) {
			continue
		}
		ab := renderPhaseAbbrev(name)
		lo := renderClamp(x+renderPhasePad, left, max(left, right-renderPhaseWidth(ab)))
		taken[0] = append(taken[0], span{lo, lo + renderPhaseWidth(ab)})
		out[i] = renderPhaseLabel{Text: ab, X: lo, Short: true}
	}
	return out
}

// renderCharts builds the four charts of a report from its samples.
func renderCharts(r *Soak) []renderChart {
	tl := renderNewTimeline(r)
	n := len(r.Samples)
	series := func(f func(Sample) float64) []float64 {
		v := make([]float64, n)
		for i, s := range r.Samples {
			v[i] = f(s)
		}
		return v
	}
	// A latency of zero means nothing arrived in the interval: a gap,
	// not a point at the bottom of a log axis.
	latency := func(f func(Sample) time.Duration) []float64 {
		return series(func(s Sample) float64 {
			d := f(s)
			if d <= 0 {
				return math.NaN()
			}
			return d.Seconds()
		})
	}
	seconds := renderTickLatency

	var latencyRefs []renderRefSpec
	if d := r.Profile.Thresholds.P99Delivery; d > 0 {
		latencyRefs = append(latencyRefs, renderRefSpec{Label: "p99 limit " + renderLatency(d), Color: renderColorFail, Value: d.Seconds()})
	}
	users := r.Users.Configured
	if users == 0 {
		users = r.Profile.Users
	}
	var onlineRefs []renderRefSpec
	if users > 0 {
		onlineRefs = append(onlineRefs, renderRefSpec{Label: "configured " + renderCount(int64(users)), Color: renderColorMuted, Value: float64(users)})
	}
	problems := []renderSeries{
		{Name: "lost", Color: renderColorFail, Values: series(func(s Sample) float64 { return float64(s.Lost) })},
		{Name: "late", Color: renderColorOrange, Dash: "5 3", Values: series(func(s Sample) float64 { return float64(s.Late) })},
		{Name: "disconnects", Color: renderColorPurple, Dash: "2 2", Values: series(func(s Sample) float64 { return float64(s.Disconnects) })},
	}
	problemsDesc := "Cumulative counts since the start of the run of lost deliveries, late deliveries and disconnects."
	if r.Drill != nil {
		// The drill's disconnects beside the normal users': the two
		// must not read as one.
		problems = append(problems, renderSeries{Name: "slow disconnects", Color: renderColorBlue, Dash: "1 3",
			Values: series(func(s Sample) float64 { return float64(s.SlowReaderDisconnects) })})
		problemsDesc = "Cumulative counts since the start of the run of the normal users' lost deliveries, late deliveries and disconnects, and of the slow readers' disconnects."
	}

	return []renderChart{
		renderBuildChart(renderChartSpec{
			ID: "chart-latency", Title: "Delivery latency over time",
			Desc:   "Delivery latency per sample interval, p50, p99 and max, on a logarithmic axis.",
			YLabel: "delivery latency (log)", Log: true, YFormat: seconds,
			Series: []renderSeries{
				{Name: "p50", Color: renderColorBlue, Values: latency(func(s Sample) time.Duration { return s.P50 })},
				{Name: "p99", Color: renderColorOrange, Values: latency(func(s Sample) time.Duration { return s.P99 })},
				{Name: "max", Color: renderColorPurple, Dash: "4 3", Values: latency(func(s Sample) time.Duration { return s.Max })},
			},
			Refs: latencyRefs,
		}, tl),
		renderBuildChart(renderChartSpec{
			ID: "chart-throughput", Title: "Messages sent and delivered per second",
			Desc:   "Messages sent per second and deliveries per second in each sample interval.",
			YLabel: "messages per second",
			Series: []renderSeries{
				{Name: "sent/s", Color: renderColorBlue, Values: series(func(s Sample) float64 { return s.SentPerSec })},
				{Name: "delivered/s", Color: renderColorGreen, Dash: "5 3", Values: series(func(s Sample) float64 { return s.DelivPerSec })},
			},
		}, tl),
		renderBuildChart(renderChartSpec{
			ID: "chart-online", Title: "Sessions online",
			Desc:   "Sessions of the cohort online at each sample, with the configured user count as a reference line.",
			YLabel: "sessions", Integer: true,
			Series: []renderSeries{
				{Name: "online", Color: renderColorBlue, Values: series(func(s Sample) float64 { return float64(s.Online) })},
			},
			Refs: onlineRefs,
		}, tl),
		renderBuildChart(renderChartSpec{
			ID: "chart-problems", Title: "Lost, late and disconnects (cumulative)",
			Desc:   problemsDesc,
			YLabel: "count (cumulative)", Integer: true, AutoLog: true, Final: true,
			Series: problems,
		}, tl),
	}
}

// Colours: GitHub's Primer palette, chosen for contrast on white and for
// telling lines apart with common colour-vision deficiencies (lines also
// differ in dash pattern).
const (
	renderColorBlue   = "#0969da"
	renderColorGreen  = "#1a7f37"
	renderColorOrange = "#bc4c00"
	renderColorPurple = "#8250df"
	renderColorFail   = "#cf222e"
	renderColorMuted  = "#6e7781"
)
