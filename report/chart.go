package report

import (
	"bytes"
	"html/template"
	"math"
)

// Chart is a line chart over time for a page other than a report (the
// daemon's status page), drawn by the same code and markup as the
// report's charts, so that the two read alike and share their escaping.
type Chart struct {
	// ID must be unique in the page: the SVG's title and description
	// are referred to by it.
	ID, Title, Desc string
	XLabel, YLabel  string
	// X is each sample's place on the time axis, in seconds (negative
	// for the past, as "seconds from now"); every series has a value per
	// sample, NaN for none.
	X      []float64
	Series []ChartSeries
	// Refs are horizontal reference lines: a limit, an objective.
	Refs []ChartRef
	// Log draws the y axis in decades (values at or below zero are
	// gaps); Integer keeps a linear axis's ticks whole.
	Log, Integer bool
	// YFormat labels a y tick; nil prints SI-prefixed numbers.
	YFormat func(float64) string
}

// ChartSeries is one line of a Chart.
type ChartSeries struct {
	Name, Color, Dash string
	Values            []float64
}

// ChartRef is a reference line of a Chart.
type ChartRef struct {
	Label, Color string
	Value        float64
}

// The reports' colours, for charts drawn beside them.
const (
	ColorBlue   = renderColorBlue
	ColorGreen  = renderColorGreen
	ColorOrange = renderColorOrange
	ColorPurple = renderColorPurple
	ColorRed    = renderColorFail
	ColorMuted  = renderColorMuted
)

// FormatLatencyTick labels a latency axis in seconds as the reports do
// ("1ms", "250ms", "2s").
func FormatLatencyTick(sec float64) string { return renderTickLatency(sec) }

// RenderChart draws c as a <figure> holding an inline SVG, ready to be put
// in an html/template page as it is.
func RenderChart(c Chart) (template.HTML, error) {
	tl := renderTimeline{X: c.X}
	for i, x := range c.X {
		if i == 0 || x < tl.Min {
			tl.Min = x
		}
		if i == 0 || x > tl.Max {
			tl.Max = x
		}
	}
	if !(tl.Max-tl.Min >= 1) || math.IsInf(tl.Max-tl.Min, 0) {
		tl.Max = tl.Min + 1
	}
	spec := renderChartSpec{
		ID: c.ID, Title: c.Title, Desc: c.Desc, XLabel: c.XLabel, YLabel: c.YLabel,
		Log: c.Log, Integer: c.Integer, YFormat: c.YFormat,
	}
	for _, s := range c.Series {
		spec.Series = append(spec.Series, renderSeries{Name: s.Name, Color: s.Color, Dash: s.Dash, Values: s.Values})
	}
	for _, r := range c.Refs {
		spec.Refs = append(spec.Refs, renderRefSpec{Label: r.Label, Color: r.Color, Value: r.Value})
	}
	var b bytes.Buffer
	if err := renderPage.ExecuteTemplate(&b, "chart", renderBuildChart(spec, tl)); err != nil {
		return "", err
	}
	// The template escaped every value it wrote: the result is safe HTML.
	return template.HTML(b.String()), nil
}
