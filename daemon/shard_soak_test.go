package daemon

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/soak"
)

// TestShardSoakReportsMerge: two daemons, shards 0/2 and 1/2, run one
// scheduled soak profile at the same moment. Each stored report names
// its shard, and the two merge into one run whose counts are their sums.
func TestShardSoakReportsMerge(t *testing.T) {
	var ds [2]*Daemon
	for i := range ds {
		cfg := testConfig(t)
		cfg.Shard = fmt.Sprintf("%d/2", i)
		cfg.Population.Users = 4
		cfg.Canary.Schedule = ""
		cfg.Soak.Profiles = []config.Profile{{
			Name: "tiny", Schedule: "@every 2s", Users: 6, GroupSize: 3, Rate: 5,
			Ramp: 100 * time.Millisecond, Duration: 3 * time.Second, Drain: 2 * time.Second,
			Deadline: time.Second, LostAfter: 2 * time.Second,
			Thresholds: config.Thresholds{MaxLoss: 0.01, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second, MinOnlineRatio: 1},
		}}
		d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ds[i] = d
	}
	// Both schedules start together: "@every" counts from each daemon's
	// start.
	var bases [2]string
	for i, d := range ds {
		bases[i], _ = runDaemon(t, d)
	}
	var reps []*report.Soak
	for i, base := range bases {
		var st Status
		testwait.For(t, 30*time.Second, fmt.Sprintf("shard %d's first soak run", i), func() bool {
			getJSON(t, base+"/api/v1/status", &st)
			return len(st.Soak.Runs) > 0 && st.Soak.Runs[len(st.Soak.Runs)-1].Result != ""
		})
		first := st.Soak.Runs[len(st.Soak.Runs)-1]
		code, body := get(t, base+"/api/v1/runs/"+first.ID)
		if code != 200 {
			t.Fatalf("shard %d: GET run %s = %d", i, first.ID, code)
		}
		r, err := report.ReadJSON(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%d/2", i); r.Shard != want || len(r.Histograms) == 0 {
			t.Errorf("shard %d's report: shard %q, %d histograms; want %q and its histograms", i, r.Shard, len(r.Histograms), want)
		}
		reps = append(reps, r)
	}
	t.Logf("the shards' first runs started %v apart", reps[1].Start.Sub(reps[0].Start))
	m, err := soak.Merge(reps)
	if err != nil {
		t.Fatalf("merging the shards' first runs (started %v and %v): %v", reps[0].Start, reps[1].Start, err)
	}
	a, b := reps[0].Deliveries["all"], reps[1].Deliveries["all"]
	if got := m.Deliveries["all"]; got.Expected != a.Expected+b.Expected || got.Delivered != a.Delivered+b.Delivered || got.Expected == 0 {
		t.Errorf("merged deliveries %+v, want the sums of %+v and %+v", got, a, b)
	}
	if m.Users.Configured != 12 || m.Result != soakResult(reps) {
		t.Errorf("merged users %+v, result %s; want 12 users and the shards' common result", m.Users, m.Result)
	}
}

// soakResult is the result the shards share, or "mixed".
func soakResult(rs []*report.Soak) string {
	for _, r := range rs[1:] {
		if r.Result != rs[0].Result {
			return "mixed"
		}
	}
	return rs[0].Result
}
