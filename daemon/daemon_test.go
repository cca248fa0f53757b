package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/protocols"
)

func testConfig(t *testing.T) config.Config {
	cfg := protocols.Loader().Default()
	cfg.DataDir = t.TempDir()
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Population.Users = 20
	cfg.Population.Ramp = 200 * time.Millisecond
	cfg.Population.Rate = 5
	cfg.Population.Deadline = 2 * time.Second
	cfg.Population.LostAfter = 4 * time.Second
	return cfg
}

// TestRunEndToEnd runs the daemon as `imcanary` with no configuration does:
// a reference server in-process. It checks readiness, that /metrics shows
// deliveries and no loss, and that shutdown is prompt and leaves no
// goroutine behind.
func TestRunEndToEnd(t *testing.T) {
	before := runtime.NumGoroutine()
	reg := prometheus.NewPedanticRegistry()
	d, err := New(testConfig(t), slog.New(slog.DiscardHandler), reg)
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
	testwait.For(t, 10*time.Second, "/readyz 200", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })
	testwait.For(t, 10*time.Second, "deliveries on /metrics", func() bool {
		return scrape(t, base)["imcanary_deliveries_total"] >= 50
	})
	m := scrape(t, base)
	if m["imcanary_deliveries_lost_total"] != 0 || m[`imcanary_sessions_online{source="background"}`] != 20 {
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
	testwait.For(t, 3*time.Second, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

func TestFileLimit(t *testing.T) {
	cfg := testConfig(t)
	cfg.Population.Users = 1_000_000
	_, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err == nil || !strings.Contains(err.Error(), "RLIMIT_NOFILE") || !strings.Contains(err.Error(), "population.users") {
		t.Errorf("New(users 1e6) = %v, want an error naming population.users and RLIMIT_NOFILE", err)
	}
}

func TestSecretFileErrors(t *testing.T) {
	cfg := testConfig(t)
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
			var v float64
			switch {
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			}
			out[name] += v
			// Also by source, the label that splits cohorts, and by
			// the few labels tests look at one value of.
			for _, l := range m.Label {
				switch l.GetName() {
				case "source", "reason", "result":
					out[name+`{`+l.GetName()+`="`+l.GetValue()+`"}`] += v
				}
			}
		}
	}
	return out
}

// TestScheduledJobsAndHistory runs the daemon with a canary every second
// and a soak profile every few seconds: rounds and runs appear in the
// history and the API, the soak report is served, and the history is still
// there after the daemon restarts on the same data directory.
func TestScheduledJobsAndHistory(t *testing.T) {
	cfg := testConfig(t)
	cfg.Canary = config.Canary{Schedule: "@every 1s", Deadline: time.Second, Users: 3, Messages: 1}
	cfg.Soak.Profiles = []config.Profile{{
		Name: "tiny", Schedule: "@every 3s", Users: 6, GroupSize: 3, Rate: 5,
		Ramp: 100 * time.Millisecond, Duration: time.Second, Drain: 2 * time.Second,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Thresholds: config.Thresholds{MaxLoss: 0.01, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second, MinOnlineRatio: 1},
	}}

	start := func() (string, func()) {
		d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return runDaemon(t, d)
	}
	base, stop := start()
	var st Status
	testwait.For(t, 20*time.Second, "a canary round and a soak run in /api/v1/status", func() bool {
		getJSON(t, base+"/api/v1/status", &st)
		return len(st.Canary.Rounds) > 0 && len(st.Soak.Runs) > 1
	})
	if r := st.Canary.Rounds[0]; r.Result != "pass" {
		t.Errorf("canary round = %+v, want pass on a clean target", r)
	}
	run := st.Soak.Runs[0]
	if run.Result != "pass" || run.Profile != "tiny" {
		t.Errorf("soak run = %+v, want a passing run of tiny", run)
	}
	if code, body := get(t, base+"/runs/"+run.ID+"/report.html"); code != 200 || !strings.Contains(body, "<svg") {
		t.Errorf("report.html = %d, want 200 with charts", code)
	}
	var rep map[string]any
	getJSON(t, base+"/api/v1/runs/"+run.ID, &rep)
	if rep["id"] != run.ID {
		t.Errorf("/api/v1/runs/%s id = %v", run.ID, rep["id"])
	}
	// A scheduled run is compared with the one before it, as a one-shot is.
	if cs, _ := rep["comparisons"].([]any); len(cs) == 0 {
		t.Errorf("/api/v1/runs/%s has no comparisons, want one with the previous run %s", run.ID, st.Soak.Runs[1].ID)
	} else if c, _ := cs[0].(map[string]any); c["against"] != "previous" || c["id"] != st.Soak.Runs[1].ID {
		t.Errorf("/api/v1/runs/%s comparisons[0] = against %v id %v, want the previous run %s", run.ID, c["against"], c["id"], st.Soak.Runs[1].ID)
	}
	if code, body := get(t, base+"/"); code != 200 || !strings.Contains(body, "tiny") {
		t.Errorf("status page = %d, want 200 naming the profile", code)
	}
	m := scrape(t, base)
	if m[`imcanary_canary_rounds_total`] == 0 || m[`imcanary_soak_runs_total`] == 0 {
		t.Errorf("canary rounds %v, soak runs %v in metrics, want both counted", m[`imcanary_canary_rounds_total`], m[`imcanary_soak_runs_total`])
	}
	stop()

	// A restart on the same data directory keeps the history.
	cfg.Canary.Schedule, cfg.Soak.Profiles[0].Schedule = "", ""
	base, stop = start()
	defer stop()
	var again Status
	getJSON(t, base+"/api/v1/status", &again)
	if len(again.Soak.Runs) == 0 || again.Soak.Runs[0].ID != run.ID || len(again.Canary.Rounds) == 0 {
		t.Errorf("after restart: %d soak runs, %d canary rounds; want the history kept", len(again.Soak.Runs), len(again.Canary.Rounds))
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body := get(t, url)
	if code != 200 {
		t.Fatalf("GET %s = %d: %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// runDaemon runs d until stop is called or the test ends, and returns its
// base URL. Stop waits for Run, which must return nil.
func runDaemon(t *testing.T, d *Daemon) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() = %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return "http://" + d.HTTPAddr(), stop
}

// TestDevicesAndMix: a daemon whose users have two devices each and are a
// behaviour mix with a group layout counts sessions, not users, everywhere
// it says how many are online, and loses nothing on a clean target.
func TestDevicesAndMix(t *testing.T) {
	cfg := testConfig(t)
	cfg.Canary.Schedule = ""
	cfg.Population.Users, cfg.Population.Devices = 10, 2
	cfg.Population.Groups = "2x5,1x10"
	cfg.Population.Behaviours = []config.Behaviour{
		{Name: "talker", Share: 0.5, Rate: 5},
		{Name: "lurker", Share: 0.5},
	}
	reg := prometheus.NewPedanticRegistry()
	d, err := New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	base, stop := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "/readyz 200", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })
	if _, body := get(t, base+"/readyz"); !strings.Contains(body, "20 of 20 sessions online") {
		t.Errorf("/readyz = %q, want 20 of 20 sessions online: 10 users with 2 devices each", body)
	}
	m := scrape(t, base)
	if got := m[`imcanary_sessions_wanted{source="background"}`]; got != 20 {
		t.Errorf("imcanary_sessions_wanted = %v, want 20", got)
	}
	testwait.For(t, 10*time.Second, "deliveries", func() bool { return scrape(t, base)["imcanary_deliveries_total"] > 100 })
	stop()
	lost := gathered(t, reg, "imcanary_deliveries_lost_total", "source", "background")
	delivered := gathered(t, reg, "imcanary_deliveries_total", "source", "background")
	if lost != 0 || delivered == 0 {
		t.Errorf("background delivered %v, lost %v: want deliveries and no loss", delivered, lost)
	}
}
