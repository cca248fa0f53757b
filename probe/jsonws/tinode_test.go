package jsonws_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
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
// a receiver that is killed, and keep it away a while: its reconnects fail
// until then, and then succeed with the population's backoff.
type closer struct {
	probe.Driver
	mu       sync.Mutex
	sessions map[string][]probe.Session
	away     map[string]time.Time
}

// errAway is a connect of a user the test keeps away.
var errAway = errors.New("kept away by the test")

func (c *closer) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	c.mu.Lock()
	until := c.away[user]
	c.mu.Unlock()
	if time.Now().Before(until) {
		return nil, errAway
	}
	s, err := c.Driver.Connect(ctx, user, dev)
	if err == nil {
		c.mu.Lock()
		c.sessions[user] = append(c.sessions[user], s)
		c.mu.Unlock()
	}
	return s, err
}

func (c *closer) MirrorsOwn() bool { return c.Driver.(probe.Mirror).MirrorsOwn() }

// kill ends every session user has and keeps it away for the time given,
// and returns how many sessions it ended.
func (c *closer) kill(user string, away time.Duration) int {
	c.mu.Lock()
	ss := c.sessions[user]
	c.sessions[user] = nil
	if c.away == nil {
		c.away = map[string]time.Time{}
	}
	c.away[user] = time.Now().Add(away)
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
	var away []int
	for i := range 4 {
		u := 7 + i*101
		away = append(away, u)
		killed += wrap.kill(fmt.Sprintf("%s-u%d", pc.prefix, u), 3*time.Second)
	}
	if killed == 0 {
		t.Fatalf("no session to end: the user names are not %s-uN", pc.prefix)
	}
	// Once the server has seen them go, each one's direct peer and a
	// member of its group (the peer: groups of 5 from user 0 hold both)
	// write to it, so that catch-up has something to fetch whatever the
	// random senders did meanwhile.
	time.Sleep(time.Second)
	for _, u := range away {
		for _, group := range []bool{false, true} {
			if _, err := fx.pop.SendNow(u^1, group); err != nil {
				t.Fatalf("send to user %d while it is away: %v", u, err)
			}
		}
	}
	time.Sleep(6 * time.Second)
	c := fx.soak(0, pc.lostAfter)
	gaps, missed := drv.ServerGaps()
	t.Logf("tinode: %+v; %d sessions ended mid-run; server gaps %d (%d seqs); frames unmatched %d",
		c, killed, gaps, missed, drv.FramesUnmatched())
	fx.checkComplete(c, killed)
	if n := drv.FramesUnmatched(); n != 0 {
		t.Errorf("%d frames matched no rule of configs/tinode.yaml", n)
	}
}

// TestTinodeSlowReader: a reader that stops reading for seconds while its
// group is busy. Tinode then detaches its session from the topics it
// cannot keep up with, saying nothing ("connection stuck, detaching"), and
// drops the socket without a close frame once too much is queued. What
// the slow reader missed shows in its own cohort (lost, or recovered by
// catch-up after it reconnects) and as lag while it is silent, never in
// the normal users' counts, which stay complete.
func TestTinodeSlowReader(t *testing.T) {
	drv := tinode(t)
	pc := popConfig{prefix: runPrefix("tns"), users: 10, groupSize: 5, rate: 20, ramp: 2 * time.Second,
		deadline: 3 * time.Second, lostAfter: 6 * time.Second, catchUp: true, messageSize: 16 << 10,
		slow: engine.SlowReaders{Fraction: 0.1, Pause: 10 * time.Second}}
	fx := startPopulation(t, drv, pc)
	slow := ""
	for i := range fx.pop.Users() {
		if fx.pop.Slow(i) {
			slow = fmt.Sprint(i)
		}
	}
	if slow == "" {
		t.Fatal("no slow reader in the population")
	}
	// The pause starts at the slow reader's first delivery; while it
	// lasts, its lag is what shows it.
	var maxLag int64
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		maxLag = max(maxLag, fx.pop.SlowReaderLag())
	}
	time.Sleep(4 * time.Second)
	c := fx.soak(0, pc.lostAfter)
	// The slow reader pauses again in each new session and reads what it
	// is sent slowly after: its own count settles later than the others'.
	// A session Tinode detached and left open receives nothing more, and
	// with the senders stopped no later message shows the ledger the gap:
	// what it still lacks then is its lag (acked to it, not received),
	// which the sweep reports while it is online. Every owed message is
	// delivered, recovered, lost or in that lag.
	sr := fx.cohort(metrics.SlowReader)
	var lag int64
	settled := func() bool { return sr.delivered+sr.recovered+sr.lost+float64(lag) == sr.expected }
	for end := time.Now().Add(4 * pc.lostAfter); !settled() && time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
		fx.pop.Sweep(time.Now())
		sr, lag = fx.cohort(metrics.SlowReader), fx.pop.SlowReaderLag()
	}
	disc := map[string]float64{}
	for _, r := range metrics.DisconnectReasons {
		disc[r] = metrics.Value(fx.set.Disconnects[r])
	}
	t.Logf("normal %+v; slow reader %+v, lag at the end %d; slow reader's largest lag %d messages; disconnects %v", c, sr, lag, maxLag, disc)
	if maxLag < 20 {
		t.Errorf("slow reader's lag peaked at %d messages during an 8 s pause at ~40 deliveries/s, want it seen", maxLag)
	}
	if c.lost != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("normal users: %+v: a slow reader must cost the others nothing", c)
	}
	if sr.expected == 0 {
		t.Error("slow reader: nothing expected, want its deliveries counted in its own cohort")
	}
	if !settled() {
		t.Errorf("slow reader: delivered %v + recovered %v + lost %v + lag %v != expected %v: every message accounted",
			sr.delivered, sr.recovered, sr.lost, lag, sr.expected)
	}
}

// TestTinodeDevices: two devices per user, each its own Tinode session
// joining every conversation: each gets every message, the user's own
// from the other device included ({pub noecho} hides a message only from
// the session that sent it), and nothing is lost.
func TestTinodeDevices(t *testing.T) {
	drv := tinode(t)
	pc := popConfig{prefix: runPrefix("tnd"), users: 60, groupSize: 5, rate: 1, ramp: 5 * time.Second,
		deadline: 3 * time.Second, lostAfter: 6 * time.Second, catchUp: true, devices: 2}
	fx := startPopulation(t, drv, pc)
	c := fx.soak(5*time.Second, pc.lostAfter)
	t.Logf("tinode, 2 devices: %+v; frames unmatched %d", c, drv.FramesUnmatched())
	if c.expected < 1000 {
		t.Fatalf("%v expected deliveries, want over 1000", c.expected)
	}
	if c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("%+v: want every message on every device, once", c)
	}
}
