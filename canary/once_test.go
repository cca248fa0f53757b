package canary

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/protocols"
)

// TestOnceSaysWhy: `imcanary canary --once` against a closed port fails
// with session_down, counts what the round owed (0 of 4, not 0 of 0) and
// says why in words.
func TestOnceSaysWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	cfg := protocols.Loader().Default()
	cfg.DataDir = t.TempDir()
	cfg.Target.URL = "ws://" + closed + "/ws"
	cfg.Population.Backoff = config.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}
	r, err := Once(context.Background(), cfg, slog.New(slog.DiscardHandler), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	users, msgs := cfg.Canary.Users, cfg.Canary.Messages
	want := map[string]int{metrics.KindDirect: users * msgs, metrics.KindGroup: users * msgs * (users - 1)}
	for _, ch := range r.Checks {
		if ch.Pass || ch.Delivered != 0 || ch.Expected != want[ch.Kind] || !slices.Contains(ch.Reasons, metrics.CanarySessionDown) {
			t.Errorf("%s check = %+v, want a failure 0/%d with session_down", ch.Kind, ch, want[ch.Kind])
		}
	}
	wantCause := fmt.Sprintf("%d of %d canary users offline: target unreachable: connection refused (dial tcp", users, users)
	if r.Result != metrics.ResultFail || !strings.HasPrefix(r.Cause, wantCause) {
		t.Errorf("round = %s, cause %q, want fail with a cause starting %q", r.Result, r.Cause, wantCause)
	}
}

// TestOnceInProcess: with no target.url, one round against a reference
// server in this process passes, and the users log out after it.
func TestOnceInProcess(t *testing.T) {
	before := runtime.NumGoroutine()
	cfg := protocols.Loader().Default()
	cfg.DataDir = t.TempDir()
	r, err := Once(context.Background(), cfg, slog.New(slog.DiscardHandler), 10*time.Second)
	if err != nil || r.Result != metrics.ResultPass {
		t.Fatalf("Once = %+v, %v; want pass", r, err)
	}
	// Sessions, server and monitor stop before Once returns; only the
	// runtime's own goroutines may take a moment to go.
	defer func() {
		if t.Failed() {
			buf := make([]byte, 1<<20)
			t.Logf("goroutines after Once:\n%s", buf[:runtime.Stack(buf, true)])
		}
	}()
	testwait.For(t, 3*time.Second, fmt.Sprintf("the goroutines back to the %d before Once", before), func() bool { return runtime.NumGoroutine() <= before })
}
