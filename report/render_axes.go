package report

// The charts' axes: tick positions and labels for time, linear and
// logarithmic scales, and the formatting of the numbers on them.

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// renderAutoLogSpread is the ratio of the largest series' peak to the
// smallest one's above which AutoLog picks a log axis: at 20 the smaller
// line would use a twentieth of the plot's height, about 10 pixels.
const renderAutoLogSpread = 20

// renderSpread is the ratio of the highest series peak to the lowest
// positive one, or 0 when fewer than two series have a positive value.
func renderSpread(series []renderSeries, n int) float64 {
	lo, hi, count := math.Inf(1), 0.0, 0
	for _, s := range series {
		peak := 0.0
		for i, v := range s.Values {
			if i < n && v > peak && !math.IsInf(v, 0) {
				peak = v
			}
		}
		if peak > 0 {
			lo, hi, count = min(lo, peak), max(hi, peak), count+1
		}
	}
	if count < 2 {
		return 0
	}
	return hi / lo
}

// renderLast is the last finite value of the first n of values.
func renderLast(values []float64, n int) (float64, bool) {
	for i := min(n, len(values)) - 1; i >= 0; i-- {
		if v := values[i]; !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	}
	return 0, false
}

// renderTimeSteps are the x tick spacings a person counts in, seconds.
var renderTimeSteps = []float64{
	1, 2, 5, 10, 15, 30,
	60, 2 * 60, 5 * 60, 10 * 60, 15 * 60, 30 * 60,
	3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600,
}

// renderTimeTicks returns tick positions in seconds between lo and hi.
func renderTimeTicks(lo, hi float64) []float64 {
	span := hi - lo
	if !(span > 0) || math.IsInf(span, 0) {
		return nil
	}
	step := 0.0
	for _, s := range renderTimeSteps {
		if span/s <= renderMaxXTicks {
			step = s
			break
		}
	}
	if step == 0 { // longer than a week: whole days, 1-2-5 of them
		step = renderNiceStep(span/renderMaxXTicks, 86400)
	}
	var ticks []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9 && len(ticks) <= 4*renderMaxXTicks; t += step {
		if t == 0 {
			t = 0 // not -0, when the axis starts before the run
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// renderTickSpan labels an x tick: 0s, 30s, 1m, 1m30s, 2h.
func renderTickSpan(sec float64) string {
	if sec == 0 {
		return "0s"
	}
	if math.Abs(sec) > float64(math.MaxInt64)/float64(time.Second) {
		return renderSI(sec) + "s"
	}
	return renderSpan(time.Duration(math.Round(sec)) * time.Second)
}

// renderLinearTicks returns ticks from lo (or 0) past hi on a 1-2-5 step.
func renderLinearTicks(lo, hi float64, integer bool) ([]float64, float64) {
	step := renderNiceStep((hi-lo)/(renderMaxYTicks-1), 1)
	if integer && step < 1 {
		step = 1
	}
	if !(step > 0) || math.IsInf(step, 0) {
		return nil, 0
	}
	var ticks []float64
	start := math.Floor(lo/step) * step
	for i := 0; i <= 2*renderMaxYTicks; i++ {
		t := start + float64(i)*step
		if math.IsInf(t, 0) {
			break
		}
		ticks = append(ticks, t)
		if t >= hi {
			break
		}
	}
	return ticks, step
}

// renderNiceStep rounds raw up to 1, 2 or 5 times a power of ten, in units
// of unit.
func renderNiceStep(raw, unit float64) float64 {
	raw /= unit
	if !(raw > 0) || math.IsInf(raw, 0) {
		return unit
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag*(1+1e-9) {
			return m * mag * unit
		}
	}
	return 10 * mag * unit
}

// renderLogTicks returns tick values for decades dlo..dhi: every decade,
// with 2 and 5 between them when the axis spans only one or two, and every
// other decade or fewer when it spans many.
func renderLogTicks(dlo, dhi float64) []float64 {
	var ticks []float64
	span := dhi - dlo
	every := math.Max(1, math.Ceil(span/(renderMaxYTicks-1)))
	for d := dlo; d <= dhi && len(ticks) < 64; d += every {
		v := math.Pow(10, d)
		ticks = append(ticks, v)
		if span <= 2 && d < dhi {
			ticks = append(ticks, 2*v, 5*v)
		}
	}
	return ticks
}

// renderTickLatency labels a latency tick given in seconds. Ticks are
// decades, so one unit each is enough: 1ms, 100ms, 10s, 17m, 3h, 12d, 292y.
func renderTickLatency(sec float64) string {
	switch {
	case math.IsNaN(sec) || math.IsInf(sec, 0):
		return "-"
	case sec < 60:
		return renderLatency(time.Duration(sec * float64(time.Second)))
	case sec < 3600:
		return renderSig3(math.Round(sec/60)) + "m"
	case sec < 2*86400:
		return renderSig3(math.Round(sec/3600)) + "h"
	case sec < 365*86400:
		return renderSig3(math.Round(sec/86400)) + "d"
	}
	return renderSI(sec/(365.25*86400)) + "y"
}

// renderSI labels a count or rate with three significant digits: 0, 0.5,
// 12, 250, 1.5k, 2M.
func renderSI(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	a := math.Abs(v)
	if a >= 1e15 {
		return strings.Replace(strconv.FormatFloat(v, 'g', 3, 64), "e+", "e", 1)
	}
	for _, u := range []struct {
		div  float64
		name string
	}{{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if a >= u.div {
			return renderSig3(v/u.div) + u.name
		}
	}
	return renderSig3(v)
}

// renderSig3 prints v with at most three significant digits and never in
// exponent form (999.9 rounds to 1000, not 1e+03).
func renderSig3(v float64) string {
	s := strconv.FormatFloat(v, 'g', 3, 64)
	if strings.ContainsAny(s, "eE") {
		s = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return s
}

// renderCoord formats an SVG coordinate. Non-finite values, which no
// caller should produce, become 0 rather than NaN in an attribute.
func renderCoord(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		v = 0
	}
	v = renderClamp(v, -1e6, 1e6)
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

func renderClamp(v, lo, hi float64) float64 {
	if math.IsNaN(v) {
		return lo
	}
	return math.Min(math.Max(v, lo), hi)
}

func renderFinite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
