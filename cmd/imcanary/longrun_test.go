package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestLongRun is a time-compressed soak of the whole daemon: hours of
// uptime's worth of logins, messages, canary rounds and soak runs in a few
// minutes, against a reference server in a process of its own. 400 users
// send 4 messages a second each with 500 ms deadlines, every session ends
// after 10 s on average and logs in again (churn), the canary runs every
// 2 s and a soak profile every 20 s. Every 10 s it samples imcanary's
// resident memory, goroutines, open files and Go heap, prints the series,
// and checks that after a minute's warm-up none of them grows: memory must
// follow what is in flight, never uptime.
//
// It takes as long as IMCANARYTEST_LONGRUN says (at least 3m), so it runs
// only when asked: IMCANARYTEST_LONGRUN=5m go test -run LongRun -v ./cmd/imcanary/
func TestLongRun(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("IMCANARYTEST_LONGRUN"))
	if err != nil {
		t.Skip("set IMCANARYTEST_LONGRUN to a duration, such as 5m, to run it")
	}
	d = max(d, 3*time.Minute)
	const warmup = time.Minute
	bin := binary(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("longrun-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startRefserver(t, bin, "--secret-file", secret)
	cfg := filepath.Join(t.TempDir(), "imcanary.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
target: {url: %q, secret_file: %q}
data_dir: %q
population: {users: 400, rate: 4, ramp: 5s, heartbeat: 2s, deadline: 500ms, lost_after: 1s, session_lifetime: 10s}
canary: {schedule: "@every 2s", jitter: 0s, deadline: 500ms, users: 4}
history: {max_runs: 20, max_canary_rounds: 200}
soak:
  profiles:
    - {name: churn, schedule: "@every 20s", users: 100, group_size: 5, rate: 4, ramp: 1s, duration: 10s, drain: 2s}
`, url, secret, t.TempDir())), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	imc := exec.Command(bin, "run", "--config", cfg, "--http.listen", addr, "--log.level", "warn")
	imc.Stderr = &prefixWriter{t: t, prefix: "imcanary: "}
	if err := imc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = imc.Process.Signal(os.Interrupt); _ = imc.Wait() }()

	type sample struct {
		at                         time.Duration
		rss, heap, goroutines, fds float64
		logins, deliveries, lost   float64
	}
	var series []sample
	start := time.Now()
	for time.Since(start) < d {
		time.Sleep(10 * time.Second)
		fams, err := scrape(addr)
		if err != nil {
			t.Fatalf("scrape at %v: %v", time.Since(start).Round(time.Second), err)
		}
		series = append(series, sample{
			at: time.Since(start).Round(time.Second), rss: value(fams, "process_resident_memory_bytes"),
			heap: value(fams, "go_memstats_heap_inuse_bytes"), goroutines: value(fams, "go_goroutines"),
			fds: value(fams, "process_open_fds"), logins: value(fams, "imcanary_session_connects_total", "result", "success"),
			deliveries: value(fams, "imcanary_deliveries_total"), lost: value(fams, "imcanary_deliveries_lost_total"),
		})
	}
	t.Logf("%8s %9s %9s %10s %6s %8s %11s %6s", "uptime", "RSS MiB", "heap MiB", "goroutines", "fds", "logins", "deliveries", "lost")
	for _, s := range series {
		t.Logf("%8v %9.1f %9.1f %10.0f %6.0f %8.0f %11.0f %6.0f", s.at, s.rss/(1<<20), s.heap/(1<<20), s.goroutines, s.fds, s.logins, s.deliveries, s.lost)
	}
	// Flat after warm-up: the later samples stay within a margin of the
	// highest of the first minute after it. Churn and soak runs make the
	// figures swing, never climb.
	var base sample
	var later []sample
	for _, s := range series {
		switch {
		case s.at <= warmup:
		case s.at <= 2*warmup:
			base.rss, base.heap = max(base.rss, s.rss), max(base.heap, s.heap)
			base.goroutines, base.fds = max(base.goroutines, s.goroutines), max(base.fds, s.fds)
		default:
			later = append(later, s)
		}
	}
	for _, s := range later {
		if s.rss > base.rss*1.25 || s.heap > base.heap*1.5 || s.goroutines > base.goroutines*1.15 || s.fds > base.fds*1.15 {
			t.Errorf("at %v: RSS %.1f MiB, heap %.1f MiB, %v goroutines, %v fds; the second minute's highest were %.1f, %.1f, %v, %v: growing with uptime",
				s.at, s.rss/(1<<20), s.heap/(1<<20), s.goroutines, s.fds, base.rss/(1<<20), base.heap/(1<<20), base.goroutines, base.fds)
		}
	}
	if last := series[len(series)-1]; last.logins < 400*float64(d/(10*time.Second))/2 {
		t.Errorf("%v logins in %v, want churn to have logged every user in many times", last.logins, d)
	}
}
