package soak

// Saturation: when imcanary's own self-monitor says its numbers are
// suspect. A run that misses a threshold while the prober was saturated is
// inconclusive, since the miss may be the prober's own.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// markSaturated records that the prober was saturated in the sample
// interval from..now, for causes. It runs with s.mu held.
func (s *sampler) markSaturated(from, now time.Time, causes []string) {
	// A long run sampled often could make a period per sample: past
	// maxSamples the last one grows instead.
	if (s.satOpen || len(s.periods) >= maxSamples) && len(s.periods) > 0 {
		last := &s.periods[len(s.periods)-1]
		last.End = now
		last.Causes = mergeCauses(last.Causes, causes)
		s.satOpen = true
		return
	}
	s.periods = append(s.periods, report.SaturatedPeriod{Start: from, End: now, Causes: mergeCauses(nil, causes)})
	s.satOpen = true
}

// mergeCauses returns the sorted union of a and b, never nil, so that a
// period without a named cause shows as [] rather than null.
func mergeCauses(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}

// saturation returns the run's saturation section: the periods sampled,
// the saturated share of the send and drain phases (rep.Phases and rep.End
// must be set), and deliveries, the delivery latency samples recorded
// while saturated. It is nil when the prober was never seen saturated.
func (s *sampler) saturation(rep *report.Soak, deliveries int64) *report.Saturation {
	s.mu.Lock()
	periods := slices.Clone(s.periods)
	sendStart := s.sendStart
	s.mu.Unlock()
	if len(periods) == 0 && deliveries == 0 {
		return nil
	}
	sat := &report.Saturation{Periods: periods, DeliverySamples: deliveries}
	if sat.Periods == nil {
		sat.Periods = []report.SaturatedPeriod{}
	}
	if !sendStart.IsZero() && rep.End.After(sendStart) {
		var in time.Duration
		for _, p := range periods {
			lo, hi := p.Start, p.End
			if lo.Before(sendStart) {
				lo = sendStart
			}
			if hi.After(rep.End) {
				hi = rep.End
			}
			if hi.After(lo) {
				in += hi.Sub(lo)
			}
		}
		sat.SendDrainRatio = float64(in) / float64(rep.End.Sub(sendStart))
	}
	return sat
}

// saturationNoteShown is how many periods the note names; the report's
// saturation section lists them all.
const saturationNoteShown = 3

// saturationWhere says when the prober was saturated, as offsets into the
// run with the phases they fall in: "1.2s–2s into the run (send)".
func saturationWhere(rep *report.Soak) string {
	s := rep.Saturation
	if len(s.Periods) == 0 {
		return "between samples, so no period was recorded"
	}
	var parts []string
	for i, p := range s.Periods {
		if i == saturationNoteShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(s.Periods)-i))
			break
		}
		parts = append(parts, saturationSpan(rep, p))
	}
	return strings.Join(parts, ", ")
}

// saturationSpan prints one period as offsets into the run with the phases
// it overlaps.
func saturationSpan(rep *report.Soak, p report.SaturatedPeriod) string {
	span := report.FormatLatency(p.Start.Sub(rep.Start)) + "–" + report.FormatLatency(p.End.Sub(rep.Start)) + " into the run"
	if rep.Start.IsZero() || p.Start.IsZero() || p.End.IsZero() {
		span = report.FormatTime(p.Start) + " to " + report.FormatTime(p.End)
	}
	if ph := rep.PhasesDuring(p.Start, p.End); len(ph) > 0 {
		span += " (" + strings.Join(ph, ", ") + ")"
	}
	return span
}

// judged reports whether s says the prober was saturated during the part
// of the run the thresholds judge, the send and drain phases: in a
// sampled period, or when a delivery was recorded (deliveries come only
// once sending has begun).
func judged(s *report.Saturation) bool {
	return s != nil && (s.SendDrainRatio > 0 || s.DeliverySamples > 0)
}

// saturationNote explains what the prober's saturation means for the
// verdict: why a run is inconclusive, or what a pass despite it is worth.
// It is "" for a run that was never saturated.
func saturationNote(rep *report.Soak) string {
	s := rep.Saturation
	if s == nil {
		return ""
	}
	why := "causes it did not name"
	if c := s.Causes(); len(c) > 0 {
		why = strings.Join(c, ", ")
	}
	share := report.FormatPercent(s.SendDrainRatio) + " of the send and drain phases"
	where := saturationWhere(rep)
	samples := report.FormatCount(s.DeliverySamples) + " delivery latency sample" + plural(s.DeliverySamples)
	switch rep.Result {
	case metrics.ResultInconclusive:
		var failed []string
		for _, t := range rep.Thresholds {
			if !t.Pass {
				failed = append(failed, t.Name)
			}
		}
		return fmt.Sprintf("Inconclusive: %s failed while imcanary itself was saturated for %s, %s, because of %s; "+
			"%s were recorded while it was. The failure may be imcanary's own rather than the server's, "+
			"so the run neither passes nor fails: give the prober more CPU, or lower the users or the rate, and run it again.",
			strings.Join(failed, ", "), share, where, why, samples)
	case metrics.ResultPass:
		return fmt.Sprintf("imcanary was saturated for %s, %s, because of %s, and the run passed all the same: "+
			"its own delays only add latency and loss, but a sender that fell behind offered the server less load than the profile asks. "+
			"%s were recorded while it was saturated.", share, where, why, samples)
	case metrics.ResultFail:
		return fmt.Sprintf("imcanary was saturated only outside the send and drain phases, %s, because of %s: "+
			"the numbers the thresholds judge were not affected.", where, why)
	}
	return fmt.Sprintf("imcanary was saturated for %s, %s, because of %s; %s were recorded while it was.", share, where, why, samples)
}
