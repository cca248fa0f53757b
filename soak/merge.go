package soak

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// maxStartSpread bounds how far apart, as a fraction of the profile's
// duration, the shards of one run may have started: the sums of shards
// that ran at different times describe no moment of the server.
const maxStartSpread = 0.1

// Merge makes one report of the reports of every shard of one sharded
// soak run (each "I/N" in Shard, all N of them, one profile, one target):
// counts are summed, latency percentiles read from the shards' histograms
// merged, and the thresholds judged on the sums, so that the merged
// verdict is the run's. An aborted shard makes the run aborted. A report
// that is not a shard of the same run, or lacks what a merge needs, is an
// error naming it.
func Merge(shards []*report.Soak) (*report.Soak, error) {
	if len(shards) == 0 {
		return nil, errors.New("no shard reports to merge")
	}
	sorted, err := checkShards(shards)
	if err != nil {
		return nil, err
	}
	first := sorted[0]
	m := &report.Soak{
		ID: report.NewRunID(first.Start), Kind: "soak", Target: first.Target, Profile: first.Profile,
		CatchUp: first.CatchUp, Start: first.Start, End: first.End,
		Users:       report.Users{MinOnlineRatio: first.Users.MinOnlineRatio},
		Messages:    report.Messages{Rejected: map[string]int64{}},
		Deliveries:  map[string]report.Deliveries{},
		Disconnects: map[string]int64{},
		Latency:     map[string]report.Percentiles{},
	}
	hists := map[string]*hdrhistogram.Histogram{}
	errs := map[string]int64{}
	aborted := false
	var tl tally
	for _, r := range sorted {
		m.Shards = append(m.Shards, report.ShardRun{Shard: r.Shard, ID: r.ID, Result: r.Result, Start: r.Start, End: r.End})
		m.Start = minTime(m.Start, r.Start)
		if r.End.After(m.End) {
			m.End = r.End
		}
		aborted = aborted || r.Result == metrics.ResultAborted
		m.Users.Configured += r.Users.Configured
		m.Users.LoggedIn += r.Users.LoggedIn
		m.Users.FailedLogins += r.Users.FailedLogins
		m.Users.Groups += r.Users.Groups
		m.Users.MinOnlineRatio = min(m.Users.MinOnlineRatio, r.Users.MinOnlineRatio)
		addMessages(&m.Messages, r.Messages)
		tl.refused += r.Messages.AckTimeouts
		for _, n := range r.Messages.Rejected {
			tl.refused += n
		}
		for k, d := range r.Deliveries {
			if k == "all" {
				continue
			}
			sum := m.Deliveries[k]
			addTo(&sum, d)
			m.Deliveries[k] = sum
		}
		for reason, n := range r.Disconnects {
			m.Disconnects[reason] += n
			tl.disconnects += n
		}
		for _, e := range r.Errors {
			errs[e.Error] += e.Count
		}
		for k, enc := range r.Histograms {
			h, err := decodeHistogram(fmt.Sprintf("shard %s (run %s) histogram %s", r.Shard, r.ID, k), enc)
			if err != nil {
				return nil, err
			}
			if hists[k] == nil {
				hists[k] = h
			} else {
				hists[k].Merge(h)
			}
		}
		m.Saturation = addSaturation(m.Saturation, r.Saturation)
		for _, ph := range r.Phases {
			j := slices.IndexFunc(m.Phases, func(p report.Phase) bool { return p.Name == ph.Name })
			switch {
			case j < 0:
				m.Phases = append(m.Phases, ph)
			case ph.Start.Before(m.Phases[j].Start):
				m.Phases[j].Start = ph.Start
			}
		}
	}
	if m.Messages.SendSeconds > 0 {
		m.Messages.SentPerSec = float64(m.Messages.Sent) / m.Messages.SendSeconds
	}
	for _, k := range slices.Sorted(maps.Keys(m.Deliveries)) {
		d := m.Deliveries[k]
		// From the sums, not summed: where the population is laid out
		// across shards, a shard counts owed what others receive, and
		// only the sums balance.
		d.Undelivered = max(0, d.Expected-d.Delivered-d.Recovered-d.Lost)
		setRatios(&d)
		m.Deliveries[k] = d
		addTo(&tl.all, d)
	}
	setRatios(&tl.all)
	m.Deliveries["all"] = tl.all
	for k, h := range hists {
		m.Latency[k] = percentiles(h)
	}
	m.Histograms = encodeHistograms(hists)
	tl.delivery = newHist()
	for _, k := range []string{"delivery_direct", "delivery_group"} {
		if h := hists[k]; h != nil {
			tl.delivery.Merge(h)
		}
	}
	if hists["delivery_late_login"] != nil && hists["delivery_on_time"] != nil {
		tl.onTime, tl.late = hists["delivery_on_time"], hists["delivery_late_login"]
	}
	m.Errors = topErrors(errs, 10)
	m.Samples = mergeSamples(sorted)
	m.Thresholds = thresholdRows(m, tl)
	m.Result = resultOf(m, aborted)
	m.Notes = mergeNotes(m, sorted)
	return m, nil
}

// checkShards checks that rs are every shard of one run and returns them
// in shard order.
func checkShards(rs []*report.Soak) ([]*report.Soak, error) {
	name := func(r *report.Soak) string {
		if r.Shard == "" {
			return fmt.Sprintf("run %s", r.ID)
		}
		return fmt.Sprintf("shard %s (run %s)", r.Shard, r.ID)
	}
	first := rs[0]
	idx := make([]int, len(rs))
	count := 0
	for i, r := range rs {
		if r.Shard == "" {
			return nil, fmt.Errorf("%s is not a shard's: its report has no shard (a daemon writes it as I/N when shard is set)", name(r))
		}
		sh, err := config.ParseShard(r.Shard, "")
		if err != nil || !sh.Sharded() {
			return nil, fmt.Errorf("%s: shard %q is not I/N with N > 1", name(r), r.Shard)
		}
		if i == 0 {
			count = sh.Count
		}
		switch {
		case r.Kind != "soak":
			return nil, fmt.Errorf("%s is a %q report, not a soak run's", name(r), r.Kind)
		case sh.Count != count:
			return nil, fmt.Errorf("%s is one of %d shards, %s one of %d", name(r), sh.Count, name(first), count)
		case r.Target != first.Target:
			return nil, fmt.Errorf("%s ran against target %q, %s against %q", name(r), r.Target, name(first), first.Target)
		case r.Profile != first.Profile:
			return nil, fmt.Errorf("%s ran profile %q with other settings than %s's %q: shards of one run share one profile", name(r), r.Profile.Name, name(first), first.Profile.Name)
		case r.CatchUp != first.CatchUp:
			return nil, fmt.Errorf("%s had catch-up %q, %s %q", name(r), r.CatchUp, name(first), first.CatchUp)
		case r.Drill != nil || r.Storm != nil:
			return nil, fmt.Errorf("%s has a slow-reader or storm drill, whose outcome a merge cannot sum yet", name(r))
		case len(r.Histograms) == 0 && r.Latency["delivery_direct"].Count+r.Latency["delivery_group"].Count+r.Latency["ack"].Count > 0:
			return nil, fmt.Errorf("%s has latency percentiles but not the histograms they came from (a report of a release before them): its latencies cannot be merged", name(r))
		}
		for j := range i {
			if idx[j] == sh.Index {
				return nil, fmt.Errorf("%s and %s are the same shard", name(rs[j]), name(r))
			}
		}
		idx[i] = sh.Index
	}
	if len(rs) != count {
		var missing []string
		for s := range count {
			if !slices.Contains(idx, s) {
				missing = append(missing, fmt.Sprintf("%d/%d", s, count))
			}
		}
		return nil, fmt.Errorf("%d shard reports of %d: shard %s missing", len(rs), count, strings.Join(missing, ", "))
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b *report.Soak) int {
		ia, _ := config.ParseShard(a.Shard, "")
		ib, _ := config.ParseShard(b.Shard, "")
		return cmp.Compare(ia.Index, ib.Index)
	})
	lo, hi := sorted[0].Start, sorted[0].Start
	for _, r := range sorted {
		lo, hi = minTime(lo, r.Start), maxTime(hi, r.Start)
	}
	if spread, limit := hi.Sub(lo), time.Duration(maxStartSpread*float64(first.Profile.Duration)); spread > limit {
		return nil, fmt.Errorf("the shards started %s apart, more than a tenth of the profile's %s: they did not run together", spread.Round(time.Millisecond), first.Profile.Duration)
	}
	return sorted, nil
}

func addMessages(m *report.Messages, o report.Messages) {
	m.Sent += o.Sent
	m.Acked += o.Acked
	m.Unacked += o.Unacked
	m.AckTimeouts += o.AckTimeouts
	m.Offline += o.Offline
	m.WriteErrors += o.WriteErrors
	m.SendSeconds = max(m.SendSeconds, o.SendSeconds)
	for code, n := range o.Rejected {
		m.Rejected[code] += n
	}
}

// addSaturation adds a shard's saturation to the merged run's: every
// period, the delivery samples summed, and the largest saturated fraction
// of a shard's send and drain.
func addSaturation(m, o *report.Saturation) *report.Saturation {
	if o == nil {
		return m
	}
	if m == nil {
		m = &report.Saturation{}
	}
	m.Periods = append(m.Periods, o.Periods...)
	slices.SortStableFunc(m.Periods, func(a, b report.SaturatedPeriod) int { return a.Start.Compare(b.Start) })
	m.DeliverySamples += o.DeliverySamples
	m.SendDrainRatio = max(m.SendDrainRatio, o.SendDrainRatio)
	return m
}

// mergeSamples lines the shards' samples up by their offset from their
// own run's start, one interval wide: the counts and rates of a moment
// are summed over the shards, its latencies are the highest shard's. The
// result is no longer than the shards' samples together, whatever times
// a report claims.
func mergeSamples(rs []*report.Soak) []report.Sample {
	interval := time.Duration(0)
	for _, r := range rs {
		if len(r.Samples) > 1 {
			interval = r.Samples[1].T.Sub(r.Samples[0].T)
			break
		}
	}
	if interval <= 0 {
		return slices.Clone(rs[0].Samples)
	}
	at := map[int64]*report.Sample{}
	start := rs[0].Start
	for _, r := range rs {
		for _, s := range r.Samples {
			off := s.T.Sub(r.Start)
			if off < 0 {
				continue
			}
			i := int64((off + interval/2) / interval)
			o := at[i]
			if o == nil {
				o = &report.Sample{T: start.Add(time.Duration(i) * interval), Phase: s.Phase}
				at[i] = o
			}
			o.Online += s.Online
			o.SentPerSec += s.SentPerSec
			o.DelivPerSec += s.DelivPerSec
			o.Lost += s.Lost
			o.Late += s.Late
			o.Disconnects += s.Disconnects
			o.P50, o.P99, o.Max = max(o.P50, s.P50), max(o.P99, s.P99), max(o.Max, s.Max)
			o.Saturated = o.Saturated || s.Saturated
			for _, c := range s.SaturationCauses {
				if !slices.Contains(o.SaturationCauses, c) {
					o.SaturationCauses = append(o.SaturationCauses, c)
				}
			}
		}
	}
	out := make([]report.Sample, 0, len(at))
	for _, i := range slices.Sorted(maps.Keys(at)) {
		out = append(out, *at[i])
	}
	return out
}

func mergeNotes(m *report.Soak, rs []*report.Soak) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.Shard + " " + r.ID
	}
	notes := []string{
		fmt.Sprintf("Merged from the reports of %d shards (%s): counts are their sums, latency percentiles are read from their histograms merged, and the thresholds are judged on the sums.", len(rs), strings.Join(ids, ", ")),
		"min_online_ratio is the lowest shard's: the whole population's ratio at that moment was no lower. A chart's latency at a moment is the highest shard's for that interval.",
	}
	if m.Saturation != nil {
		notes = append(notes, fmt.Sprintf("At least one shard's prober was saturated (%s of the send and drain, at most, on one shard): a threshold it missed may be the prober's own.", pct(m.Saturation.SendDrainRatio)))
	}
	for _, r := range rs {
		if r.Result == metrics.ResultAborted {
			notes = append(notes, fmt.Sprintf("Shard %s was stopped before its end: the merged run is aborted, and its counts cover only what that shard ran.", r.Shard))
		}
	}
	return append(notes,
		"Latency is measured from each message's intended send time (open loop), so a sender that fell behind shows as latency.",
		"Loss ratio counts deliveries the ledger wrote off (lost) and those still missing when the drain ended (undelivered), over deliveries owed for acknowledged messages (one per recipient device).",
	)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
