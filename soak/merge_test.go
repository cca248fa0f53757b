package soak

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// mergeProfile is testProfile at a quarter of its rate, with thresholds
// that only loss can fail: three shards at once load the machine three
// times as much, and the merge tests judge the sums, not the server.
func mergeProfile() config.Profile {
	p := testProfile()
	p.Rate, p.Deadline, p.LostAfter = 5, 3*time.Second, 6*time.Second
	p.Thresholds = config.Thresholds{MaxLoss: 0.001, MaxLate: 1, MaxRefused: 1, P99Ack: time.Minute, P99Delivery: time.Minute, MaxDisconnects: 1 << 30}
	return p
}

// runShards runs mergeProfile on n shard runners at once against url,
// each with users of its own, and returns their reports in shard order.
func runShards(t *testing.T, url string, n int) []*report.Soak {
	t.Helper()
	reps := make([]*report.Soak, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		r := NewRunner(RunnerOptions{
			Connection: engine.Connection{
				Driver: newTestDriver(t, url), Run: fmt.Sprintf("r%d", i), Heartbeat: time.Second,
				BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
			},
			Metrics: metrics.New(prometheus.NewPedanticRegistry()), Target: "t",
			Prefix: fmt.Sprintf("s%d", i), SampleEvery: 200 * time.Millisecond,
			Shard: fmt.Sprintf("%d/%d", i, n),
		})
		wg.Go(func() { reps[i], errs[i] = r.Run(context.Background(), mergeProfile(), nil) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return reps
}

// TestMergeShards: three shards run one profile at once against one
// server. Their merged report's counts are the shards' sums, its latency
// counts too (read from the merged histograms), and its verdict is judged
// on the sums: clean, it passes; with 1% of pushes dropped (a dozen of
// about 1,500 deliveries) it fails on max_loss, and what it counts lost is
// exactly what the server dropped.
func TestMergeShards(t *testing.T) {
	for _, tt := range []struct {
		name string
		drop float64
		want string
	}{
		{"clean", 0, metrics.ResultPass},
		{"drop 1%", 0.01, metrics.ResultFail},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, srv := startTarget(t, refserver.Faults{Drop: tt.drop})
			shards := runShards(t, url, 3)
			// Given in another order than the shards': Merge orders them.
			m, err := Merge([]*report.Soak{shards[2], shards[0], shards[1]})
			if err != nil {
				t.Fatal(err)
			}
			all := m.Deliveries["all"]
			t.Logf("merged: %s, %+v; server dropped %d", m.Result, all, srv.Stats().Dropped)
			var sum report.Deliveries
			var sent, logins, delivLat int64
			for i, r := range shards {
				addTo(&sum, r.Deliveries["all"])
				sent += r.Messages.Sent
				logins += r.Latency["login"].Count
				delivLat += r.Latency["delivery_direct"].Count + r.Latency["delivery_group"].Count
				if got := m.Shards[i].ID; got != r.ID {
					t.Errorf("merged shard %d is run %s, want %s", i, got, r.ID)
				}
			}
			setRatios(&sum)
			if all != sum {
				t.Errorf("merged deliveries %+v, want the shards' sum %+v", all, sum)
			}
			if m.Messages.Sent != sent || m.Users.Configured != 60 || m.Users.LoggedIn != 60 {
				t.Errorf("merged sent %d of %d, users %+v, want the sums (60 users)", m.Messages.Sent, sent, m.Users)
			}
			if got := m.Latency["login"].Count; got != logins {
				t.Errorf("merged login latency count %d, want the shards' %d", got, logins)
			}
			if got := m.Latency["delivery_direct"].Count + m.Latency["delivery_group"].Count; got != delivLat || got != all.Delivered {
				t.Errorf("merged delivery latency count %d, want the shards' %d, the delivered %d", got, delivLat, all.Delivered)
			}
			if m.Result != tt.want {
				t.Errorf("merged result %s, want %s; thresholds %+v", m.Result, tt.want, m.Thresholds)
			}
			if got, want := all.Lost+all.Undelivered, int64(srv.Stats().Dropped); got != want {
				t.Errorf("merged lost + undelivered = %d, the server dropped %d: want equal", got, want)
			}
			if th := row(m, "max_loss"); th.ActualValue != all.LossRatio || th.Pass != (all.LossRatio <= m.Profile.Thresholds.MaxLoss) {
				t.Errorf("max_loss row %+v, want judged on the merged loss ratio %v", th, all.LossRatio)
			}
			if th := row(m, "all_users_logged_in"); th.LimitValue != 60 || !th.Pass {
				t.Errorf("all_users_logged_in row %+v, want 60 of 60", th)
			}
			if len(m.Samples) < 10 || m.Samples[len(m.Samples)/2].Online < 40 {
				t.Errorf("%d merged samples, the middle one %+v: want the shards' online users summed", len(m.Samples), m.Samples[len(m.Samples)/2])
			}
		})
	}
}

// TestMergeP99OfTheWhole: the merged p99 is the whole run's, read from
// the histograms summed, not any shard's own: 99 fast deliveries on one
// shard and one slow on the other make a fast p99 of the 100.
func TestMergeP99OfTheWhole(t *testing.T) {
	mk := func(shard string, lat []time.Duration) *report.Soak {
		h := newHist()
		for _, l := range lat {
			_ = h.RecordValue(int64(l / time.Microsecond))
		}
		r := shardReport(shard)
		r.Histograms = encodeHistograms(map[string]*hdrhistogram.Histogram{"delivery_direct": h})
		r.Latency = map[string]report.Percentiles{"delivery_direct": percentiles(h)}
		r.Deliveries = map[string]report.Deliveries{"direct": {Expected: int64(len(lat)), Delivered: int64(len(lat))}}
		return r
	}
	fast := make([]time.Duration, 99)
	for i := range fast {
		fast[i] = 10 * time.Millisecond
	}
	a, b := mk("0/2", fast), mk("1/2", []time.Duration{3 * time.Second})
	if p := b.Latency["delivery_direct"].P99; p < 2*time.Second {
		t.Fatalf("the slow shard's own p99 is %v", p)
	}
	m, err := Merge([]*report.Soak{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Latency["delivery_direct"]; p.Count != 100 || p.P99 > 20*time.Millisecond || p.Max < 2*time.Second {
		t.Errorf("merged latency %+v, want 100 deliveries, p99 about 10ms, max about 3s", p)
	}
	if th := row(m, "p99_delivery"); !th.Pass {
		t.Errorf("p99_delivery %+v, want judged on the whole run's p99 and passed", th)
	}
}

// shardReport is a minimal report of one shard of a run that started at
// a fixed moment.
func shardReport(shard string) *report.Soak {
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	p := testProfile()
	return &report.Soak{
		ID: report.NewRunID(start), Kind: "soak", Target: "t", Shard: shard, Start: start, End: start.Add(10 * time.Second),
		Profile: profileOf(p), Result: metrics.ResultPass,
		Users:    report.Users{Configured: 1, LoggedIn: 1, MinOnlineRatio: 1},
		Messages: report.Messages{Sent: 1, Acked: 1},
	}
}

// TestMergeRefuses: reports that are not every shard of one run are
// refused, and the error names what is wrong.
func TestMergeRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		reps func() []*report.Soak
		want string
	}{
		{"none", func() []*report.Soak { return nil }, "no shard reports"},
		{"not a shard", func() []*report.Soak { return []*report.Soak{shardReport(""), shardReport("1/2")} }, "has no shard"},
		{"a shard missing", func() []*report.Soak { return []*report.Soak{shardReport("0/3"), shardReport("2/3")} }, "shard 1/3 missing"},
		{"the same shard twice", func() []*report.Soak { return []*report.Soak{shardReport("0/2"), shardReport("0/2")} }, "are the same shard"},
		{"shard counts differ", func() []*report.Soak { return []*report.Soak{shardReport("0/2"), shardReport("1/3")} }, "one of 3 shards"},
		{"another target", func() []*report.Soak {
			b := shardReport("1/2")
			b.Target = "other"
			return []*report.Soak{shardReport("0/2"), b}
		}, `against target "other"`},
		{"another profile", func() []*report.Soak {
			b := shardReport("1/2")
			b.Profile.Rate++
			return []*report.Soak{shardReport("0/2"), b}
		}, "other settings"},
		{"started apart", func() []*report.Soak {
			b := shardReport("1/2")
			b.Start = b.Start.Add(time.Second)
			return []*report.Soak{shardReport("0/2"), b}
		}, "did not run together"},
		{"a drill", func() []*report.Soak {
			b := shardReport("1/2")
			b.Drill = &report.Drill{SlowReaders: 1}
			return []*report.Soak{shardReport("0/2"), b}
		}, "drill"},
		{"no histograms", func() []*report.Soak {
			b := shardReport("1/2")
			b.Latency = map[string]report.Percentiles{"ack": {Count: 5}}
			return []*report.Soak{shardReport("0/2"), b}
		}, "histograms"},
		{"another histogram's range", func() []*report.Soak {
			h := hdrhistogram.New(1, 1000, 2)
			_ = h.RecordValue(5)
			b := shardReport("1/2")
			b.Histograms = encodeHistograms(map[string]*hdrhistogram.Histogram{"ack": h})
			return []*report.Soak{shardReport("0/2"), b}
		}, "not a soak run's"},
		{"a bad histogram", func() []*report.Soak {
			b := shardReport("1/2")
			b.Histograms = map[string]string{"ack": "HISTFAAA!"}
			return []*report.Soak{shardReport("0/2"), b}
		}, "histogram ack"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Merge(tt.reps())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Merge: %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestMergeSamplesBounded: samples are summed moment by moment, and a
// report whose samples claim times before its start or years after it
// (a hand-edited file) neither panics the merge nor makes it allocate for
// the years between: the merged series is no longer than its inputs.
func TestMergeSamplesBounded(t *testing.T) {
	a, b := shardReport("0/2"), shardReport("1/2")
	for i := range 3 {
		at := a.Start.Add(time.Duration(i) * time.Second)
		a.Samples = append(a.Samples, report.Sample{T: at, Phase: report.PhaseSend, Online: 1, SentPerSec: 2})
		b.Samples = append(b.Samples, report.Sample{T: at.Add(100 * time.Millisecond), Phase: report.PhaseSend, Online: 3, SentPerSec: 4})
	}
	b.Samples = append(b.Samples,
		report.Sample{T: b.Start.Add(-time.Hour), Phase: report.PhaseSend, Online: 100},
		report.Sample{T: b.Start.Add(100 * 365 * 24 * time.Hour), Phase: report.PhaseDrain, Online: 100})
	m, err := Merge([]*report.Soak{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Samples) != 4 {
		t.Fatalf("%d merged samples, want the 3 moments both shards sampled and the far one: %+v", len(m.Samples), m.Samples)
	}
	for _, s := range m.Samples[:3] {
		if s.Online != 4 || s.SentPerSec != 6 {
			t.Errorf("merged sample %+v, want online 1+3 and 2+4 sent a second", s)
		}
	}
}
