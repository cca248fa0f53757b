package mqtt_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/mqtt"
	"github.com/imcanary/imcanary/protocols"
)

// The brokers are started by .ci/mqtt.sh (from .ci/run); without their
// variables these tests skip.
const (
	mosquittoVar     = "IMCANARYTEST_MOSQUITTO_URL"
	mosquittoSlowVar = "IMCANARYTEST_MOSQUITTO_SLOW_URL"
	mochiVar         = "IMCANARYTEST_MOCHI_URL"
)

func brokerURL(t *testing.T, v string) string {
	t.Helper()
	u := os.Getenv(v)
	if u == "" {
		t.Skipf("%s not set: no broker to test against (.ci/mqtt.sh starts one)", v)
	}
	return u
}

type popConfig struct {
	users, groupSize, devices int
	rate                      float64
	qos                       int
	version                   string
	catchUp                   bool
	lostAfter                 time.Duration
	messageSize               int
	slow                      engine.SlowReaders
}

type fixture struct {
	t   *testing.T
	pop *engine.Population
	set *metrics.Set
	drv *mqtt.Driver
	// prefix names the population's users, PREFIX-uN.
	prefix string
	// sessions are every user's open sessions, for tests that end them.
	mu       sync.Mutex
	sessions map[string][]probe.Session
	// away holds a dropped user off the broker until then, so that its
	// persistent session queues what it misses.
	away map[string]time.Time
}

// Connect records each session so that kill can end it.
func (fx *fixture) Provision(ctx context.Context, plan probe.Plan) error {
	return fx.drv.Provision(ctx, plan)
}

func (fx *fixture) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	fx.mu.Lock()
	until := fx.away[user]
	fx.mu.Unlock()
	if time.Now().Before(until) {
		return nil, fmt.Errorf("%s held away by the test", user)
	}
	s, err := fx.drv.Connect(ctx, user, dev)
	if err == nil {
		fx.mu.Lock()
		fx.sessions[user] = append(fx.sessions[user], s)
		fx.mu.Unlock()
	}
	return s, err
}

// kill ends user's sessions without DISCONNECT, as a dropped link does, and
// keeps the user off for away: the broker keeps a persistent session's
// subscriptions and queues for it meanwhile.
func (fx *fixture) kill(user string, away time.Duration) int {
	fx.mu.Lock()
	fx.away[user] = time.Now().Add(away)
	ss := fx.sessions[user]
	fx.sessions[user] = nil
	fx.mu.Unlock()
	for _, s := range ss {
		mqtt.Abort(s)
	}
	return len(ss)
}

func start(t *testing.T, url string, pc popConfig) *fixture {
	t.Helper()
	// The shipped configuration, as a user would run it, but for the
	// broker's address, a prefix of this run's own and the test's QoS.
	cfg, err := protocols.Loader().Load("../../configs/mqtt.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := config.Section[mqtt.Config](cfg, "mqtt", mqtt.DefaultConfig())
	c.QoS = pc.qos
	if pc.version != "" {
		c.Version = pc.version
	}
	c.TopicPrefix = fmt.Sprintf("imctest%d", time.Now().UnixNano()%1e9)
	drv, err := mqtt.New(c, mqtt.Options{URL: url, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{t: t, drv: drv, prefix: c.TopicPrefix, sessions: map[string][]probe.Session{}, away: map[string]time.Time{}}
	fx.set = metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
	lostAfter := pc.lostAfter
	if lostAfter == 0 {
		lostAfter = 5 * time.Second
	}
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver: fx, Run: "testrun", Heartbeat: time.Second,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, CatchUp: pc.catchUp,
		},
		Set: fx.set, Prefix: c.TopicPrefix, Users: pc.users, GroupSize: pc.groupSize, Rate: pc.rate,
		Ramp: time.Second, Deadline: 2 * time.Second, LostAfter: lostAfter, Devices: pc.devices,
		SlowReaders: pc.slow, MessageSize: pc.messageSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = fx.pop.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for end := time.Now().Add(20 * time.Second); !fx.pop.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("population not online after 20s: %v of %d sessions", fx.pop.Online(), pc.users)
		}
	}
	return fx
}

func (fx *fixture) user(i int) string { return fmt.Sprintf("%s-u%d", fx.prefix, i) }

type totals struct {
	sent, expected, delivered, recovered, lost, late, dup, reordered float64
}

func (fx *fixture) cohort(co metrics.Cohort) totals {
	var c totals
	for _, k := range fx.set.Kind {
		r := k.Cohort[co]
		c.sent += metrics.Value(k.Sent)
		c.expected += metrics.Value(r.Expected)
		c.delivered += metrics.Value(r.Delivered)
		c.recovered += metrics.Value(r.Recovered)
		c.lost += metrics.Value(r.Lost)
		c.late += metrics.Value(r.Late)
		c.dup += metrics.Value(r.Duplicate)
		c.reordered += metrics.Value(r.Reordered)
	}
	return c
}

// soak sends for d, stops sending, and waits until every owed message of
// the normal cohort is accounted for, or twice lost_after.
func (fx *fixture) soak(d, lostAfter time.Duration) totals {
	testwait.Traffic(fx.pop, d)
	testwait.Settle(fx.pop, 0, 2*lostAfter+time.Second, func() bool {
		c := fx.cohort(metrics.Normal)
		return c.expected > 0 && c.delivered+c.recovered+c.lost == c.expected
	})
	return fx.cohort(metrics.Normal)
}

// brokers are the brokers every population test runs on.
var brokers = []struct{ name, env string }{{"mosquitto", mosquittoVar}, {"mochi", mochiVar}}

// TestBrokerPopulation: 200 users in groups of 5 and in pairs, QoS 1,
// persistent sessions. Every acked message is delivered once; the
// receivers whose connections are dropped mid-run come back to what the
// broker queued for them, counted recovered, never lost.
func TestBrokerPopulation(t *testing.T) {
	for _, b := range brokers {
		for _, v := range []string{"3.1.1", "5"} {
			t.Run(b.name+"/"+v, func(t *testing.T) {
				fx := start(t, brokerURL(t, b.env), popConfig{users: 200, groupSize: 5, rate: 2, qos: 1, catchUp: true, version: v})
				time.Sleep(2 * time.Second)
				killed := 0
				for i := range 4 {
					killed += fx.kill(fx.user(7+i*41), time.Second)
				}
				c := fx.soak(4*time.Second, 5*time.Second)
				t.Logf("%s, MQTT %s: %+v; %d sessions dropped; unmatched %d; own echoes ignored %v",
					b.name, v, c, killed, fx.drv.FramesUnmatched(), metrics.Value(fx.set.Ignored[metrics.IgnoredOwn]))
				if c.expected < 2000 {
					t.Fatalf("%v expected deliveries, want thousands", c.expected)
				}
				if c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
					t.Errorf("%+v: want every acked message delivered or recovered, once", c)
				}
				if c.recovered == 0 {
					t.Errorf("nothing recovered after %d sessions dropped: the persistent sessions' queues were not counted", killed)
				}
				if n := fx.drv.FramesUnmatched(); n != 0 {
					t.Errorf("%d packets matched no topic or flight", n)
				}
				// MQTT 5 subscribes to groups with No Local: a session is
				// not sent its own group messages.
				if own := metrics.Value(fx.set.Ignored[metrics.IgnoredOwn]); v == "5" && own != 0 {
					t.Errorf("%v own messages echoed under No Local", own)
				} else if v == "3.1.1" && own == 0 {
					t.Errorf("no own group message echoed: MQTT 3.1.1 has no No Local, want them ignored as own")
				}
			})
		}
	}
}

// TestCleanSessionLoss: catch-up off, so sessions are clean: what is sent
// to a device while it is away is gone, and the ledger says so. With
// nobody dropped (TestBrokerPopulation) the same counts are zero.
func TestCleanSessionLoss(t *testing.T) {
	fx := start(t, brokerURL(t, mosquittoVar), popConfig{users: 40, groupSize: 5, rate: 5, qos: 1, catchUp: false})
	time.Sleep(time.Second)
	for range 5 {
		fx.kill(fx.user(3), 0)
		fx.kill(fx.user(17), 0)
		time.Sleep(300 * time.Millisecond)
	}
	c := fx.soak(3*time.Second, 5*time.Second)
	t.Logf("clean sessions, two receivers dropped five times: %+v", c)
	if c.lost == 0 {
		t.Errorf("%+v: nothing lost, want the messages sent to dropped clean sessions counted lost", c)
	}
	if c.recovered != 0 {
		t.Errorf("%+v: recovered without a persistent session", c)
	}
}

// TestQoS0: with qos 0 the ack is the write; on loopback mosquitto still
// delivers everything.
func TestQoS0(t *testing.T) {
	fx := start(t, brokerURL(t, mosquittoVar), popConfig{users: 50, groupSize: 5, rate: 5, qos: 0})
	c := fx.soak(3*time.Second, 5*time.Second)
	t.Logf("qos 0: %+v", c)
	if c.expected < 500 || c.lost != 0 || c.delivered != c.expected {
		t.Errorf("%+v: want every written message delivered", c)
	}
}

// TestMosquittoSlowReader: a broker whose max_queued_messages is 100, and
// one reader in ten that stops reading for 6 s while its groups send 16 KiB
// bodies. mosquitto keeps the connection and drops what is past the
// queue: lost to the slow reader, and to nobody else.
func TestMosquittoSlowReader(t *testing.T) {
	fx := start(t, brokerURL(t, mosquittoSlowVar), popConfig{users: 20, groupSize: 5, rate: 10, qos: 1,
		catchUp: true, messageSize: 4 << 10, slow: engine.SlowReaders{Fraction: 0.1, Pause: 6 * time.Second}})
	var maxLag int64
	for end := time.Now().Add(7 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		maxLag = max(maxLag, fx.pop.SlowReaderLag())
	}
	c := fx.soak(time.Second, 5*time.Second)
	sr := fx.cohort(metrics.SlowReader)
	for end := time.Now().Add(15 * time.Second); sr.delivered+sr.recovered+sr.lost < sr.expected && time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
		fx.pop.Sweep(time.Now())
		sr = fx.cohort(metrics.SlowReader)
	}
	t.Logf("normal %+v; slow %+v; slow reader's largest lag %d", c, sr, maxLag)
	if c.lost != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("normal users %+v: a slow reader must cost the others nothing", c)
	}
	if sr.lost == 0 {
		t.Errorf("slow reader %+v: nothing lost past mosquitto's queue of 100", sr)
	}
	if maxLag < 20 {
		t.Errorf("slow reader's lag peaked at %d, want it seen while it did not read", maxLag)
	}
}

// TestDevices: two devices per user, each its own client id and
// persistent session: each gets every message owed to it, its user's own
// group messages from the other device ignored as own, and nothing is lost.
func TestDevices(t *testing.T) {
	fx := start(t, brokerURL(t, mosquittoVar), popConfig{users: 40, groupSize: 5, rate: 2, qos: 1, catchUp: true, devices: 2})
	c := fx.soak(3*time.Second, 5*time.Second)
	t.Logf("2 devices: %+v", c)
	if c.expected < 500 || c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("%+v: want every message on every device it is owed to, once", c)
	}
}
