package jsonws_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/protocols"
)

// These tests run configs/tinode.yaml, and no Go code specific to Tinode,
// against a real Tinode v0.25.3 on PostgreSQL, which .ci/tinode.sh builds
// and starts (IMCANARYTEST_TINODE_URL). Without it they skip. Each run
// makes users of its own: the server keeps accounts for its lifetime.

// tinode returns the driver of configs/tinode.yaml, or skips.
func tinode(t *testing.T) *jsonws.Driver {
	t.Helper()
	u := os.Getenv("IMCANARYTEST_TINODE_URL")
	if u == "" {
		t.Skip("IMCANARYTEST_TINODE_URL not set: no Tinode server to test against (.ci/tinode.sh starts one)")
	}
	cfg, err := protocols.Loader().Load("../../configs/tinode.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := jsonws.New(config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig()), jsonws.Options{
		URL: u, Secret: []byte("tinode-test-secret"), Heartbeat: 5 * time.Second, DataDir: t.TempDir(),
		DialTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// closer wraps a driver so that a test can end the sessions of a user, as
// a receiver that is killed: they reconnect with the population's backoff.
type closer struct {
	probe.Driver
	mu       sync.Mutex
	sessions map[string][]probe.Session
}

func (c *closer) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	s, err := c.Driver.Connect(ctx, user, dev)
	if err == nil {
		c.mu.Lock()
		c.sessions[user] = append(c.sessions[user], s)
		c.mu.Unlock()
	}
	return s, err
}

func (c *closer) MirrorsOwn() bool { return c.Driver.(probe.Mirror).MirrorsOwn() }

// kill ends every session user has, and returns how many.
func (c *closer) kill(user string) int {
	c.mu.Lock()
	ss := c.sessions[user]
	c.sessions[user] = nil
	c.mu.Unlock()
	for _, s := range ss {
		_ = s.Close()
	}
	return len(ss)
}

// TestTinodePopulation: 500 users in groups of 5 and in pairs, through the
// mapping alone: Tinode's {acc} and {login}, peer topics, group topics
// made by one member and joined by the others, {pub} acked with the
// topic's seq, {data} deliveries. None is lost; receivers whose sessions
// end mid-run come back and fetch what they missed ({get what:"data"}),
// counted recovered.
func TestTinodePopulation(t *testing.T) {
	drv := tinode(t)
	wrap := &closer{Driver: drv, sessions: map[string][]probe.Session{}}
	// Logins cost Tinode a bcrypt each, about 60 ms of its CPU: the ramp
	// gives it the time.
	pc := popConfig{prefix: runPrefix("tn"), users: 500, groupSize: 5, rate: 0.2, ramp: 30 * time.Second,
		deadline: 3 * time.Second, lostAfter: 6 * time.Second, catchUp: true, backoff: 2 * time.Second}
	start := time.Now()
	fx := startPopulation(t, wrap, pc)
	t.Logf("500 users provisioned and online in %v", time.Since(start).Round(time.Second))
	time.Sleep(3 * time.Second)
	killed := 0
	for i := range 4 {
		killed += wrap.kill(fmt.Sprintf("%s-u%d", pc.prefix, 7+i*101))
	}
	if killed == 0 {
		t.Fatalf("no session to end: the user names are not %s-uN", pc.prefix)
	}
	time.Sleep(6 * time.Second)
	c := fx.soak(0, pc.lostAfter)
	gaps, missed := drv.ServerGaps()
	t.Logf("tinode: %+v; %d sessions ended mid-run; server gaps %d (%d seqs); frames unmatched %d",
		c, killed, gaps, missed, drv.FramesUnmatched())
	if c.expected < 2000 {
		t.Fatalf("%v expected deliveries, want thousands", c.expected)
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost %v, duplicate %v: want 0", c.lost, c.dup)
	}
	if c.delivered+c.recovered != c.expected {
		t.Errorf("delivered %v + recovered %v != expected %v", c.delivered, c.recovered, c.expected)
	}
	if c.recovered == 0 {
		t.Errorf("nothing recovered after %d sessions ended mid-run: catch-up did not run", killed)
	}
	for _, k := range []metrics.Kind{metrics.Direct, metrics.Group} {
		if n, _ := histCountOf(fx.set.Kind[k].AckLatency); n == 0 {
			t.Errorf("no %s ack latency recorded", k.Name())
		}
		if n, _ := histCountOf(fx.set.Kind[k].Cohort[metrics.Normal].DeliveryLatency); n == 0 {
			t.Errorf("no %s delivery latency recorded", k.Name())
		}
	}
	if n := drv.FramesUnmatched(); n != 0 {
		t.Errorf("%d frames matched no rule of configs/tinode.yaml", n)
	}
}
