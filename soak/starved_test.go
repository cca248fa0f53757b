package soak

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/saturation"
)

// TestStarvedProberIsInconclusive saturates imcanary on purpose: midway
// through the send phase, CPU-bound goroutines, eight per core, starve the
// prober's receive path (and the in-process target with it). The real
// saturation monitor must flag it before the ledger has counted any loss,
// and the run, which misses its 50 ms p99 while starved, must come out
// inconclusive, not failed. The same run unstarved passes and never flags
// saturation.
func TestStarvedProberIsInconclusive(t *testing.T) {
	for _, starve := range []bool{false, true} {
		name := map[bool]string{false: "healthy", true: "starved"}[starve]
		t.Run(name, func(t *testing.T) {
			url, _ := startTarget(t, refserver.Faults{})
			m := metrics.New(prometheus.NewPedanticRegistry())
			mon, err := saturation.New(saturation.Config{
				Interval: 100 * time.Millisecond, Window: 500 * time.Millisecond,
				MaxSendLag: 200 * time.Millisecond, MaxReceiveLag: 200 * time.Millisecond,
				MaxSchedLatency: 100 * time.Millisecond, MaxGCPause: 200 * time.Millisecond,
				MaxCPU: 1, MaxFDs: 0.9, MaxPorts: 0.9,
			}, m.Probe("t"), nil)
			if err != nil {
				t.Fatal(err)
			}
			r := NewRunner(RunnerOptions{
				Connection: engine.Connection{
					Driver:     newTestDriver(t, url),
					Run:        "r1",
					Heartbeat:  time.Second,
					BackoffMin: 20 * time.Millisecond,
					BackoffMax: 300 * time.Millisecond,
					Health:     mon,
				},
				Metrics:     m,
				Target:      "t",
				Prefix:      "s",
				SampleEvery: 100 * time.Millisecond,
			})
			p := testProfile()
			p.Duration, p.Drain = 5*time.Second, 3*time.Second
			p.Thresholds.P99Delivery = 50 * time.Millisecond

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			// Exits when ctx ends.
			wg.Go(func() { mon.Run(ctx) })

			// The watcher notes when saturation is first flagged and
			// what the ledger had counted lost by then.
			set := m.For("t", metrics.SourceSoak)
			lost := func() float64 {
				var n float64
				for _, k := range set.Kind {
					for _, c := range k.Cohort {
						n += metrics.Value(c.Lost)
					}
				}
				return n
			}
			var satAt atomic.Int64
			var lostAtSat atomic.Value
			// Exits when ctx ends.
			wg.Go(func() {
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					if mon.Saturated() && satAt.Load() == 0 {
						lostAtSat.Store(lost())
						satAt.Store(time.Now().UnixNano())
					}
				}
			})
			start := time.Now()
			if starve {
				// Exits after 2 s of spinning, or when ctx ends.
				wg.Go(func() { hog(ctx, start.Add(2*time.Second), 2*time.Second) })
			}
			rep, err := r.Run(ctx, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("result %s; thresholds %+v", rep.Result, rep.Thresholds)
			if !starve {
				if rep.Result != metrics.ResultPass || rep.Saturation != nil || satAt.Load() != 0 {
					t.Errorf("healthy run: result %s, saturation %+v, flagged %v; want pass, never saturated",
						rep.Result, rep.Saturation, satAt.Load() != 0)
				}
				return
			}
			if satAt.Load() == 0 {
				t.Fatalf("the starved prober never flagged saturation")
			}
			t.Logf("saturated %v after the start with %v lost counted; causes over the run: %+v",
				time.Duration(satAt.Load()-start.UnixNano()).Round(time.Millisecond), lostAtSat.Load(), rep.Saturation)
			if l := lostAtSat.Load().(float64); l != 0 {
				t.Errorf("lost = %v when saturation was first flagged, want 0: the flag must come first", l)
			}
			if row(rep, "p99_delivery").Pass {
				t.Errorf("p99_delivery passed while starved; the test needs a failing threshold to prove inconclusive")
			}
			if rep.Result != metrics.ResultInconclusive {
				t.Errorf("result %s, want inconclusive: the thresholds were missed while the prober was saturated", rep.Result)
			}
			if rep.Saturation == nil || len(rep.Saturation.Periods) == 0 {
				t.Errorf("report has no saturated period: %+v", rep.Saturation)
			}
			if got := metrics.Value(m.SoakRuns.WithLabelValues("t", p.Name, metrics.ResultInconclusive)); got != 1 {
				t.Errorf("soak runs{result=inconclusive} = %v, want 1", got)
			}
		})
	}
}

// hog keeps eight goroutines per core busy from at for d, unless ctx ends
// first.
func hog(ctx context.Context, at time.Time, d time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Until(at)):
	}
	end := at.Add(d)
	var wg sync.WaitGroup
	for range 8 * runtime.GOMAXPROCS(0) {
		// Exits at end or when ctx ends.
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				if n%1024 == 0 && time.Now().After(end) {
					return
				}
			}
		})
	}
	wg.Wait()
}
