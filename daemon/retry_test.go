package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
)

// retryRig is a retrier whose rounds are recorded, on a schedule of
// interval with rounds of span, under synctest's clock.
type retryRig struct {
	r    *retrier
	logs *bytes.Buffer

	mu sync.Mutex
	// at are the times retry rounds started; concurrent the most that ran
	// at once; left how many retries were left to the schedule.
	at               []time.Time
	running, maxConc int
	left             int
	// pass is the outcome of the next retry rounds; hold how long each
	// takes.
	pass bool
	hold time.Duration
}

func newRetryRig(after, interval, span time.Duration) *retryRig {
	g := &retryRig{logs: &bytes.Buffer{}}
	start := time.Now()
	g.r = newRetrier(
		func() time.Duration { return after },
		func(t time.Time) time.Time {
			// Fires at start + k·interval.
			k := t.Sub(start)/interval + 1
			return start.Add(k * interval)
		},
		func() time.Duration { return span },
		func(ctx context.Context) {
			g.mu.Lock()
			g.at = append(g.at, time.Now())
			g.running++
			g.maxConc = max(g.maxConc, g.running)
			pass, hold := g.pass, g.hold
			g.mu.Unlock()
			time.Sleep(hold)
			g.mu.Lock()
			g.running--
			g.mu.Unlock()
			g.r.ended(time.Now(), pass)
		},
		func() { g.mu.Lock(); g.left++; g.mu.Unlock() },
		slog.New(slog.NewTextHandler(g.logs, nil)))
	return g
}

func (g *retryRig) rounds() []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Time(nil), g.at...)
}

// run starts the retrier and returns the func that stops it and waits.
func (g *retryRig) run() func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.r.run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// TestRetryAfterFailure checks that a failed round brings one retry at
// exactly retry_after, and that a passing one brings none.
func TestRetryAfterFailure(t *testing.T) {
	const after, interval, span = 10 * time.Second, time.Minute, 3 * time.Second
	synctest.Test(t, func(t *testing.T) {
		g := newRetryRig(after, interval, span)
		g.pass = true
		stop := g.run()
		defer stop()

		end := time.Now()
		if due := g.r.ended(end, false); !due.Equal(end.Add(after)) {
			t.Errorf("ended(fail) = %v, want the retry due at %v", due, end.Add(after))
		}
		time.Sleep(after - time.Nanosecond)
		synctest.Wait()
		if got := g.rounds(); len(got) != 0 {
			t.Fatalf("retry rounds before retry_after = %v, want none", got)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if got := g.rounds(); len(got) != 1 || !got[0].Equal(end.Add(after)) {
			t.Fatalf("retry rounds = %v, want one at %v (retry_after after the failure)", got, end.Add(after))
		}
		// The retry passed: back to the schedule, nothing more.
		time.Sleep(10 * interval)
		synctest.Wait()
		if got := g.rounds(); len(got) != 1 {
			t.Errorf("retry rounds after a passing retry = %d, want 1", len(got))
		}
		if !strings.Contains(g.logs.String(), "canary retry round") {
			t.Errorf("logs = %q, want a line for the retry round", g.logs)
		}

		// A passing scheduled round brings no retry.
		if due := g.r.ended(time.Now(), true); !due.IsZero() {
			t.Errorf("ended(pass) = %v, want no retry", due)
		}
		time.Sleep(10 * interval)
		synctest.Wait()
		if got := g.rounds(); len(got) != 1 {
			t.Errorf("retry rounds after a passing round = %d, want still 1", len(got))
		}
	})
}

// TestRetryOff checks that retry_after 0 never retries.
func TestRetryOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRetryRig(0, time.Minute, time.Second)
		stop := g.run()
		defer stop()
		if due := g.r.ended(time.Now(), false); !due.IsZero() {
			t.Errorf("ended(fail) with retry_after 0 = %v, want no retry", due)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := g.rounds(); len(got) != 0 {
			t.Errorf("retry rounds with retry_after 0 = %v, want none", got)
		}
	})
}

// TestRetryNoPileUp fails rounds that take longer than retry_after: the
// retries come one at a time, each retry_after after the last ended,
// however many failures arrive while one runs; a pass stops them; a
// scheduled round that starts takes the pending retry's place; and a retry
// that would still run when the next scheduled round is due is left to it.
func TestRetryNoPileUp(t *testing.T) {
	const after, interval, span = 2 * time.Second, time.Minute, 4 * time.Second
	synctest.Test(t, func(t *testing.T) {
		g := newRetryRig(after, interval, span)
		g.hold = span // each retry round takes its whole span
		stop := g.run()
		defer stop()
		start := time.Now()
		at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))); synctest.Wait() }

		g.r.ended(start, false)
		// Failures of other rounds while the first retry runs (+2s to
		// +6s): each would be due at +5s, inside it.
		at(3 * time.Second)
		for range 5 {
			g.r.ended(time.Now(), false)
		}
		// The running retry's own failure at +6s replaced them: +8s, and
		// so on, one every after + span.
		at(27 * time.Second)
		g.mu.Lock()
		g.pass = true // from the next retry on
		g.mu.Unlock()
		at(59 * time.Second)
		got := g.rounds()
		g.mu.Lock()
		maxConc, left := g.maxConc, g.left
		g.mu.Unlock()
		if maxConc != 1 {
			t.Errorf("retry rounds at once = %d, want 1", maxConc)
		}
		// +2, +8, +14, +20, +26 failed; +32 passed, and nothing after.
		var want []time.Duration
		for k := range 6 {
			want = append(want, after+time.Duration(k)*(after+span))
		}
		if !slices.Equal(offsets(got, start), want) {
			t.Errorf("retry rounds at %v, want %v", offsets(got, start), want)
		}

		// A scheduled round starting now answers for the pending retry.
		g.r.ended(time.Now(), false)
		g.r.superseded()
		at(100 * time.Second)
		if n := len(g.rounds()); n != len(want) {
			t.Errorf("retry rounds after a scheduled round took over = %d, want %d", n, len(want))
		}

		// A failure at +115s: its retry, due at +117s, would run past
		// the scheduled round at +120s.
		at(115 * time.Second)
		g.r.ended(time.Now(), false)
		at(125 * time.Second)
		g.mu.Lock()
		left = g.left
		g.mu.Unlock()
		if left != 1 || len(g.rounds()) != len(want) {
			t.Errorf("a retry due %v before the scheduled round: left %d, rounds %d; want it left to the schedule, no round",
				interval*2-117*time.Second, left, len(g.rounds()))
		}
		if !strings.Contains(g.logs.String(), "left to the scheduled round") {
			t.Errorf("logs = %q, want a line saying the retry was left to the scheduled round", g.logs)
		}
	})
}

func offsets(ts []time.Time, from time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(from)
	}
	return out
}

// TestDaemonRetriesFailedRound runs the daemon against a target that is
// down, on a schedule too slow to fire during the test: a failed round
// brings a retry round canary.retry_after after it ended, announced on
// imcanary_canary_next_round_timestamp_seconds, which fails too and brings
// the next.
func TestDaemonRetriesFailedRound(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + addr + "/ws"
	cfg.Canary = config.Canary{Schedule: "@every 1h", Deadline: 200 * time.Millisecond, Users: 2, Messages: 1, RetryAfter: 300 * time.Millisecond}
	cfg.Population.Users = 2
	var logs syncBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	testwait.For(t, 10*time.Second, "the jobs context", func() bool { d.curMu.RLock(); defer d.curMu.RUnlock(); return d.jobs != nil })
	d.curMu.RLock()
	jobs := d.jobs
	d.curMu.RUnlock()

	d.canaryRound(jobs, false)
	first := d.lastRound.Load()
	if first == nil || first.Result != metrics.ResultFail {
		t.Fatalf("the round against a target that is down = %+v, want it failed", first)
	}
	due := d.retry.pending()
	next := time.Unix(0, int64(metrics.Value(d.metrics.CanaryNextRound.WithLabelValues(cfg.Target.Name))*1e9))
	if due.IsZero() || !due.Equal(first.End.Add(cfg.Canary.RetryAfter)) {
		t.Errorf("retry due %v, want %v: canary.retry_after after the failed round", due, first.End.Add(cfg.Canary.RetryAfter))
	} else if d := next.Sub(due); d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("imcanary_canary_next_round_timestamp_seconds = %v, want the retry's %v", next, due)
	}
	testwait.For(t, 10*time.Second, "the retry round", func() bool { r := d.lastRound.Load(); return r != first })
	retry := d.lastRound.Load()
	if retry.Start.Before(first.End.Add(cfg.Canary.RetryAfter)) {
		t.Errorf("retry round started %v after the failed one ended, want at least canary.retry_after %v",
			retry.Start.Sub(first.End), cfg.Canary.RetryAfter)
	}
	if !strings.Contains(logs.String(), "canary retry round") {
		t.Errorf("logs = %q, want the retry round's line", logs.String())
	}
}
