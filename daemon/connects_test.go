package daemon

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// TestConnectRateHoldsForTheProcess logs a background population and a
// soak run in at the same moment against the in-process reference server:
// together they make no more connect attempts than one
// population.max_connect_rate allows over the time they took. With a
// limiter per population they made about twice as many.
func TestConnectRateHoldsForTheProcess(t *testing.T) {
	const users, limit = 200, 100.0
	cfg := testConfig(t)
	cfg.Population.Users = users
	cfg.Population.Ramp = 0 // everyone at once: only the limiter paces them
	cfg.Population.MaxConnectRate = limit
	cfg.Canary.Schedule = ""
	cfg.Soak.Profiles = []config.Profile{{
		Name: "both", Users: users, GroupSize: 5, Rate: 0.1,
		Duration: time.Minute, Drain: time.Second, Deadline: time.Second, LostAfter: 2 * time.Second,
		Thresholds: config.Thresholds{MaxLoss: 1, MaxLate: 1, P99Ack: time.Minute, P99Delivery: time.Minute},
	}}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer d.target.Close()
	d.target.Start(d.log)
	bg := d.metrics.For(cfg.Target.Name, metrics.SourceBackground)
	sk := d.metrics.For(cfg.Target.Name, metrics.SourceSoak)
	attempts := func() float64 {
		return metrics.Value(bg.ConnectOK) + metrics.Value(bg.ConnectFail) + metrics.Value(sk.ConnectOK) + metrics.Value(sk.ConnectFail)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// No attempt can take its token before start: the window begins here.
	start := time.Now()
	// Each exits when ctx ends, after closing its sessions.
	wg.Go(func() { d.bg.run(ctx) })
	wg.Go(func() { _, _ = d.soak.Run(ctx, cfg.Soak.Profiles[0], nil) })

	// Unlimited, the 400 logins would take a fraction of a second; at
	// the limit they take 4 s. A minute is only the test's own bound.
	testwait.For(t, time.Minute, "both populations online", func() bool {
		return metrics.Value(bg.Online) >= users && metrics.Value(sk.Online) >= users
	})
	// Every attempt counted so far took its token in [start, end].
	end := time.Now()
	n := attempts()
	window := end.Sub(start)
	burst := float64(engine.NewConnectLimiter(limit).Burst())
	// One token more: the limiter keeps its tokens as a float, and the
	// last one may come a rounding error before the bound says.
	bound := burst + 1 + limit*window.Seconds()
	t.Logf("%.0f connect attempts in %v: %.1f/s, limit %.0f/s, bound %.0f (burst %.0f + 1 + limit × window)",
		n, window.Round(time.Millisecond), n/window.Seconds(), limit, bound, burst)
	if n < 2*users {
		t.Fatalf("%.0f connect attempts, want at least %d (every session logged in)", n, 2*users)
	}
	if n > bound {
		t.Errorf("%.0f connect attempts in %v, want at most %.0f: population.max_connect_rate %.0f/s does not hold for the process",
			n, window.Round(time.Millisecond), bound, limit)
	}
}

// TestStormDropsTheBackground runs a storm drill in the daemon: it drops
// half of the background population, not the run's own users, and every
// dropped background session comes back.
func TestStormDropsTheBackground(t *testing.T) {
	const users = 100
	cfg := testConfig(t)
	cfg.Population.Users = users
	cfg.Canary.Schedule = ""
	cfg.Soak.Profiles = []config.Profile{{
		Name: "storm", Users: 10, GroupSize: 5, Rate: 1,
		Duration: 3 * time.Second, Drain: time.Second, Deadline: time.Second, LostAfter: 2 * time.Second,
		Storm: config.Storm{Fraction: 0.5, After: time.Second},
		Thresholds: config.Thresholds{MaxLoss: 1, MaxLate: 1, P99Ack: time.Minute, P99Delivery: time.Minute,
			MaxDisconnects: 0, Recovery99: time.Hour, Recovery100: time.Hour},
	}}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer d.target.Close()
	d.target.Start(d.log)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Exits when ctx ends, after closing its sessions.
	wg.Go(func() { d.bg.run(ctx) })
	testwait.For(t, time.Minute, "the background population online", d.bg.Ready)
	rep, err := d.soak.Run(ctx, cfg.Soak.Profiles[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Storm
	if s == nil {
		t.Fatalf("Storm = nil, want the drill's section; notes %q", rep.Notes)
	}
	if s.Population != metrics.SourceBackground || s.Online != users || s.Dropped != users/2 || s.Back != s.Dropped || !s.Reached100 {
		t.Errorf("storm %s: %d of %d dropped, %d back (100%% %v), want %d of the %d background sessions dropped and back",
			s.Population, s.Dropped, s.Online, s.Back, s.Reached100, users/2, users)
	}
	bg := d.metrics.For(cfg.Target.Name, metrics.SourceBackground)
	if n := metrics.Value(bg.Disconnects[metrics.ReasonError]); n != float64(s.Dropped) {
		t.Errorf("background disconnects{reason=error} = %v, want %d", n, s.Dropped)
	}
	// The run's own users were left alone.
	if th := row(rep.Thresholds, "max_disconnects"); !th.Pass || rep.Result != metrics.ResultPass {
		t.Errorf("max_disconnects %+v, result %s: want the run's users undisturbed and a pass", th, rep.Result)
	}
	if s.AttemptsOf != "process" || s.MaxConnectRate != cfg.Population.MaxConnectRate {
		t.Errorf("attempts of %q against %v, want the process's limiter of %v", s.AttemptsOf, s.MaxConnectRate, cfg.Population.MaxConnectRate)
	}
}

func row(ths []report.Threshold, name string) report.Threshold {
	for _, th := range ths {
		if th.Name == name {
			return th
		}
	}
	return report.Threshold{Name: "missing " + name}
}
