package daemon

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/canary"
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
)

// TestCanaryTargetDownFromStart: a target that is down from the daemon's
// start must make scheduled canary rounds fail with session_down, not
// vanish, or no alert on failing rounds could ever fire.
func TestCanaryTargetDownFromStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + addr + "/ws"
	cfg.Canary = config.Canary{Schedule: "@every 1s", Deadline: time.Second, Users: 3, Messages: 1}
	cfg.Population.Backoff.Initial = 100 * time.Millisecond
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "a failed canary round", func() bool {
		return scrape(t, base)[`imcanary_canary_failures_total`] > 0
	})
	for _, k := range metrics.Kinds {
		if v := metrics.Value(d.metrics.CanaryFailures.WithLabelValues(cfg.Target.Name, k, metrics.CanarySessionDown)); v == 0 {
			t.Errorf("%s failures{reason=session_down} = 0, want the rounds failed for that reason", k)
		}
	}
}

// TestCanaryOnceBesideDaemon runs a pipeline's `imcanary canary --once`
// with the daemon's own configuration while the daemon's canary runs
// against the same healthy target: the two cohorts must not log each other
// out, so both pass.
func TestCanaryOnceBesideDaemon(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = serveTarget(t, ln, nil)

	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + ln.Addr().String() + "/ws"
	cfg.Canary = config.Canary{Schedule: "@every 1s", Deadline: 500 * time.Millisecond, Users: 3, Messages: 1}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	rounds := func(result string) float64 {
		var n float64
		for _, k := range metrics.Kinds {
			n += metrics.Value(d.metrics.CanaryRounds.WithLabelValues(cfg.Target.Name, k, result))
		}
		return n
	}
	testwait.For(t, 10*time.Second, "a daemon canary round", func() bool { return rounds(metrics.ResultPass) > 0 })

	r, err := canary.Once(context.Background(), cfg, slog.New(slog.DiscardHandler), 10*time.Second)
	if err != nil || r.Result != metrics.ResultPass {
		t.Fatalf("canary.Once beside the daemon = %+v, %v; want pass", r, err)
	}
	passed := rounds(metrics.ResultPass)
	testwait.For(t, 10*time.Second, "another daemon round", func() bool { return rounds(metrics.ResultPass)+rounds(metrics.ResultFail) > passed })
	if f := rounds(metrics.ResultFail); f != 0 {
		t.Errorf("daemon canary failed %v rounds while a one-shot ran beside it", f)
	}
}

// TestCanaryNextRound: imcanary_canary_next_round_timestamp_seconds says
// when the next round is due, from the start on and after every round, so
// that an alert can tell a canary that stopped.
func TestCanaryNextRound(t *testing.T) {
	cfg := testConfig(t)
	cfg.Canary = config.Canary{Schedule: "@every 2s", Deadline: 500 * time.Millisecond, Users: 3, Messages: 1}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	base, _ := runDaemon(t, d)
	next := func() time.Time {
		v := scrape(t, base)["imcanary_canary_next_round_timestamp_seconds"]
		return time.Unix(0, int64(v*1e9))
	}
	testwait.For(t, 5*time.Second, "the next round's time", func() bool { return !next().IsZero() && next().After(start) })
	first := next()
	if first.After(start.Add(2*time.Second + time.Second)) {
		t.Errorf("next round due %v after the start, want within the 2s schedule", first.Sub(start))
	}
	testwait.For(t, 15*time.Second, "a round, and the next one's time", func() bool { return next().After(first) })
	var st Status
	getJSON(t, base+"/api/v1/status", &st)
	if st.Canary.Next.IsZero() || st.Canary.Next.Before(time.Now().Add(-time.Second)) {
		t.Errorf("status canary next = %v, want a time due", st.Canary.Next)
	}
}
