package soak

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// fakeHealth stands in for saturation.Monitor: it says saturated
// from `from` to `to` after the first send it is told of (to == 0: never).
type fakeHealth struct {
	first    atomic.Int64 // Unix ns of the first SendLag
	from, to time.Duration
	causes   []string
}

var _ SaturationSource = (*fakeHealth)(nil)

func (f *fakeHealth) SendLag(time.Duration) {
	f.first.CompareAndSwap(0, time.Now().UnixNano())
}

func (f *fakeHealth) ReceiveLag(time.Duration) {}

func (f *fakeHealth) Saturated() bool {
	first := f.first.Load()
	if first == 0 || f.to == 0 {
		return false
	}
	since := time.Duration(time.Now().UnixNano() - first)
	return since >= f.from && since < f.to
}

func (f *fakeHealth) Causes() []string {
	if !f.Saturated() {
		return nil
	}
	return slices.Clone(f.causes)
}

// TestSoakSaturation: a run that fails while the prober says it is
// saturated is inconclusive, counted apart, and leaves the last success
// alone; the same failure unsaturated is a fail; a pass stays a pass, with
// a note.
func TestSoakSaturation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		saturated bool
		p99       time.Duration
		want      string
		success   float64 // imcanary_soak_last_run_success after the run, from 0.5
		note      string
	}{
		{name: "fail while saturated", saturated: true, p99: time.Nanosecond,
			want: metrics.ResultInconclusive, success: 0.5, note: "Inconclusive: p99_delivery failed while imcanary itself was saturated"},
		{name: "fail unsaturated", p99: time.Nanosecond, want: metrics.ResultFail, success: 0},
		{name: "pass while saturated", saturated: true, p99: time.Second,
			want: metrics.ResultPass, success: 1, note: "imcanary was saturated for "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := startTarget(t, refserver.Faults{})
			r, m := newTestRunner(t, url)
			h := &fakeHealth{causes: []string{metrics.CauseCPU, metrics.CauseSendLag}}
			if tc.saturated {
				h.from, h.to = 300*time.Millisecond, 800*time.Millisecond
			}
			r.o.Health = h
			r.o.SampleEvery = 100 * time.Millisecond
			p := testProfile()
			p.Duration = 1500 * time.Millisecond
			p.Thresholds.P99Delivery = tc.p99
			// A sentinel: an inconclusive run must leave it as it was.
			last := m.SoakLastSuccess.WithLabelValues("t", p.Name)
			last.Set(0.5)

			rep, err := r.Run(context.Background(), p, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: result %s, saturation %+v, notes %q", tc.name, rep.Result, rep.Saturation, rep.Notes)
			if rep.Result != tc.want {
				t.Errorf("Result = %s, want %s; thresholds %+v", rep.Result, tc.want, rep.Thresholds)
			}
			if v := metrics.Value(m.SoakRuns.WithLabelValues("t", p.Name, tc.want)); v != 1 {
				t.Errorf("imcanary_soak_runs_total{result=%s} = %v, want 1", tc.want, v)
			}
			if v := metrics.Value(last); v != tc.success {
				t.Errorf("imcanary_soak_last_run_success = %v, want %v", v, tc.success)
			}
			if tc.note != "" && !hasNote(rep, tc.note) {
				t.Errorf("notes = %q, want one starting %q", rep.Notes, tc.note)
			}
			if !tc.saturated {
				if rep.Saturation != nil {
					t.Errorf("Saturation = %+v, want nil for a prober never saturated", rep.Saturation)
				}
				return
			}
			s := rep.Saturation
			if s == nil || len(s.Periods) == 0 {
				t.Fatalf("Saturation = %+v, want saturated periods", s)
			}
			send := rep.Phases[1].Start
			for _, pd := range s.Periods {
				if !pd.End.After(pd.Start) || pd.Start.Before(rep.Start) || pd.End.After(rep.End) {
					t.Errorf("period %v–%v, want within the run %v–%v", pd.Start, pd.End, rep.Start, rep.End)
				}
				if !slices.Equal(pd.Causes, []string{metrics.CauseCPU, metrics.CauseSendLag}) {
					t.Errorf("period causes = %q, want cpu, send_lag", pd.Causes)
				}
				if pd.End.Before(send) {
					t.Errorf("period %v–%v ends before the send phase starts at %v", pd.Start, pd.End, send)
				}
			}
			// Half a second of 1.5 s sending and a short drain, give or take
			// a sample interval each side.
			if s.SendDrainRatio <= 0.1 || s.SendDrainRatio >= 0.8 {
				t.Errorf("SendDrainRatio = %v, want about a third", s.SendDrainRatio)
			}
			if s.DeliverySamples == 0 {
				t.Error("DeliverySamples = 0, want the deliveries recorded while saturated")
			}
			var flagged int
			for _, sm := range rep.Samples {
				if sm.Saturated {
					flagged++
					if len(sm.SaturationCauses) != 2 {
						t.Errorf("saturated sample causes = %q", sm.SaturationCauses)
					}
				}
			}
			if flagged == 0 {
				t.Error("no sample is marked saturated")
			}
			if !strings.Contains(strings.Join(rep.Notes, "\n"), "cpu, send_lag") {
				t.Errorf("notes = %q, want the causes named", rep.Notes)
			}
		})
	}
}

func TestSaturationPeriods(t *testing.T) {
	t0 := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s := &sampler{}
	// Samples every second: saturated at 3 and 4 (cpu, then gc_pause),
	// not at 5, saturated again at 8 with no cause named.
	for i, sat := range []bool{false, false, true, true, false, false, false, true, false} {
		now, from := at(float64(i+1)), at(float64(i))
		if !sat {
			s.satOpen = false
			continue
		}
		causes := []string{metrics.CauseCPU}
		if i == 3 {
			causes = []string{metrics.CauseGCPause, metrics.CauseCPU}
		}
		if i == 7 {
			causes = nil
		}
		s.markSaturated(from, now, causes)
	}
	want := []report.SaturatedPeriod{
		{Start: at(2), End: at(4), Causes: []string{metrics.CauseCPU, metrics.CauseGCPause}},
		{Start: at(7), End: at(8), Causes: []string{}},
	}
	if len(s.periods) != len(want) {
		t.Fatalf("periods = %+v, want %+v", s.periods, want)
	}
	for i := range want {
		if g, w := s.periods[i], want[i]; !g.Start.Equal(w.Start) || !g.End.Equal(w.End) || !slices.Equal(g.Causes, w.Causes) || g.Causes == nil {
			t.Errorf("period %d = %+v, want %+v", i, g, w)
		}
	}

	// Send from 3 s to the end at 10 s: 1 s of the first period and all
	// of the second fall in it, 2 s of 7.
	s.sendStart = at(3)
	rep := &report.Soak{Start: t0, End: at(10), Phases: []report.Phase{{Name: "ramp", Start: t0}, {Name: "send", Start: at(3)}, {Name: "drain", Start: at(9)}}}
	sat := s.saturation(rep, 12)
	if got, want := sat.SendDrainRatio, 2.0/7; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("SendDrainRatio = %v, want %v", got, want)
	}
	if !judged(sat) {
		t.Error("judged() = false, want true")
	}
	rep.Saturation = sat
	if got, want := saturationWhere(rep), "2s–4s into the run (ramp, send), 7s–8s into the run (send)"; got != want {
		t.Errorf("saturationWhere() = %q, want %q", got, want)
	}

	// Saturated only in the ramp: not judged, and a failing run stays a
	// failure.
	ramp := &sampler{sendStart: at(3), periods: []report.SaturatedPeriod{{Start: at(1), End: at(2), Causes: []string{}}}}
	if sat := ramp.saturation(rep, 0); sat == nil || sat.SendDrainRatio != 0 || judged(sat) {
		t.Errorf("ramp-only saturation = %+v, want present, ratio 0, not judged", sat)
	}
	if sat := (&sampler{}).saturation(rep, 0); sat != nil {
		t.Errorf("saturation() without periods = %+v, want nil", sat)
	}
	var none *report.Saturation
	if judged(none) {
		t.Error("judged(nil) = true")
	}
}
