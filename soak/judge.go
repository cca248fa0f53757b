package soak

import (
	"fmt"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// tally is what a verdict is judged on beyond the report's own figures:
// the delivery histograms, whose percentiles and counts above a limit the
// report keeps only in summary, and the counts the report does not list
// as such. A run fills it from its observer; a merge of shards from the
// shards' reports, summed.
type tally struct {
	all report.Deliveries
	// delivery holds both kinds' delivery latencies; onTime and late the
	// on-time and late-login recipients' apart, nil without late logins.
	delivery, onTime, late *hdrhistogram.Histogram
	// refused counts sends rejected with a code or never acked within
	// the ack timeout.
	refused     int64
	disconnects int64
}

// thresholdRows judges rep against its profile's thresholds: its
// deliveries, latencies, logins and online ratio as the report has them,
// the rest from tl. Storm rows are the storm's (fillStorm).
func thresholdRows(rep *report.Soak, tl tally) []report.Threshold {
	t := rep.Profile.Thresholds
	all := tl.all
	var refused float64
	if answered := rep.Messages.Acked + tl.refused; answered > 0 {
		refused = float64(tl.refused) / float64(answered)
	}
	rows := []report.Threshold{
		ratioRow("max_loss", t.MaxLoss, all.LossRatio, all.LossRatio <= t.MaxLoss),
		ratioRow("max_late", t.MaxLate, all.LateRatio, all.LateRatio <= t.MaxLate),
		ratioRow("max_refused", t.MaxRefused, refused, refused <= t.MaxRefused),
	}
	if t.MinRealtimeCompleteness > 0 {
		rt := all.Realtime()
		rows = append(rows, ratioRow("min_realtime_completeness", t.MinRealtimeCompleteness, rt, rt >= t.MinRealtimeCompleteness))
	}
	var lateSlow, onTimeSlow int64
	if tl.late != nil {
		lateSlow, onTimeSlow = above(tl.late, t.P99Delivery), above(tl.onTime, t.P99Delivery)
	}
	users, loggedIn := rep.Users.Configured, rep.Users.LoggedIn
	return append(rows, []report.Threshold{
		durationRow("p99_ack", t.P99Ack, rep.Latency["ack"].P99),
		withCause(durationRow("p99_delivery", t.P99Delivery, percentiles(tl.delivery).P99),
			lateLoginCause(lateSlow, onTimeSlow, t.P99Delivery, rep.Latency["delivery_on_time"])),
		ratioRow("min_online_ratio", t.MinOnlineRatio, rep.Users.MinOnlineRatio, rep.Users.MinOnlineRatio >= t.MinOnlineRatio),
		{Name: "max_disconnects", Limit: fmt.Sprint(t.MaxDisconnects), Actual: fmt.Sprint(tl.disconnects),
			LimitValue: float64(t.MaxDisconnects), ActualValue: float64(tl.disconnects), Pass: tl.disconnects <= t.MaxDisconnects},
		{Name: "all_users_logged_in", Limit: fmt.Sprint(users), Actual: fmt.Sprint(loggedIn),
			LimitValue: float64(users), ActualValue: float64(loggedIn), Pass: loggedIn == users},
		{Name: "deliveries", Limit: "≥ 1", Actual: fmt.Sprint(all.Delivered),
			LimitValue: 1, ActualValue: float64(all.Delivered), Pass: all.Delivered >= 1},
	}...)
}

// resultOf is the verdict of rep, its thresholds judged: aborted, or
// inconclusive for a failure while the prober was saturated, or fail, or
// pass.
func resultOf(rep *report.Soak, aborted bool) string {
	failed := false
	for _, th := range rep.Thresholds {
		failed = failed || !th.Pass
	}
	switch {
	case aborted:
		return metrics.ResultAborted
	case failed && judged(rep.Saturation):
		return metrics.ResultInconclusive
	case failed:
		return metrics.ResultFail
	}
	return metrics.ResultPass
}

// encodeHistograms encodes each non-empty histogram of hs for the report
// (report.Soak.Histograms): hdrhistogram-go's compressed V2 encoding,
// which is base64 text already.
func encodeHistograms(hs map[string]*hdrhistogram.Histogram) map[string]string {
	out := map[string]string{}
	for k, h := range hs {
		if h == nil || h.TotalCount() == 0 {
			continue
		}
		b, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
		if err != nil {
			// Encoding a valid histogram does not fail; a report
			// without it only cannot be merged.
			continue
		}
		out[k] = string(b)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// decodeHistogram decodes one histogram of a report; what it names is for
// the error.
func decodeHistogram(what, s string) (*hdrhistogram.Histogram, error) {
	h, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if ours := newHist(); h.LowestTrackableValue() != ours.LowestTrackableValue() ||
		h.HighestTrackableValue() != ours.HighestTrackableValue() || h.SignificantFigures() != ours.SignificantFigures() {
		return nil, fmt.Errorf("%s: a histogram of %d to %d at %d significant figures, not a soak run's (%d µs to %d µs at %d)", what,
			h.LowestTrackableValue(), h.HighestTrackableValue(), h.SignificantFigures(),
			ours.LowestTrackableValue(), ours.HighestTrackableValue(), ours.SignificantFigures())
	}
	return h, nil
}
