package canary

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

var secret = []byte("canary-test")

// fixture is a reference server with faults and a canary online against it.
type fixture struct {
	srv  *refserver.Server
	c    *Canary
	m    *metrics.Metrics
	stop func()
}

func newFixture(t *testing.T, f refserver.Faults, deadline time.Duration) *fixture {
	t.Helper()
	srv, err := refserver.New(refserver.Options{Secret: secret, Faults: f})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tctx, stopT := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(tctx, ln) })
	drv, err := reference.New(reference.Options{URL: "ws://" + ln.Addr().String() + "/ws", Secret: secret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewPedanticRegistry())
	c, err := New(Options{
		Connection: engine.Connection{
			Driver:     drv,
			Run:        "r1",
			Heartbeat:  time.Second,
			BackoffMin: 20 * time.Millisecond,
			BackoffMax: 200 * time.Millisecond,
		},
		Metrics:  m,
		Target:   "t",
		Prefix:   "can",
		Users:    4,
		Messages: 1,
		Deadline: deadline,
	})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopP := context.WithCancel(context.Background())
	wg.Go(func() { _ = c.Run(pctx) })
	fx := &fixture{srv: srv, c: c, m: m, stop: func() { stopP(); stopT(); wg.Wait() }}
	t.Cleanup(fx.stop)
	wait, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !c.WaitReady(wait) {
		t.Fatal("canary users never came online")
	}
	return fx
}

func reasons(r *report.Round) map[string][]string {
	out := map[string][]string{}
	for _, ch := range r.Checks {
		out[ch.Kind] = ch.Reasons
	}
	return out
}

func TestRound(t *testing.T) {
	tests := []struct {
		name     string
		faults   refserver.Faults
		deadline time.Duration
		want     string   // result
		reason   string   // a reason every failed check must carry
		kinds    []string // the kinds that must fail
	}{
		{name: "clean target passes", deadline: time.Second, want: metrics.ResultPass},
		{name: "dropped deliveries", faults: refserver.Faults{Drop: 1}, deadline: 300 * time.Millisecond,
			want: metrics.ResultFail, reason: metrics.CanaryNotDelivered, kinds: metrics.Kinds[:]},
		{name: "delivered past the deadline", faults: refserver.Faults{Delay: 400 * time.Millisecond}, deadline: 300 * time.Millisecond,
			want: metrics.ResultFail, reason: metrics.CanaryLate, kinds: metrics.Kinds[:]},
		{name: "duplicated deliveries", faults: refserver.Faults{Duplicate: 1}, deadline: time.Second,
			want: metrics.ResultFail, reason: metrics.CanaryDuplicated, kinds: metrics.Kinds[:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t, tt.faults, tt.deadline)
			r := fx.c.Round(context.Background())
			t.Logf("round: %+v", r.Checks)
			if r.Result != tt.want {
				t.Fatalf("Round().Result = %s, want %s (checks %+v)", r.Result, tt.want, r.Checks)
			}
			got := reasons(r)
			for _, k := range tt.kinds {
				if !slices.Contains(got[k], tt.reason) {
					t.Errorf("%s check reasons = %v, want %q among them", k, got[k], tt.reason)
				}
			}
			for _, ch := range r.Checks {
				if ch.Expected != map[string]int{metrics.KindDirect: 4, metrics.KindGroup: 12}[ch.Kind] {
					t.Errorf("%s check expected %d deliveries, want 4 direct / 12 group", ch.Kind, ch.Expected)
				}
				if tt.want == metrics.ResultPass && ch.Delivered != ch.Expected {
					t.Errorf("%s check delivered %d of %d on a clean target", ch.Kind, ch.Delivered, ch.Expected)
				}
				result := metrics.ResultPass
				if !ch.Pass {
					result = metrics.ResultFail
				}
				if v := metrics.Value(fx.m.CanaryRounds.WithLabelValues("t", ch.Kind, result)); v != 1 {
					t.Errorf("canary_rounds_total{kind=%s,result=%s} = %v, want 1", ch.Kind, result, v)
				}
			}
			wantSuccess := map[string]float64{metrics.ResultPass: 1, metrics.ResultFail: 0}[tt.want]
			if v := metrics.Value(fx.m.CanaryLastSuccess.WithLabelValues("t")); v != wantSuccess {
				t.Errorf("canary_last_round_success = %v, want %v", v, wantSuccess)
			}
			if v := metrics.Value(fx.m.CanaryLastTimestamp.WithLabelValues("t")); v < float64(r.Start.Unix()) {
				t.Errorf("canary_last_round_timestamp_seconds = %v, want ≥ %d", v, r.Start.Unix())
			}
		})
	}
}

// TestRoundSessionDown stops the target under the canary: the next round
// fails with session_down instead of waiting for messages nobody can send.
func TestRoundSessionDown(t *testing.T) {
	fx := newFixture(t, refserver.Faults{}, time.Second)
	fx.srv.Close()
	testwait.For(t, 5*time.Second, "the sessions to notice the target was gone", func() bool { return fx.c.Online() < 4 })
	r := fx.c.Round(context.Background())
	for k, rs := range reasons(r) {
		if !slices.Contains(rs, metrics.CanarySessionDown) {
			t.Errorf("%s reasons = %v, want session_down", k, rs)
		}
	}
	if r.Result != metrics.ResultFail {
		t.Errorf("Result = %s, want fail", r.Result)
	}
}

// TestOverlappingRoundIsSkipped runs a round that waits out its deadline
// (every delivery dropped) and tries another meanwhile: the second is
// skipped and counted, not stacked.
func TestOverlappingRoundIsSkipped(t *testing.T) {
	fx := newFixture(t, refserver.Faults{Drop: 1}, 500*time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fx.c.Round(context.Background())
	}()
	// Until the round holds the canary: a TryLock that succeeds is
	// before it, and is let go at once.
	for fx.c.busy.TryLock() {
		fx.c.busy.Unlock()
		runtime.Gosched()
	}
	if _, err := fx.c.TryRound(context.Background()); !errors.Is(err, ErrBusy) {
		t.Errorf("TryRound during a round = %v, want ErrBusy", err)
	}
	<-done
	if v := metrics.Value(fx.m.CanarySkipped.WithLabelValues("t")); v != 1 {
		t.Errorf("canary_rounds_skipped_total = %v, want 1", v)
	}
	var rounds float64
	for _, k := range metrics.Kinds {
		for _, res := range []string{metrics.ResultPass, metrics.ResultFail} {
			rounds += metrics.Value(fx.m.CanaryRounds.WithLabelValues("t", k, res))
		}
	}
	if rounds != 2 { // one round, two kinds
		t.Errorf("rounds counted = %v, want 2 (one round, both kinds)", rounds)
	}
}
