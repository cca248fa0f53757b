package daemon

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestScheduledSearch: a profile with a search on a schedule runs as a
// search in the daemon. Against a target that delays every delivery by
// 300 ms, with a p99 limit of 100 ms, every step fails: the search ends
// below its start, its result is counted on /metrics, and it is kept in
// the history; its failed steps are not counted as failed soak runs,
// which would page someone for a search doing its job.
func TestScheduledSearch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("search-secret")
	srv, _ := serveTarget(t, ln, secret)
	srv.SetFaults(refserver.Faults{Delay: 300 * time.Millisecond})
	cfg := testConfig(t)
	cfg.Target.URL = "ws://" + ln.Addr().String() + "/ws"
	cfg.Target.SecretFile = filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(cfg.Target.SecretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Canary.Schedule = ""
	cfg.Soak.Profiles = []config.Profile{{
		Name: "limit", Schedule: "@every 2s", Users: 6, GroupSize: 3, Rate: 5,
		Ramp: 100 * time.Millisecond, Duration: time.Second, Drain: time.Second,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Thresholds: config.Thresholds{MaxLoss: 0.01, MaxLate: 1, P99Ack: time.Second, P99Delivery: 100 * time.Millisecond, MinOnlineRatio: 1},
		Search:     config.Search{Vary: config.SearchRate, Max: 10, Factor: 2, Precision: 0.1},
	}}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, stop := runDaemon(t, d)
	var m map[string]float64
	testwait.For(t, 60*time.Second, "a search counted on /metrics", func() bool {
		m = scrape(t, base)
		return m[`imcanary_search_runs_total{result="below_start"}`] >= 1
	})
	// The status page lists it, and serves its page and its JSON.
	var st Status
	getJSON(t, base+"/api/v1/status", &st)
	if len(st.Soak.Searches) == 0 || st.Soak.Searches[0].Result != "below_start" || st.Soak.Searches[0].Profile != "limit" {
		t.Fatalf("status searches %+v, want the below_start search of limit", st.Soak.Searches)
	}
	id := st.Soak.Searches[0].ID
	if code, body := get(t, base+"/searches/"+id+"/report.html"); code != 200 || !strings.Contains(body, "<svg") || !strings.Contains(body, "BELOW START") {
		t.Errorf("search page = %d, want 200 with its charts and result", code)
	}
	var js map[string]any
	getJSON(t, base+"/api/v1/searches/"+id, &js)
	if js["id"] != id || js["kind"] != "search" {
		t.Errorf("/api/v1/searches/%s = id %v kind %v", id, js["id"], js["kind"])
	}
	if code, _ := get(t, base+"/api/v1/searches/nope"); code != 404 {
		t.Errorf("/api/v1/searches/nope = %d, want 404", code)
	}
	if code, body := get(t, base+"/"); code != 200 || !strings.Contains(body, "searches/"+id+"/report.html") {
		t.Errorf("status page = %d, want a link to the search", code)
	}
	stop()
	if n := m[`imcanary_soak_runs_total{result="fail"}`]; n != 0 {
		t.Errorf("%v failed soak runs counted: a search's steps are not soak runs", n)
	}
	if n := m[`imcanary_search_runs_total{result="found"}`] + m[`imcanary_search_runs_total{result="no_limit"}`]; n != 0 {
		t.Errorf("%v searches found a knee against a target that fails every step", n)
	}
	store, err := history.Open(cfg.DataDir, history.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := os.ReadDir(filepath.Join(cfg.DataDir, "searches"))
	if err != nil || len(ids) == 0 {
		t.Fatalf("no search in the history: %v", err)
	}
	s, err := store.Search(ids[0].Name()[:len(ids[0].Name())-len(".json")])
	if err != nil {
		t.Fatal(err)
	}
	if s.Result != "below_start" || len(s.Steps) == 0 || s.Steps[0].Result != "fail" || len(s.Comparisons) != 2 {
		t.Errorf("search in the history: %s, %d steps, %d comparisons; want below_start after a failed step, compared twice", s.Result, len(s.Steps), len(s.Comparisons))
	}
}
