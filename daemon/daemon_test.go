package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/imcanary/imcanary/config"
)

func TestDriversMatchProtocols(t *testing.T) {
	var names []string
	for n := range drivers {
		names = append(names, n)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(config.Protocols))
	if !slices.Equal(names, want) {
		t.Errorf("drivers = %v, config.Protocols = %v: the two lists must name the same protocols", names, want)
	}
}

func testConfig() config.Config {
	cfg := config.Default()
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Population.Users = 20
	cfg.Population.Ramp = 200 * time.Millisecond
	cfg.Population.Rate = 5
	cfg.Population.Deadline = 2 * time.Second
	cfg.Population.LostAfter = 4 * time.Second
	return cfg
}

// TestRunEndToEnd runs the daemon as `imcanary` with no configuration does:
// an embedded target in-process. It checks readiness, that /metrics shows
// deliveries and no loss, and that shutdown is prompt and leaves no
// goroutine behind.
func TestRunEndToEnd(t *testing.T) {
	before := runtime.NumGoroutine()
	reg := prometheus.NewPedanticRegistry()
	d, err := New(testConfig(), slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	base := "http://" + d.HTTPAddr()
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	waitFor(t, 10*time.Second, "/readyz 200", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })
	waitFor(t, 10*time.Second, "deliveries on /metrics", func() bool {
		return scrape(t, base)["imcanary_deliveries_total"] >= 50
	})
	m := scrape(t, base)
	if m["imcanary_deliveries_lost_total"] != 0 || m["imcanary_sessions_online"] != 20 {
		t.Errorf("lost = %v, online = %v, want 0 and 20", m["imcanary_deliveries_lost_total"], m["imcanary_sessions_online"])
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	case <-time.After(ShutdownTimeout + time.Second):
		t.Fatal("Run did not return within the shutdown timeout")
	}
	t.Logf("shutdown took %v", time.Since(start))
	if n := m["imcanary_session_disconnects_total"]; n != 0 {
		t.Errorf("disconnects before shutdown = %v, want 0", n)
	}
	waitFor(t, 3*time.Second, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

func TestFileLimit(t *testing.T) {
	cfg := testConfig()
	cfg.Population.Users = 1_000_000
	_, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err == nil || !strings.Contains(err.Error(), "RLIMIT_NOFILE") || !strings.Contains(err.Error(), "population.users") {
		t.Errorf("New(users 1e6) = %v, want an error naming population.users and RLIMIT_NOFILE", err)
	}
}

func TestSecretFileErrors(t *testing.T) {
	cfg := testConfig()
	cfg.Target.SecretFile = t.TempDir() + "/missing"
	if _, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry()); err == nil ||
		!strings.Contains(err.Error(), "target.secret_file") {
		t.Errorf("New(missing secret file) = %v, want an error naming target.secret_file", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape sums every sample of each imcanary metric family.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			switch {
			case m.Counter != nil:
				out[name] += m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] += m.Gauge.GetValue()
			}
		}
	}
	return out
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
