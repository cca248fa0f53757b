package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// countingDriver records every connect: when, for whom and from which
// source address. Its sessions stay up until closed or dropped, all at
// once, by drop.
type countingDriver struct {
	mu       sync.Mutex
	at       []time.Time
	sources  map[string][]netip.Addr // user → source of each connect
	dropping chan struct{}           // closed by drop; replaced after
}

func newCountingDriver() *countingDriver {
	return &countingDriver{sources: map[string][]netip.Addr{}, dropping: make(chan struct{})}
}

func (d *countingDriver) Provision(context.Context, probe.Plan) error { return nil }

func (d *countingDriver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, time.Now())
	d.sources[user] = append(d.sources[user], dev.Link.Source)
	return &countingSession{closed: make(chan struct{}), dropped: d.dropping}, nil
}

// drop ends every session now, as a server restart does.
func (d *countingDriver) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.dropping)
	d.dropping = make(chan struct{})
}

// connects returns the times of the connects so far, from index from.
func (d *countingDriver) connects(from int) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.at[from:])
}

type countingSession struct {
	once    sync.Once
	closed  chan struct{}
	dropped <-chan struct{}
}

func (s *countingSession) Serve(probe.Handler) error {
	select {
	case <-s.closed:
		return &probe.Disconnect{Reason: metrics.ReasonShutdown}
	case <-s.dropped:
		return &probe.Disconnect{Reason: metrics.ReasonError}
	}
}
func (s *countingSession) Send(*probe.Message) error { return nil }
func (s *countingSession) Ping() error               { return nil }
func (s *countingSession) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// runCounting runs a population of users over d with the given connect
// rate and source addresses until the returned stop is called.
func runCounting(t *testing.T, d *countingDriver, users int, ramp time.Duration, maxRate float64, sources []netip.Addr, log *slog.Logger) (*Population, func()) {
	t.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{
			Driver: d,
			Run:    "r1",
			// Long enough that the sweeper, which visits every user, runs
			// only once a second.
			Heartbeat: time.Minute,
			// Reconnects come within milliseconds: only the rate limit
			// spreads them.
			BackoffMin:     time.Millisecond,
			BackoffMax:     10 * time.Millisecond,
			MaxConnectRate: maxRate,
			SourceAddrs:    sources,
		},
		Set:       set,
		Prefix:    "p",
		Users:     users,
		Ramp:      ramp,
		GroupSize: 5,
		Deadline:  10 * time.Second,
		LostAfter: 20 * time.Second,
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	// Exits when stop cancels ctx.
	go func() {
		_ = p.Run(ctx)
		close(done)
	}()
	return p, func() { cancel(); <-done }
}

// waitOnline waits, in the bubble's time, until n sessions are online, for
// at most limit.
func waitOnline(t *testing.T, p *Population, n int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for p.Online() < n {
		if time.Since(start) > limit {
			t.Fatalf("%d of %d sessions online after %v", p.Online(), n, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// maxInWindow returns the most connects in any window of length w that
// starts at a connect.
func maxInWindow(at []time.Time, w time.Duration) int {
	most := 0
	for i := range at {
		j, _ := slices.BinarySearchFunc(at, at[i].Add(w), func(a, b time.Time) int { return a.Compare(b) })
		most = max(most, j-i)
	}
	return most
}

// TestMaxConnectRate runs populations against a driver that counts connects,
// under synctest so that the times are exact: the ramp's connects, and the
// reconnects after every session is dropped at once, never exceed the rate
// plus the burst in any second, and without a limit everyone comes at once.
func TestMaxConnectRate(t *testing.T) {
	tests := []struct {
		name  string
		users int
		ramp  time.Duration
		rate  float64 // 0: no limit
		burst int
		// took is how long the ramp must take: (users-burst)/rate.
		took time.Duration
	}{
		{name: "no limit", users: 500, took: 0},
		{name: "100/s, 1000 users at once", users: 1000, rate: 100, burst: 10, took: 9900 * time.Millisecond},
		{name: "100/s, ramp slower than the limit", users: 200, ramp: 4 * time.Second, rate: 100, burst: 10, took: 3980 * time.Millisecond},
		{name: "1000/s, 3000 users at once", users: 3000, rate: 1000, burst: 100, took: 2900 * time.Millisecond},
		{name: "0.5/s", users: 3, rate: 0.5, burst: 1, took: 4 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newCountingDriver()
				p, stop := runCounting(t, d, tt.users, tt.ramp, tt.rate, nil, nil)
				defer stop()
				start := time.Now()
				waitOnline(t, p, tt.users, time.Minute)
				ramp := d.connects(0)
				check := func(phase string, at []time.Time, from time.Time) {
					t.Helper()
					if len(at) != tt.users {
						t.Fatalf("%s: %d connects, want %d", phase, len(at), tt.users)
					}
					last := at[len(at)-1].Sub(from)
					if tt.rate == 0 {
						if last > 100*time.Millisecond {
							t.Errorf("%s: last connect %v after the start, want all at once", phase, last)
						}
						return
					}
					limit := int(math.Ceil(tt.rate)) + tt.burst
					if most := maxInWindow(at, time.Second); most > limit {
						t.Errorf("%s: %d connects within one second, want at most %d (rate %v + burst %d)", phase, most, limit, tt.rate, tt.burst)
					}
					if last < tt.took-10*time.Millisecond || last > tt.took+100*time.Millisecond {
						t.Errorf("%s: last connect %v after the start, want %v", phase, last, tt.took)
					}
					if span := at[len(at)-1].Sub(at[0]).Seconds(); span > 0 {
						t.Logf("%s: %d connects in %.2fs: %.1f/s after the burst (limit %v/s), at most %d in any second",
							phase, len(at), span, float64(len(at)-tt.burst)/span, tt.rate, maxInWindow(at, time.Second))
					}
				}
				check("ramp", ramp, start)

				// Everyone dropped at once, as by a server restart, once
				// the bucket has refilled.
				time.Sleep(5 * time.Second)
				dropAt := time.Now()
				d.drop()
				synctest.Wait() // every session has ended
				if n := p.Online(); n != 0 {
					t.Fatalf("%d sessions online after the drop, want 0", n)
				}
				waitOnline(t, p, tt.users, time.Minute)
				tt.took = time.Duration(float64(tt.users-tt.burst) / max(tt.rate, 1e-9) * float64(time.Second))
				if tt.rate == 0 {
					tt.took = 0
				}
				// The jittered backoff comes first: up to 2 ms here.
				tt.took += 2 * time.Millisecond
				check("reconnect", d.connects(len(ramp)), dropAt)
			})
		})
	}
}

// TestSourceAddrsRoundRobin checks user i connects from SourceAddrs[i%n],
// and from the same address again after the server drops it.
func TestSourceAddrsRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sources := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("::1")}
		const users = 7
		d := newCountingDriver()
		p, stop := runCounting(t, d, users, 0, 0, sources, nil)
		defer stop()
		waitOnline(t, p, users, time.Minute)
		d.drop()
		synctest.Wait()
		waitOnline(t, p, users, time.Minute)
		d.mu.Lock()
		defer d.mu.Unlock()
		for i := range users {
			name := p.users[i].name
			want := []netip.Addr{sources[i%len(sources)], sources[i%len(sources)]}
			if got := d.sources[name]; !slices.Equal(got, want) {
				t.Errorf("user %d connected from %v, want %v", i, got, want)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		d := newCountingDriver()
		p, stop := runCounting(t, d, 2, 0, 0, nil, nil)
		defer stop()
		waitOnline(t, p, 2, time.Minute)
		d.mu.Lock()
		defer d.mu.Unlock()
		for user, got := range d.sources {
			if got[0].IsValid() {
				t.Errorf("user %s connected from %v without SourceAddrs, want the kernel's choice (no address)", user, got[0])
			}
		}
	})
}

// TestConnectRateLogged checks that connects held back are logged at
// Debug, at most once a second, while they last: 30 users at 10/s.
func TestConnectRateLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		d := newCountingDriver()
		p, stop := runCounting(t, d, 30, 0, 10, nil, log)
		waitOnline(t, p, 30, time.Minute)
		stop()
		var lines []string
		for l := range strings.Lines(buf.String()) {
			if strings.Contains(l, "connects held back by population.max_connect_rate") {
				lines = append(lines, l)
			}
		}
		// The first connect takes the burst; the others come every
		// 100 ms, logged at 0.1 s, 1.1 s and 2.1 s.
		want := []string{"waited=100ms waiting=28", "waited=1.1s waiting=18", "waited=2.1s waiting=8"}
		if len(lines) != len(want) {
			t.Fatalf("log lines about held-back connects = %q, want %d", lines, len(want))
		}
		for i, l := range lines {
			if !strings.Contains(l, "max_connect_rate=10 "+want[i]) {
				t.Errorf("log line %d = %q, want max_connect_rate=10 %s", i, l, want[i])
			}
		}
	})
}

func TestRampWithConnectRate(t *testing.T) {
	tests := []struct {
		users int
		ramp  time.Duration
		rate  float64
		want  time.Duration
	}{
		{100, 10 * time.Second, 0, 10 * time.Second},
		{100, 10 * time.Second, 1000, 10 * time.Second},
		{50_000, 10 * time.Second, 1000, 50 * time.Second},
		{10, 0, 4, 2500 * time.Millisecond},
		{1_000_000, 0, 1e-9, maxRamp},
	}
	for _, tt := range tests {
		p := &Population{opts: Options{Users: tt.users, Ramp: tt.ramp, Connection: Connection{MaxConnectRate: tt.rate}}}
		if got := p.Ramp(); got != tt.want {
			t.Errorf("Ramp() with %d users, ramp %v, max connect rate %v = %v, want %v", tt.users, tt.ramp, tt.rate, got, tt.want)
		}
	}
}

// failingDriver refuses every connect, as a server that is down does, and
// records when each was attempted.
type failingDriver struct {
	mu sync.Mutex
	at []time.Time
}

func (d *failingDriver) Provision(context.Context, probe.Plan) error { return nil }

func (d *failingDriver) Connect(context.Context, string, probe.Device) (probe.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, time.Now())
	return nil, errors.New("connection refused")
}

// TestMaxConnectRateWhileDown: while the server is down, every user retries
// with its backoff, and the attempts together stay within the rate plus the
// burst in any second, however many users there are.
func TestMaxConnectRateWhileDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &failingDriver{}
		set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
		p, err := NewPopulation(Options{
			Connection: Connection{
				Driver:         d,
				Run:            "r1",
				Heartbeat:      time.Minute,
				BackoffMin:     time.Millisecond,
				BackoffMax:     50 * time.Millisecond,
				MaxConnectRate: 50,
			},
			Set:       set,
			Prefix:    "p",
			Users:     200,
			GroupSize: 5,
			Deadline:  10 * time.Second,
			LostAfter: 20 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _ = p.Run(ctx) })
		time.Sleep(10 * time.Second)
		stopAt := time.Now()
		cancel()
		wg.Wait()
		d.mu.Lock()
		defer d.mu.Unlock()
		// An attempt that shutdown interrupts (at the very instant of the
		// cancel, in synctest's time) is not the server's failure.
		before := 0
		for _, at := range d.at {
			if at.Before(stopAt) {
				before++
			}
		}
		if got := metrics.Value(set.ConnectFail); got < float64(before) || got > float64(len(d.at)) {
			t.Errorf("connect failures counted %v, attempts %d (%d before the shutdown): want one count per attempt", got, len(d.at), before)
		}
		if most := maxInWindow(d.at, time.Second); most > 55 {
			t.Errorf("%d attempts within one second while the server was down, want at most 55 (rate 50 + burst 5)", most)
		}
		if n := len(d.at); n < 400 || n > 560 {
			t.Errorf("%d attempts in 10 s, want about 500 (the rate, every user retrying)", n)
		}
	})
}

// A block of a grown population numbers its users and groups on from the
// blocks before it, so that no two blocks log in as the same user.
func TestOffsetNumbering(t *testing.T) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{
			Driver:     newCountingDriver(),
			Run:        "r1",
			Heartbeat:  time.Minute,
			BackoffMin: time.Millisecond,
			BackoffMax: 10 * time.Millisecond,
		},
		Set:         set,
		Prefix:      "p",
		Users:       7,
		GroupSize:   5,
		Offset:      10,
		GroupOffset: 3,
		Block:       true,
		Deadline:    time.Second,
		LostAfter:   2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	plan := p.Plan()
	if got := []string{plan.Users[0], plan.Users[6]}; got[0] != "p-u10" || got[1] != "p-u16" {
		t.Errorf("users %v…, want p-u10 to p-u16", got)
	}
	if len(plan.Groups) != 2 || plan.Groups[0].Name != "p-g3" || plan.Groups[1].Name != "p-g4" {
		t.Errorf("groups %v, want p-g3 and p-g4", plan.Groups)
	}
	if _, err := NewPopulation(Options{
		Connection: Connection{
			Driver:     newCountingDriver(),
			Heartbeat:  time.Minute,
			BackoffMin: time.Millisecond,
			BackoffMax: time.Millisecond,
		},
		Set:       set,
		Users:     2,
		GroupSize: 2,
		Offset:    -1,
		Deadline:  time.Second,
		LostAfter: 2 * time.Second,
	}); err == nil {
		t.Error("a negative offset was accepted")
	}
}

// TestChurn: with a session lifetime, each user logs out and back in about
// once per lifetime, counted as churn and nothing else, while the
// population stays nearly whole.
func TestChurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newCountingDriver()
		set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
		const users, lifetime, run = 50, 2 * time.Second, 60 * time.Second
		p, err := NewPopulation(Options{
			Connection: Connection{
				Driver:     d,
				Run:        "r1",
				Heartbeat:  time.Minute,
				BackoffMin: 10 * time.Millisecond,
				BackoffMax: 100 * time.Millisecond,
			},
			Set:             set,
			Prefix:          "p",
			Users:           users,
			GroupSize:       5,
			Deadline:        10 * time.Second,
			LostAfter:       20 * time.Second,
			SessionLifetime: lifetime,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _ = p.Run(ctx) })
		least := users
		for range int(run / (100 * time.Millisecond)) {
			time.Sleep(100 * time.Millisecond)
			least = min(least, p.Online())
		}
		cancel()
		wg.Wait()
		churn := metrics.Value(set.Disconnects[metrics.ReasonChurn])
		// 50 users for 60 s at a 2 s mean lifetime: about 1,500, give or
		// take the exponential's spread and the moments spent away.
		if churn < 1200 || churn > 1700 {
			t.Errorf("%v churn disconnects, want about %d", churn, users*int(run/lifetime))
		}
		for _, r := range []string{metrics.ReasonError, metrics.ReasonServerClose, metrics.ReasonSlowConsumer} {
			if n := metrics.Value(set.Disconnects[r]); n != 0 {
				t.Errorf("%v disconnects for %s, want only churn", n, r)
			}
		}
		// At the end, one per user online then: a user between two
		// sessions has none to close.
		if n := metrics.Value(set.Disconnects[metrics.ReasonShutdown]); n < users-5 || n > users {
			t.Errorf("%v shutdown disconnects, want about one per user (%d) at the end", n, users)
		}
		if least < users-10 {
			t.Errorf("as few as %d of %d online, want churn to keep nearly everyone on", least, users)
		}
	})
}
