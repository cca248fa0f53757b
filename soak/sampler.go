package soak

// The sampler: the run's time series, one sample a step, and the
// progress it reports.

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// sampler records the run's time series and reports progress.
type sampler struct {
	r      *Runner
	p      config.Profile
	pop    *engine.Population
	set    *metrics.Set
	obs    *observer
	before counts
	start  time.Time
	// normal is how many users are not slow readers, lateNormal how many
	// of them log in late: the online ratio is theirs.
	normal, lateNormal int
	progress           func(Progress)

	// sampling serialises sample: the loop and the run's end both call it.
	sampling sync.Mutex
	mu       sync.Mutex
	phase    string
	// phaseStart is when the current phase began, sendStart when the
	// send phase did (zero before it).
	phaseStart time.Time
	sendStart  time.Time
	samples    []report.Sample
	minOnline  float64
	prev       counts
	prevT      time.Time
	// lastDT is how long the last sample's interval was, in seconds.
	lastDT float64
	// maxSlowLag is the most messages a slow reader was behind at any
	// sample.
	maxSlowLag int64
	// periods are the saturated spans so far; satOpen says the last one
	// runs on to the latest sample.
	periods []report.SaturatedPeriod
	satOpen bool
	// storm is the drill of the run's own cohort once it has dropped:
	// its dropped sessions are not sampled into minOnline until back.
	storm *storm
}

// maxSamples bounds a run's time series whatever its duration.
const maxSamples = 2000

func (s *sampler) setPhase(name string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase, s.phaseStart = name, now
	if name == report.PhaseSend {
		s.sendStart = now
	}
}

// remaining is what the profile has left at now, in phase, which began at
// phaseStart: the rest of that phase as configured and the phases after
// it. A ramp that outlasts its configured length (the grace for late
// logins) counts as ending now.
func (s *sampler) remaining(phase string, phaseStart, now time.Time) time.Duration {
	p := s.p
	in := now.Sub(phaseStart)
	switch phase {
	case report.PhaseRamp:
		return max(0, p.Ramp-in) + p.Duration + p.Drain
	case report.PhaseSend:
		return max(0, p.Duration-in) + p.Drain
	case report.PhaseDrain:
		return max(0, p.Drain-in)
	}
	return max(0, p.Ramp+p.Duration+p.Drain-now.Sub(s.start))
}

func (s *sampler) every() time.Duration {
	if d := s.r.o.SampleEvery; d > 0 {
		return d
	}
	return min(max((s.p.Ramp+s.p.Duration+s.p.Drain)/200, time.Second), 10*time.Second)
}

func (s *sampler) loop(ctx context.Context) {
	t := time.NewTicker(s.every())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.sample(time.Now())
			return
		case <-t.C:
			s.sample(time.Now())
		}
	}
}

func (s *sampler) sample(now time.Time) {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	cur := snapshot(s.set)
	d := cur.sub(s.prev)
	total := cur.sub(s.before)
	from := s.prevT
	dt := now.Sub(from).Seconds()
	s.prev, s.prevT = cur, now

	// Asked once per sample, outside every lock: the monitor may take
	// its own.
	var saturated bool
	var causes []string
	if h := s.r.o.Health; h != nil && h.Saturated() {
		saturated = true
		// Why, when the monitor says: a copy, as the sample keeps it
		// and the monitor may reuse its own.
		if src, ok := h.(SaturationSource); ok {
			causes = slices.Clone(src.Causes())
		}
	}
	slowLag := s.pop.SlowReaderLag()

	s.obs.mu.Lock()
	iv := s.obs.interval
	p50, p99, mx := pctl(iv, 50), pctl(iv, 99), time.Duration(iv.Max())*time.Microsecond
	iv.Reset()
	normalOnline := s.obs.online[0]
	var disc, slowDisc int64
	for _, n := range s.obs.disc[0] {
		disc += n
	}
	for _, n := range s.obs.disc[1] {
		slowDisc += n
	}
	s.obs.mu.Unlock()

	var sent, deliv int64
	for _, k := range d.kind {
		sent += k.sent
		deliv += k.Delivered
	}
	all := total.all()
	online := s.pop.Online()

	s.mu.Lock()
	phase, phaseStart, sendStart := s.phase, s.phaseStart, s.sendStart
	if phase == report.PhaseSend && !(s.storm != nil && s.storm.recovering()) {
		due := s.normal
		// Late users are not due online until a little after LateAfter.
		if s.lateNormal > 0 && now.Before(s.start.Add(s.p.LateAfter+5*time.Second)) {
			due -= s.lateNormal
		}
		if due > 0 {
			ratio := float64(normalOnline) / float64(due)
			if s.minOnline < 0 || ratio < s.minOnline {
				s.minOnline = math.Min(ratio, 1)
			}
		}
	}
	s.maxSlowLag = max(s.maxSlowLag, slowLag)
	if saturated {
		s.markSaturated(from, now, causes)
	} else {
		s.satOpen = false
	}
	if dt > 0 && len(s.samples) < maxSamples {
		var minDT float64
		if s.r != nil {
			minDT = s.every().Seconds() / 2
		}
		s.samples, s.lastDT = appendSample(s.samples, s.lastDT, report.Sample{
			T: now, Phase: phase, Online: online,
			Lost: all.Lost, Late: all.Late, Disconnects: disc,
			P50: p50, P99: p99, Max: mx,
			SlowReaderDisconnects: slowDisc, SlowReaderLag: slowLag,
			Saturated: saturated, SaturationCauses: causes,
		}, sent, deliv, dt, minDT)
	}
	s.mu.Unlock()

	// A rate over a sliver of time says nothing (appendSample): the
	// next progress line has it.
	if s.progress != nil && dt > 0 && (s.r == nil || dt >= s.every().Seconds()/2) {
		s.progress(Progress{
			Phase: phase, Elapsed: now.Sub(s.start), Remaining: s.remaining(phase, phaseStart, now),
			// Online counts sessions: one per device of each user.
			Online: online, Users: s.p.Users * max(s.p.Devices, 1),
			SentPerSec: float64(sent) / dt, DelivPerSec: float64(deliv) / dt,
			Lost: all.Lost, Late: all.Late,
			// The first messages sent can be judged lost only
			// lost_after after the send phase began.
			LostAfter:  s.p.LostAfter,
			LossJudged: !sendStart.IsZero() && now.Sub(sendStart) >= s.p.LostAfter,
		})
	}
}

// appendSample appends smp, which saw sent messages sent and deliv
// delivered over dt seconds, to samples, whose last one spans lastDT, and
// returns them and the new last one's span. An interval shorter than
// minDT (the run's end, 2 ms after the last tick) is folded into the
// sample before it: a rate over 2 ms is noise that drew 10,833
// deliveries/s where 50 was the truth, and flattened the chart.
func appendSample(samples []report.Sample, lastDT float64, smp report.Sample, sent, deliv int64, dt, minDT float64) ([]report.Sample, float64) {
	if dt < minDT && len(samples) > 0 && lastDT > 0 {
		last := &samples[len(samples)-1]
		span := lastDT + dt
		last.SentPerSec = (last.SentPerSec*lastDT + float64(sent)) / span
		last.DelivPerSec = (last.DelivPerSec*lastDT + float64(deliv)) / span
		// What is counted from the start, and the state at the end,
		// are the later sample's; the interval's latency the worse.
		last.T, last.Online = smp.T, smp.Online
		last.Lost, last.Late, last.Disconnects = smp.Lost, smp.Late, smp.Disconnects
		last.SlowReaderDisconnects = smp.SlowReaderDisconnects
		last.SlowReaderLag = max(last.SlowReaderLag, smp.SlowReaderLag)
		last.Max = max(last.Max, smp.Max)
		if last.P99 == 0 {
			last.P50, last.P99 = smp.P50, smp.P99
		}
		if smp.Saturated {
			last.Saturated, last.SaturationCauses = true, smp.SaturationCauses
		}
		return samples, span
	}
	smp.SentPerSec, smp.DelivPerSec = float64(sent)/dt, float64(deliv)/dt
	return append(samples, smp), dt
}

// slowLag returns the most messages a slow reader was behind at any
// sample.
func (s *sampler) slowLag() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxSlowLag
}
