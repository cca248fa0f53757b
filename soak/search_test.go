package soak

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// TestSearchFindsTheKnee searches a reference server that delivers at
// most 1,000 messages a second: 10 users in groups of 5, alternating
// direct and group messages, make 2.5 deliveries per message, so the
// server's limit is 40 messages per second per user. The search must find
// it within 10% and say that the delivery latency broke first: below the
// limit nothing waits, above it the queue, and so the latency, grows for
// as long as the step sends.
func TestSearchFindsTheKnee(t *testing.T) {
	if testing.Short() {
		t.Skip("a search of about ten runs; skipped with -short")
	}
	const capacity, perMessage, users = 1000, 2.5, 10
	url, srv := startTarget(t, refserver.Faults{Capacity: capacity})
	r, _ := newTestRunner(t, url)
	p := config.Profile{
		Name: "knee", Users: users, GroupSize: 5, Rate: 5,
		Ramp: 200 * time.Millisecond, Duration: 4 * time.Second, Drain: 3 * time.Second,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Search: config.Search{Vary: config.SearchRate, Max: 400, Factor: 2, Precision: 0.05},
		Thresholds: config.Thresholds{
			MaxLoss: 0.001, MaxLate: 1, P99Ack: time.Second, P99Delivery: 150 * time.Millisecond,
			MinOnlineRatio: 1, MaxDisconnects: 0,
		},
	}
	var steps []report.SearchStep
	rep, err := r.Search(context.Background(), p, nil, func(st report.SearchStep) { steps = append(steps, st) })
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = report.WriteSearchText(&b, rep)
	t.Logf("server queued %d, shed %d\n%s", srv.Stats().CapacityQueued, srv.Stats().CapacityDropped, b.String())
	if rep.Result != report.SearchFound {
		t.Fatalf("result %s: %s", rep.Result, rep.Verdict())
	}
	limit := capacity / perMessage / users
	if math.Abs(rep.Knee-limit) > 0.1*limit {
		t.Errorf("knee %v messages per second per user, the server's limit %v: want it within 10%%", rep.Knee, limit)
	}
	if !slices.ContainsFunc(rep.Broke, func(th report.Threshold) bool { return th.Name == "p99_delivery" }) {
		t.Errorf("first to break %+v, want p99_delivery", rep.Broke)
	}
	if len(steps) != len(rep.Steps) || len(steps) < 5 {
		t.Errorf("%d steps told, %d in the report: want each one, and the climb and the bisection", len(steps), len(rep.Steps))
	}
	// Each step measured what it sent: the knee's step sent about what
	// its value says; above the knee, the server delivered no more than
	// its capacity while the step sent.
	for _, st := range rep.Steps {
		if st.Value > rep.FirstFail && st.DeliveredPerSec > 1.1*capacity {
			t.Errorf("step %v delivered %.0f/s while sending, above the server's %d/s", st.Value, st.DeliveredPerSec, capacity)
		}
		if st.Value == rep.Knee {
			if want := st.Value * users; math.Abs(st.SentPerSec-want) > 0.2*want {
				t.Errorf("step %v sent %.0f/s, want about %.0f", st.Value, st.SentPerSec, want)
			}
		}
	}
}

// TestRecordSearch: a search's result is counted, its knee exported when
// it found one, and its pinned baseline's knee beside it; a search that
// found none leaves the last knee as it was.
func TestRecordSearch(t *testing.T) {
	r, m := newTestRunner(t, "ws://127.0.0.1:1/ws")
	found := &report.Search{Profile: "p", Result: report.SearchFound, Knee: 60, FirstFail: 62.5,
		Comparisons: []report.SearchComparison{
			report.MissingSearchComparison(report.AgainstPrevious, "none"),
			{Comparison: report.Comparison{Against: report.AgainstBaseline, ID: "b",
				Deltas: []report.Delta{{Name: "knee", Unit: "value", Was: 80, Now: 60}}}},
		}}
	r.RecordSearch(found)
	r.RecordSearch(&report.Search{Profile: "p", Result: report.SearchInconclusive, Knee: 20})
	target := r.o.Target
	if v := testutil.ToFloat64(m.SearchKnee.WithLabelValues(target, "p")); v != 60 {
		t.Errorf("knee %v, want 60: an inconclusive search does not replace it", v)
	}
	if v := testutil.ToFloat64(m.SearchBaselineKnee.WithLabelValues(target, "p")); v != 80 {
		t.Errorf("baseline knee %v, want 80", v)
	}
	for result, want := range map[string]float64{report.SearchFound: 1, report.SearchInconclusive: 1, report.SearchNoLimit: 0} {
		if v := testutil.ToFloat64(m.SearchRuns.WithLabelValues(target, "p", result)); v != want {
			t.Errorf("searches %s: %v, want %v", result, v, want)
		}
	}
}
