package soak

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// TestObserverSettle: what was sent before the settle ended is left out
// of the judged latencies, and shown in the chart's interval still.
func TestObserverSettle(t *testing.T) {
	o := newObserver(nil)
	t0 := time.Now()
	o.setSendStart(t0, time.Second)
	early := &probe.Header{Stream: []byte("g1"), Intended: t0.Add(500 * time.Millisecond).UnixNano()}
	late := &probe.Header{Stream: []byte("g1"), Intended: t0.Add(1500 * time.Millisecond).UnixNano()}
	o.Received(0, early, 3*time.Second, engine.Delivered)
	o.Received(0, late, 10*time.Millisecond, engine.Delivered)
	if n := o.deliv[1].TotalCount(); n != 1 {
		t.Errorf("%d group latencies judged, want 1: the one sent after the settle", n)
	}
	if mx := o.deliv[1].Max(); mx > 20_000 {
		t.Errorf("judged max %dµs: the settle's 3 s delivery was counted", mx)
	}
	if n := o.interval.TotalCount(); n != 2 {
		t.Errorf("%d interval latencies, want both for the chart", n)
	}
	// An ack's send is now minus its latency: one that took longer than
	// the time since the settle ended was sent during it.
	o.judgeFrom.Store(time.Now().Add(-time.Second).UnixNano())
	o.Ack(1, false, 5*time.Second)
	o.Ack(2, false, time.Millisecond)
	if n := o.ack.TotalCount(); n != 1 || o.acked != 2 {
		t.Errorf("%d acks judged of %d, want 1 of 2", n, o.acked)
	}
	// Without a settle everything is judged.
	o2 := newObserver(nil)
	o2.setSendStart(t0, 0)
	o2.Received(0, early, 3*time.Second, engine.Delivered)
	if o2.deliv[1].TotalCount() != 1 {
		t.Error("without a settle a delivery was not judged")
	}
}

// TestSettleLeavesTheWarmUpUnjudged: a server that delays every delivery
// by 2 s while the run warms up and not after. Judged whole, the run fails
// its p99; with a settle past the warm-up it passes, and its report says
// so. The delay is lifted from the first progress of the send phase, one
// sample interval (200 ms) in, plus a second; the settle is 3 s.
func TestSettleLeavesTheWarmUpUnjudged(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of 6 s; skipped with -short")
	}
	for _, settle := range []time.Duration{0, 3 * time.Second} {
		url, srv := startTarget(t, refserver.Faults{Delay: 2 * time.Second})
		r, _ := newTestRunner(t, url)
		p := config.Profile{
			Name: "settle", Users: 10, GroupSize: 5, Rate: 10, Ramp: 200 * time.Millisecond, Duration: 5 * time.Second,
			Settle: settle, Drain: 3 * time.Second, Deadline: 5 * time.Second, LostAfter: 10 * time.Second,
			Thresholds: config.Thresholds{MaxLoss: 0, MaxLate: 1, P99Ack: time.Second, P99Delivery: 500 * time.Millisecond, MinOnlineRatio: 1},
		}
		var once sync.Once
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(t.Context())
		rep, err := r.Run(ctx, p, func(pr Progress) {
			if pr.Phase == report.PhaseSend {
				once.Do(func() {
					wg.Go(func() {
						select {
						case <-time.After(time.Second):
							srv.SetFaults(refserver.Faults{})
						case <-ctx.Done():
						}
					})
				})
			}
		})
		cancel()
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		p99 := max(rep.Latency["delivery_direct"].P99, rep.Latency["delivery_group"].P99)
		t.Logf("settle %s: %s, p99 delivery %s of %d+%d judged", settle, rep.Result, p99,
			rep.Latency["delivery_direct"].Count, rep.Latency["delivery_group"].Count)
		switch settle {
		case 0:
			if rep.Result != "fail" || p99 < 2*time.Second {
				t.Errorf("judged whole: %s with p99 %s, want a failure on the warm-up's 2 s", rep.Result, p99)
			}
		default:
			if rep.Result != "pass" || p99 >= time.Second {
				t.Errorf("settled for %s: %s with p99 %s, want a pass: what was sent after the warm-up was not delayed", settle, rep.Result, p99)
			}
			if rep.Profile.Settle != settle || !hasNote(rep, "The run settled for the first 3s of sending") {
				t.Errorf("the report does not say it settled: profile %+v, notes %q", rep.Profile, rep.Notes)
			}
			if d := rep.Deliveries["all"]; d.Delivered+d.Recovered != d.Expected {
				t.Errorf("%+v: every delivery, the settle's too, must be counted", d)
			}
		}
	}
}

// TestRefusedSendsFailTheRun: a server that refuses a fifth of the sends
// loses nothing it acked, so max_loss passes; max_refused fails the run,
// saying how many were refused. Without the fault the same run passes.
func TestRefusedSendsFailTheRun(t *testing.T) {
	for _, refuse := range []float64{0, 0.2} {
		url, _ := startTarget(t, refserver.Faults{Refuse: refuse})
		r, _ := newTestRunner(t, url)
		p := config.Profile{
			Name: "refused", Users: 10, GroupSize: 5, Rate: 10, Ramp: 200 * time.Millisecond, Duration: 2 * time.Second,
			Drain: time.Second, Deadline: time.Second, LostAfter: 2 * time.Second,
			Thresholds: config.Thresholds{MaxLoss: 0, MaxLate: 1, MaxRefused: 0.001, P99Ack: time.Second, P99Delivery: time.Second, MinOnlineRatio: 1},
		}
		rep, err := r.Run(t.Context(), p, nil)
		if err != nil {
			t.Fatal(err)
		}
		var row report.Threshold
		for _, th := range rep.Thresholds {
			if th.Name == "max_refused" {
				row = th
			}
		}
		t.Logf("refuse %v: %s; max_refused %s (limit %s); rejected %v, acked %d, loss %v", refuse, rep.Result, row.Actual, row.Limit,
			rep.Messages.Rejected, rep.Messages.Acked, rep.Deliveries["all"].LossRatio)
		switch refuse {
		case 0:
			if rep.Result != "pass" || !row.Pass {
				t.Errorf("clean server: %s, max_refused %+v; want a pass", rep.Result, row)
			}
		default:
			if rep.Result != "fail" || row.Pass || row.ActualValue < 0.1 || row.ActualValue > 0.3 {
				t.Errorf("refusing %v: %s, max_refused %+v; want a failure at about %v", refuse, rep.Result, row, refuse)
			}
			if rep.Deliveries["all"].LossRatio != 0 {
				t.Errorf("refused sends counted as lost deliveries: %v", rep.Deliveries["all"].LossRatio)
			}
		}
	}
}
