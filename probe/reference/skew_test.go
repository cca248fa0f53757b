package reference_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// crossSeen records the cross-shard deliveries one shard receives, with
// their latency as measured (the Observer's is uncorrected).
type crossSeen struct {
	from string
	mu   sync.Mutex
	raw  []time.Duration
}

func (c *crossSeen) Login(int, time.Duration, error) {}
func (c *crossSeen) Disconnect(int, string, error)   {}
func (c *crossSeen) Ack(uint64, bool, time.Duration) {}
func (c *crossSeen) Unacked(uint64, string, string)  {}
func (c *crossSeen) Received(_ int, h *probe.Header, lat time.Duration, o engine.Outcome) {
	if string(h.Sender) != c.from || o != engine.Delivered {
		return
	}
	c.mu.Lock()
	c.raw = append(c.raw, lat)
	c.mu.Unlock()
}

func (c *crossSeen) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.raw)
}

// skewShard is one shard of TestClockSkewIsMeasuredAndRemoved.
type skewShard struct {
	shift time.Duration
	m     *metrics.Metrics
	pop   *engine.Population
	seen  *crossSeen
	// peer and from are the shard labels of CrossPeer and CrossFrom.
	peer, from string
}

func (s *skewShard) histogram() (count uint64, sum float64) {
	var d dto.Metric
	h := s.m.DeliveryLatency.WithLabelValues("t", metrics.SourceCanary, "direct", "normal").(prometheus.Histogram)
	if err := h.Write(&d); err != nil {
		panic(err)
	}
	return d.Histogram.GetSampleCount(), d.Histogram.GetSampleSum()
}

func (s *skewShard) samples(peer string) float64 {
	return testutil.ToFloat64(s.m.Clock.Samples.WithLabelValues("t", peer))
}

// estimate returns the exported offset and uncertainty of peer's clock,
// and whether there is one yet.
func (s *skewShard) estimate(peer string) (off, unc time.Duration, ok bool) {
	if testutil.CollectAndCount(s.m.Clock.Offset) == 0 || s.samples(peer) == 0 {
		return 0, 0, false
	}
	sec := func(v float64) time.Duration { return time.Duration(math.Round(v * 1e9)) }
	return sec(testutil.ToFloat64(s.m.Clock.Offset.WithLabelValues("t", peer))),
		sec(testutil.ToFloat64(s.m.Clock.Uncertainty.WithLabelValues("t", peer))), true
}

// TestClockSkewIsMeasuredAndRemoved runs a ring of three shards, each a
// population of its own process (its own run, driver and metrics) against
// one reference server, with shard 0's clock 150 ms ahead. Each shard must
// measure its peers' offsets through the server within their
// uncertainty, and its histogram must hold each cross-shard delivery's
// true latency within the uncertainty of the estimate it was corrected
// by, not the skew; before any estimate, the latency is untrusted and
// kept out. The true latency is known here: the measured one plus the
// shift the test injected.
func TestClockSkewIsMeasuredAndRemoved(t *testing.T) {
	const shift = 150 * time.Millisecond
	const rounds = 8
	_, ln, stopT, twg := startTarget(t, "127.0.0.1:0", refserver.Options{})
	defer func() { stopT(); twg.Wait() }()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	const n = 3
	started := time.Now()
	shards := make([]*skewShard, n)
	name := func(k int) string { return fmt.Sprintf("s%d-u0", (k+n)%n) }
	for k := range shards {
		drv, err := reference.New(reference.Options{URL: "ws://" + ln.Addr().String() + "/ws", Secret: secret, Heartbeat: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s := &skewShard{m: metrics.New(prometheus.NewPedanticRegistry()), seen: &crossSeen{from: name(k - 1)},
			peer: strconv.Itoa((k + 1) % n), from: strconv.Itoa((k + n - 1) % n)}
		if k == 0 {
			s.shift = shift
		}
		s.pop, err = engine.NewPopulation(engine.Options{
			Connection: engine.Connection{
				Driver: drv, Run: fmt.Sprintf("run%d", k), Heartbeat: time.Second,
				BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
				TestClockOffset: s.shift,
			},
			Set:    s.m.For("t", metrics.SourceCanary),
			Prefix: fmt.Sprintf("s%d", k), Users: 2, GroupSize: 2,
			// A generous deadline: an exchange whose round trip
			// exceeds it is dropped, and a loaded machine must not
			// starve the test of samples.
			Deadline: 5 * time.Second, LostAfter: 10 * time.Second,
			Observer:  s.seen,
			CrossPeer: name(k + 1), CrossFrom: name(k - 1),
			CrossPeerClock: s.m.Clock.ClockPeer("t", metrics.SourceCanary, s.peer),
			CrossFromClock: s.m.Clock.ClockPeer("t", metrics.SourceCanary, s.from),
		})
		if err != nil {
			t.Fatal(err)
		}
		shards[k] = s
		wg.Go(func() { _ = s.pop.Run(ctx) })
	}
	for k, s := range shards {
		wait, stop := context.WithTimeout(ctx, 10*time.Second)
		ok := s.pop.WaitReady(wait)
		stop()
		if !ok {
			t.Fatalf("shard %d never came online", k)
		}
	}
	// A shard whose clock is behind takes what a peer sent just after
	// its start for an earlier run's (stale), as it would with a real
	// clock behind: the first message waits out the skew.
	time.Sleep(time.Until(started.Add(2 * shift)))
	// θ(k, j) is how far shard j's clock is ahead of shard k's.
	theta := func(k int, j string) time.Duration {
		i, _ := strconv.Atoi(j)
		return shards[i].shift - shards[k].shift
	}

	// One cross-shard message per shard a round, as the canary sends,
	// and the round waits for the deliveries and both exchanges of each
	// shard: its own (as sender) and its predecessor's (as receiver).
	type used struct {
		off, unc time.Duration
		ok       bool
	}
	trusted := 0
	for r := range rounds {
		// The estimate each shard corrects this round's delivery by:
		// the one its predecessor's last exchange left.
		before := make([]used, n)
		counts := make([]uint64, n)
		sums := make([]float64, n)
		for k, s := range shards {
			off, unc, ok := s.estimate(s.from)
			before[k] = used{off, unc, ok}
			counts[k], sums[k] = s.histogram()
		}
		for k, s := range shards {
			if _, err := s.pop.SendCross(); err != nil {
				t.Fatalf("round %d: shard %d: SendCross: %v", r, k, err)
			}
		}
		testwait.For(t, 20*time.Second, fmt.Sprintf("round %d's deliveries and clock exchanges", r), func() bool {
			for _, s := range shards {
				if s.seen.n() < r+1 || s.samples(s.from) < float64(r+1) || s.samples(s.peer) < float64(r+1) {
					return false
				}
			}
			return true
		})
		for k, s := range shards {
			c, sum := s.histogram()
			s.seen.mu.Lock()
			raw := s.seen.raw[r]
			s.seen.mu.Unlock()
			truth := raw + theta(k, s.from)
			switch {
			case c == counts[k]:
				if before[k].ok && before[k].unc <= engine.DefaultMaxClockUncertainty {
					t.Errorf("round %d: shard %d kept a delivery out of its histogram although its estimate (%v ± %v) was trusted", r, k, before[k].off, before[k].unc)
				}
			case c == counts[k]+1:
				if !before[k].ok {
					t.Fatalf("round %d: shard %d observed a cross-shard latency with no clock estimate yet", r, k)
				}
				trusted++
				got := time.Duration(math.Round((sum - sums[k]) * 1e9))
				// The correction is the estimate, and the estimate is
				// within its uncertainty of the truth.
				if d := got - (raw + before[k].off); d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("round %d: shard %d observed %v, want the measured %v corrected by %v", r, k, got, raw, before[k].off)
				}
				if d := (got - truth).Abs(); d > before[k].unc+time.Microsecond {
					t.Errorf("round %d: shard %d observed %v for a delivery of true latency %v (measured %v): off by %v, more than the estimate's uncertainty %v", r, k, got, truth, raw, d, before[k].unc)
				}
			default:
				t.Fatalf("round %d: shard %d's histogram grew by %d for one delivery", r, k, c-counts[k])
			}
		}
	}

	for k, s := range shards {
		for _, j := range []string{s.from, s.peer} {
			off, unc, ok := s.estimate(j)
			want := theta(k, j)
			t.Logf("shard %d: shard %s's clock is ahead by %v ± %v (injected %v), over %v exchanges", k, j, off, unc, want, s.samples(j))
			if !ok {
				t.Fatalf("shard %d: no estimate of shard %s's clock", k, j)
			}
			// The bound is exact (no leg's delay is negative); the
			// microsecond is the halving's rounding and the gauge's
			// float seconds.
			if d := (off - want).Abs(); d > unc+time.Microsecond {
				t.Errorf("shard %d: shard %s's offset = %v ± %v, want %v within the uncertainty (off by %v)", k, j, off, unc, want, d)
			}
		}
		untrusted := testutil.ToFloat64(s.m.Clock.Untrusted.WithLabelValues("t", metrics.SourceCanary))
		c, _ := s.histogram()
		delivered := testutil.ToFloat64(s.m.Deliveries.WithLabelValues("t", metrics.SourceCanary, "direct", "normal"))
		// Completeness is untouched: every delivery counts, trusted or
		// not, and each is in exactly one of the two.
		if delivered != rounds || float64(c)+untrusted != rounds {
			t.Errorf("shard %d: %v deliveries, %d latencies observed and %v untrusted; want %d deliveries, each observed or untrusted", k, delivered, c, untrusted, rounds)
		}
		// The first round has no estimate yet.
		if untrusted < 1 {
			t.Errorf("shard %d: no latency untrusted, but the first round's came before any estimate", k)
		}
	}
	// A machine loaded enough for most round trips to exceed the bound
	// proves nothing about the correction.
	if trusted < n*(rounds-1)/2 {
		t.Fatalf("only %d of %d cross-shard latencies were trusted", trusted, n*(rounds-1))
	}
}
