package soak

import (
	"fmt"
	"math"
	"time"

	"github.com/imcanary/imcanary/report"
)

// String is the progress as one line for a terminal or a log: phase,
// elapsed and remaining time, sessions online, the rates of the last
// sample interval and the cumulative losses. Loss is judged only
// lost_after after a message's intended send time, so until the first
// messages are that old the line says "lost pending" rather than a
// reassuring 0, and it always says when loss is judged.
func (p Progress) String() string {
	lost := report.FormatCount(p.Lost)
	if !p.LossJudged && p.Lost == 0 {
		lost = "pending"
	}
	if p.LostAfter > 0 {
		lost += " (judged " + report.FormatSpan(p.LostAfter) + " after send)"
	}
	return fmt.Sprintf("%-5s %6s elapsed %6s left  online %s/%s  sent %s/s  delivered %s/s  lost %s  late %s",
		p.Phase, progressSpan(p.Elapsed), progressSpan(p.Remaining), report.FormatCount(int64(p.Online)), report.FormatCount(int64(p.Users)),
		wholeRate(p.SentPerSec), wholeRate(p.DelivPerSec), lost, report.FormatCount(p.Late))
}

// wholeRate prints a rate rounded to a whole number and grouped
// like a count, for the progress line, where a decimal would only flicker.
func wholeRate(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) >= math.MaxInt64 {
		return "-"
	}
	return report.FormatCount(int64(math.Round(v)))
}

// progressSpan prints an elapsed or remaining time to the second,
// "0s" below one: the line is redrawn every sample, and milliseconds
// would only flicker.
func progressSpan(d time.Duration) string {
	if d.Round(time.Second) == 0 {
		return "0s"
	}
	return report.FormatSpan(d)
}
