package soak

// The slow-reader drill: a fraction of the users read deliberately slowly,
// and the report says what the server did to them (disconnected them,
// buffered for them, dropped their messages) and what it cost the others.

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// drillOf builds the drill section of a run with slow readers, slow of
// them: d holds their counts, obs their latencies and disconnects, maxLag
// the most messages one was behind, and normalP99 the other users'
// delivery p99.
func drillOf(p config.Profile, slow int, d counts, obs *observer, maxLag int64, normalP99 time.Duration) *report.Drill {
	sr := p.SlowReaders
	dr := &report.Drill{
		SlowReaders: slow,
		Fraction:    sr.Fraction, ReadDelay: sr.ReadDelay, Pause: sr.Pause, PauseEvery: sr.PauseEvery,
		NormalP99:      normalP99,
		MaxLagMessages: maxLag,
		Disconnects:    map[string]int64{},
		CloseCodes:     map[string]int64{},
	}
	for _, k := range d.slow {
		k.Undelivered = max(0, k.Expected-k.Delivered-k.Recovered-k.Lost)
		addTo(&dr.Deliveries, k)
	}
	setRatios(&dr.Deliveries)

	obs.mu.Lock()
	dr.Latency = percentiles(obs.slowDeliv)
	dr.TimeToDisconnect = percentiles(obs.toDisc)
	ends := make([]drillEnd, 0, len(obs.slowEnds))
	for e, n := range obs.slowEnds {
		ends = append(ends, drillEnd{slowEnd: e, n: n})
		dr.Disconnects[e.reason] += n
		if e.code != 0 {
			dr.CloseCodes[strconv.Itoa(e.code)] += n
		}
	}
	hit := 0
	for _, h := range obs.slowHit {
		if h {
			hit++
		}
	}
	obs.mu.Unlock()
	dr.Reaction = drillReaction(dr, ends, hit)
	return dr
}

// drillEnd is one way slow readers' sessions ended, and how often.
type drillEnd struct {
	slowEnd
	n int64
}

// drillReaction states the server's reaction in one line from the facts:
// how the slow readers were disconnected and how soon, or, when they were
// not, how far behind they fell. hit is how many slow readers were
// disconnected at least once.
func drillReaction(dr *report.Drill, ends []drillEnd, hit int) string {
	var total int64
	for _, e := range ends {
		total += e.n
	}
	if total == 0 {
		lost := dr.Deliveries.Lost
		switch {
		case dr.Deliveries.Expected == 0:
			return "not tested: no deliveries were owed to the slow readers"
		case lost > 0:
			return fmt.Sprintf("kept connected, but %s of %s deliveries to slow readers were lost "+
				"(the server dropped messages rather than disconnect); they fell up to %s messages behind",
				report.FormatCount(lost), report.FormatCount(dr.Deliveries.Expected), report.FormatCount(dr.MaxLagMessages))
		case dr.MaxLagMessages == 0:
			return "kept connected and never seen behind: the drill may be too gentle to fill the buffers " +
				"between the server and a slow reader (try a longer pause or larger messages)"
		}
		return fmt.Sprintf("kept connected: slow readers fell up to %s messages behind "+
			"(the server buffered or throttled; imcanary cannot tell which from outside)",
			report.FormatCount(dr.MaxLagMessages))
	}

	// The most frequent way sessions ended names the reaction; ties go
	// to the reason and code that sort first, so reports are stable.
	sort.Slice(ends, func(i, j int) bool {
		a, b := ends[i], ends[j]
		if a.n != b.n {
			return a.n > b.n
		}
		if a.reason != b.reason {
			return a.reason < b.reason
		}
		return a.code < b.code
	})
	top := ends[0]
	var s string
	switch {
	case top.reason == metrics.ReasonSlowConsumer && top.code != 0:
		s = fmt.Sprintf("disconnected as slow consumers (close %d)", top.code)
	case top.reason == metrics.ReasonSlowConsumer:
		s = "disconnected as slow consumers"
	case top.reason == metrics.ReasonError && top.code == 0:
		s = "disconnected without a close frame (error)"
	case top.code != 0:
		s = fmt.Sprintf("disconnected (%s %d)", top.reason, top.code)
	default:
		s = fmt.Sprintf("disconnected (%s)", top.reason)
	}
	if t := dr.TimeToDisconnect; t.Count > 0 {
		s += " after " + report.FormatLatency(t.P50) + " median"
	}
	s += fmt.Sprintf(": %s of %s slow readers, %s disconnect%s", report.FormatCount(int64(hit)), report.FormatCount(int64(dr.SlowReaders)), report.FormatCount(total), plural(total))
	if len(dr.Disconnects) > 1 {
		s += " (" + report.FormatCounts(dr.Disconnects) + ")"
	}
	return s
}

// drillNote says how the drill was run and measured, for the report's
// notes.
func drillNote(dr *report.Drill, users int) string {
	return fmt.Sprintf("Slow-reader drill: %d of %d users, spread evenly, read slowly (%s) and never send. "+
		"Deliveries, delivery latency, disconnects, min_online_ratio and the thresholds on them count the other users only; the drill section counts the slow readers. "+
		"Time to disconnect runs from when a slow reader started being slow (its session's login or the start of the send phase, whichever is later) "+
		"to when imcanary saw its session end, after reading what the server had sent before the close; "+
		"lag is the most messages acknowledged to a slow reader's conversations and not yet read, at the population's sweeps.",
		dr.SlowReaders, users, dr.Reading())
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
