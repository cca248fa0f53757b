package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/history"
)

// TestSecondDaemonRefused starts two daemons on one data_dir: the second
// is refused at New, naming the directory and the first, and a daemon
// starts there again once the first has stopped.
func TestSecondDaemonRefused(t *testing.T) {
	cfg := testConfig(t)
	cfg.Population.Users = 2
	first, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()

	second, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	le, ok := errors.AsType[*history.LockedError](err)
	if !ok {
		if second != nil {
			second.target.Close()
			second.httpLn.Close()
		}
		t.Fatalf("New() on the data_dir of a running daemon = %v, want a *history.LockedError", err)
	}
	if le.Holder == nil || le.Holder.PID != os.Getpid() || le.Holder.Command != "imcanary run" {
		t.Errorf("the refused daemon names %+v, want pid %d, %q", le.Holder, os.Getpid(), "imcanary run")
	}
	if !strings.Contains(err.Error(), "data_dir "+cfg.DataDir+" is in use") {
		t.Errorf("New() = %q, want it to name data_dir %s", err, cfg.DataDir)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	third, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatalf("New() after the first daemon stopped = %v, want a daemon", err)
	}
	third.target.Close()
	third.httpLn.Close()
	third.lock.Release()
}
