package centrifugo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// These tests run the driver against a real Centrifugo v6 on loopback,
// started by .ci/centrifugo.sh with the namespaces it configures:
//
//	IMCANARYTEST_CENTRIFUGO_URL       ws://127.0.0.1:PORT/connection/websocket
//	IMCANARYTEST_CENTRIFUGO_SECRET    its client.token.hmac_secret_key
//	IMCANARYTEST_CENTRIFUGO_SLOW_URL  a second instance with a small
//	                                   client.queue_max_size (64 KiB), for
//	                                   the slow-reader drill
//
// Every test uses user and group names of its own, so tests and reruns
// against one server do not share channels.

func realServer(t *testing.T, urlVar string) (string, []byte) {
	t.Helper()
	url, secret := os.Getenv(urlVar), os.Getenv("IMCANARYTEST_CENTRIFUGO_SECRET")
	if url == "" || secret == "" {
		t.Skipf("%s and IMCANARYTEST_CENTRIFUGO_SECRET unset: no Centrifugo to test against "+
			"(.ci/centrifugo.sh start DIR PORT [QUEUE_MAX_SIZE] starts one)", urlVar)
	}
	return url, []byte(secret)
}

// uniquePrefix names a test's users and groups.
func uniquePrefix(name string) string {
	return fmt.Sprintf("%s%d", name, time.Now().UnixNano()%1e9)
}

// killable wraps the driver so that a test can cut a user's connection
// and keep it from logging in again for a while.
type killable struct {
	*Driver
	// away holds every login back this long: a device that logs out
	// stays away for it at least, while the others publish.
	away    time.Duration
	mu      sync.Mutex
	live    map[string]*session
	blocked map[string]time.Time
}

func (k *killable) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	if !probe.Sleep(ctx, k.away) {
		return nil, ctx.Err()
	}
	k.mu.Lock()
	until := k.blocked[user]
	k.mu.Unlock()
	if time.Now().Before(until) {
		return nil, errors.New("blocked by the test")
	}
	s, err := k.Driver.Connect(ctx, user, dev)
	if err == nil {
		k.mu.Lock()
		k.live[user] = s.(*session)
		k.mu.Unlock()
	}
	return s, err
}

// kill drops user's connection without a close frame, as a crash or a
// network failure does, and refuses its logins for down.
func (k *killable) kill(user string, down time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.blocked[user] = time.Now().Add(down)
	if s := k.live[user]; s != nil {
		s.conn.Abort()
	}
}

type popConfig struct {
	users, groupSize    int
	rate                float64
	deadline, lostAfter time.Duration
	// catchUp is target.catch_up: each device recovers on resubscribe
	// and fetches its gaps with history.
	catchUp bool
	// devices is population.devices; lifetime is
	// population.session_lifetime (churn).
	devices  int
	lifetime time.Duration
	// away is killable.away.
	away time.Duration
	// urlVar names the server's URL variable; empty is
	// IMCANARYTEST_CENTRIFUGO_URL.
	urlVar      string
	messageSize int
	slow        engine.SlowReaders
	observer    engine.Observer
}

type fixture struct {
	t    *testing.T
	drv  *killable
	pop  *engine.Population
	set  *metrics.Set
	took time.Duration // from start to the whole population online
}

// newFixture starts a population against the real server, waits until
// every user is online and subscribed, then starts sending: a user that
// is not yet subscribed would miss messages Centrifugo does not keep for
// it, and the ledger would rightly count them lost.
func newFixture(t *testing.T, name string, pc popConfig) *fixture {
	t.Helper()
	if pc.urlVar == "" {
		pc.urlVar = "IMCANARYTEST_CENTRIFUGO_URL"
	}
	url, secret := realServer(t, pc.urlVar)
	d, err := New(Config{}, Options{URL: url, Secret: secret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{t: t, drv: &killable{Driver: d, away: pc.away, live: map[string]*session{}, blocked: map[string]time.Time{}}}
	fx.set = metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver:     fx.drv,
			Run:        uniquePrefix("run"),
			Heartbeat:  time.Second,
			BackoffMin: 20 * time.Millisecond,
			BackoffMax: 300 * time.Millisecond,
			CatchUp:    pc.catchUp,
		},
		Set:             fx.set,
		Prefix:          uniquePrefix(name),
		Users:           pc.users,
		Devices:         pc.devices,
		GroupSize:       pc.groupSize,
		SessionLifetime: pc.lifetime,
		Rate:            pc.rate,
		Ramp:            time.Second,
		Deadline:        pc.deadline,
		LostAfter:       pc.lostAfter,
		StartPaused:     true,
		MessageSize:     pc.messageSize,
		SlowReaders:     pc.slow,
		Observer:        pc.observer,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { _ = fx.pop.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	testwait.For(t, 60*time.Second, "population online", fx.pop.Ready)
	fx.took = time.Since(start)
	fx.pop.SetSending(true)
	return fx
}

// drain pauses sending and waits until every acked message is accounted
// for (delivered or lost), then one more lost_after for stragglers and
// duplicates.
func (fx *fixture) drain(lostAfter time.Duration) {
	testwait.Settle(fx.pop, lostAfter, 2*lostAfter+5*time.Second, func() bool {
		c := fx.counts()
		return c.expected > 0 && c.delivered+c.recovered+c.lost >= c.expected && fx.pop.Inflight() == 0
	})
}

type totals struct {
	sent, expected, delivered, recovered, lost, late, dup, reordered, ignored float64
}

func (fx *fixture) counts() totals {
	var c totals
	for _, k := range fx.set.Kind {
		c.sent += metrics.Value(k.Sent)
		c.expected += metrics.Value(k.Cohort[metrics.Normal].Expected)
		c.delivered += metrics.Value(k.Cohort[metrics.Normal].Delivered)
		c.recovered += metrics.Value(k.Cohort[metrics.Normal].Recovered)
		c.lost += metrics.Value(k.Cohort[metrics.Normal].Lost)
		c.late += metrics.Value(k.Cohort[metrics.Normal].Late)
		c.dup += metrics.Value(k.Cohort[metrics.Normal].Duplicate)
		c.reordered += metrics.Value(k.Cohort[metrics.Normal].Reordered)
	}
	for _, ig := range fx.set.Ignored {
		c.ignored += metrics.Value(ig)
	}
	return c
}

// latency returns the merged delivery latency histogram: the count, and
// the bucket bound below which each of the quantiles qs falls.
func (fx *fixture) latency(qs ...float64) (uint64, []float64) {
	var count uint64
	below := map[float64]uint64{}
	var bounds []float64
	for _, k := range fx.set.Kind {
		var m dto.Metric
		_ = k.Cohort[metrics.Normal].DeliveryLatency.(prometheus.Metric).Write(&m)
		count += m.Histogram.GetSampleCount()
		for _, b := range m.Histogram.Bucket {
			if _, ok := below[b.GetUpperBound()]; !ok {
				bounds = append(bounds, b.GetUpperBound())
			}
			below[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	out := make([]float64, len(qs))
	for i, q := range qs {
		out[i] = math.Inf(1)
		for _, b := range bounds {
			if float64(below[b]) >= q*float64(count) {
				out[i] = b
				break
			}
		}
	}
	return count, out
}

// TestRealPopulation logs in 520 users, each subscribed to its group and
// its direct channel, runs direct and group traffic through a real
// population, and checks the ledger finds nothing wrong: every expected
// delivery arrives once, in order, on time, and the server's offsets show
// no gap. It lasts past two server pings, so the pongs are checked too.
func TestRealPopulation(t *testing.T) {
	const users = 520
	pc := popConfig{users: users, groupSize: 5, rate: 1, deadline: 2 * time.Second, lostAfter: 5 * time.Second}
	fx := newFixture(t, "pop", pc)
	t.Logf("%d users online and subscribed in %v", users, fx.took.Round(time.Millisecond))
	time.Sleep(8 * time.Second)
	fx.drain(pc.lostAfter)
	c := fx.counts()
	n, q := fx.latency(0.5, 0.99, 1)
	t.Logf("counts %+v; latency p50 ≤ %vs, p99 ≤ %vs, max ≤ %vs over %d deliveries; server %+v",
		c, q[0], q[1], q[2], n, fx.drv.ServerStats())
	if got := fx.pop.LoggedIn(); got != users {
		t.Errorf("logged in %d users, want %d", got, users)
	}
	if c.expected < 4*users {
		t.Fatalf("expected deliveries = %v, want thousands", c.expected)
	}
	if c.delivered != c.expected {
		t.Errorf("delivered = %v, want every expected delivery (%v)", c.delivered, c.expected)
	}
	if c.lost != 0 || c.late != 0 || c.dup != 0 || c.reordered != 0 || c.ignored != 0 {
		t.Errorf("lost/late/duplicate/reordered/ignored = %v/%v/%v/%v/%v against a healthy server, want all 0",
			c.lost, c.late, c.dup, c.reordered, c.ignored)
	}
	if n != uint64(c.delivered) {
		t.Errorf("latency observations = %d, want one per delivery (%v)", n, c.delivered)
	}
	for _, r := range metrics.DisconnectReasons {
		if v := metrics.Value(fx.set.Disconnects[r]); v != 0 {
			t.Errorf("disconnects{reason=%q} = %v, want 0 (pings answered, nothing dropped)", r, v)
		}
	}
	if st := fx.drv.ServerStats(); st != (ServerStats{}) {
		t.Errorf("ServerStats() = %+v, want no gap", st)
	}
}

// TestRealKilledReceiver cuts one user's connection mid-run and keeps it
// out for two seconds. Without catch-up, what was published to it
// meanwhile is lost, and the ledger and the server's offsets agree on how
// much; with catch-up, it all arrives on resubscribe, recovered, and
// nothing is lost.
func TestRealKilledReceiver(t *testing.T) {
	for _, catchUp := range []bool{false, true} {
		t.Run(fmt.Sprintf("catch_up=%v", catchUp), func(t *testing.T) {
			pc := popConfig{users: 20, groupSize: 5, rate: 10, deadline: time.Second, lostAfter: 3 * time.Second, catchUp: catchUp}
			fx := newFixture(t, "kill"+strconv.FormatBool(catchUp)[:1], pc)
			time.Sleep(1500 * time.Millisecond)
			const victim = 7
			down := 2 * time.Second
			fx.drv.kill(fx.pop.Plan().Users[victim], down)
			testwait.For(t, 5*time.Second, "the victim to go offline", func() bool { return fx.pop.Online() < pc.users })
			testwait.For(t, 10*time.Second, "the victim to come back", func() bool { return fx.pop.Online() == pc.users })
			// Every sender sends again after the victim's return, so
			// every gap in its streams shows.
			time.Sleep(2 * time.Second)
			fx.drain(pc.lostAfter)
			c := fx.counts()
			st := fx.drv.ServerStats()
			t.Logf("counts %+v; server %+v; disconnects error=%v", c, st, metrics.Value(fx.set.Disconnects[metrics.ReasonError]))
			if d := metrics.Value(fx.set.Disconnects[metrics.ReasonError]); d != 1 {
				t.Errorf("disconnects{reason=error} = %v, want 1 (the victim)", d)
			}
			// A message the victim wrote just before its death may reach
			// its peers without an ack: delivered, never expected.
			if extra := c.delivered + c.recovered + c.lost - c.expected; extra < 0 || extra > 4 {
				t.Errorf("delivered %v + recovered %v + lost %v - expected %v = %v, want 0..4: every acked message accounted once",
					c.delivered, c.recovered, c.lost, c.expected, extra)
			}
			if c.dup != 0 || c.reordered != 0 {
				t.Errorf("duplicate/reordered = %v/%v, want 0", c.dup, c.reordered)
			}
			if !catchUp {
				// At 10 msg/s per user, the victim's group (4 peers
				// sending half their messages there) and its direct
				// peer send it about 25 messages a second.
				if c.lost < 20 {
					t.Errorf("lost = %v with a receiver down for %v, want dozens", c.lost, down)
				}
				// The offsets count every publication the victim did
				// not see, its own last echoes too: a handful more.
				if float64(st.Missed) < c.lost || float64(st.Missed) > c.lost+5 {
					t.Errorf("server offsets missed %d, ledger lost %v: want them to agree within the victim's own echoes", st.Missed, c.lost)
				}
				if st.Gaps == 0 || st.Recovered != 0 || c.recovered != 0 {
					t.Errorf("ServerStats() = %+v, recovered %v: want gaps and no recovery", st, c.recovered)
				}
				return
			}
			if c.lost != 0 {
				t.Errorf("lost = %v with catch-up, want 0", c.lost)
			}
			// At about 25 messages a second to it, the victim misses
			// dozens in two seconds down.
			if c.recovered < 20 {
				t.Errorf("recovered = %v, want the dozens published to the victim while it was down", c.recovered)
			}
			// The server's count of what it recovered includes the
			// victim's own echoes, which the ledger is not owed.
			if float64(st.Recovered) < c.recovered || st.Missed != 0 || st.Gaps != 0 {
				t.Errorf("ServerStats() = %+v, want at least %v recovered and nothing missed", st, c.recovered)
			}
		})
	}
}

// countHandler counts acks and deliveries, optionally slowly.
type countHandler struct {
	acks, rejects atomic.Int64
	n             *atomic.Int64
	delay         func()
}

func (h *countHandler) OnAck(uint64, probe.Ack) { h.acks.Add(1) }
func (h *countHandler) OnReject(uint64, string) { h.rejects.Add(1) }

func (h *countHandler) OnDelivery(*probe.Delivery) {
	if h.delay != nil {
		h.delay()
	}
	if h.n != nil {
		h.n.Add(1)
	}
}

// TestRealSlowReaderDrill is the slow-reader drill against a real
// Centrifugo whose client.queue_max_size is 64 KiB: two of ten users read
// one delivery every 100 ms while 50 bodies of 16 KiB a second come at
// them. Centrifugo must close them with 3008, counted as slow_consumer, and
// the normal users must lose nothing.
//
// Slower reading is no better a drill: a write Centrifugo cannot finish
// within its 1 s write timeout ends the connection without the 3008 frame,
// and a larger queue keeps the backlog in socket buffers where the same
// happens. The 64 KiB queue applies to every user, though: a normal user
// starved of CPU for a fifth of a second by the other packages CI tests
// beside this one overflows it too and is closed like a slow reader. The
// test tells the cohorts apart by user, and holds the normal users to no
// loss only while none of them was closed; if one was, that is this
// machine's load, which the test logs rather than blames on the server.
func TestRealSlowReaderDrill(t *testing.T) {
	disc := &cohortDisconnects{}
	pc := popConfig{users: 10, groupSize: 5, rate: 20, deadline: 2 * time.Second, lostAfter: 5 * time.Second,
		urlVar: "IMCANARYTEST_CENTRIFUGO_SLOW_URL", messageSize: 16 << 10,
		slow:     engine.SlowReaders{Fraction: 0.2, ReadDelay: 100 * time.Millisecond},
		observer: disc}
	fx := newFixture(t, "drill", pc)
	disc.pop.Store(fx.pop)
	slow := 0
	for i := range fx.pop.Users() {
		if fx.pop.Slow(i) {
			slow++
		}
	}
	start := time.Now()
	testwait.For(t, 30*time.Second, "every slow reader disconnected as a slow consumer", func() bool {
		return disc.count(true, metrics.ReasonSlowConsumer) >= slow
	})
	t.Logf("%d slow readers disconnected with 3008 within %v", slow, time.Since(start).Round(time.Millisecond))
	// The normal users go on while the slow readers reconnect and fall
	// behind again.
	time.Sleep(3 * time.Second)
	fx.drain(pc.lostAfter)
	c := fx.counts()
	var sr totals
	for _, k := range fx.set.Kind {
		sr.expected += metrics.Value(k.Cohort[metrics.SlowReader].Expected)
		sr.delivered += metrics.Value(k.Cohort[metrics.SlowReader].Delivered)
		sr.lost += metrics.Value(k.Cohort[metrics.SlowReader].Lost)
	}
	t.Logf("normal: %+v; slow readers: %+v; disconnects %v", c, sr, disc.all())
	if sr.expected == 0 {
		t.Errorf("slow readers: nothing expected, want their deliveries in their own cohort")
	}
	// Every slow reader was closed with 3008 above. Its later sessions
	// may instead end on Centrifugo's 1 s write timeout, without a close
	// frame, the more often the more loaded this machine is: those are
	// error disconnects, rightly, and are only logged.
	if n := disc.count(true, metrics.ReasonError); n > 0 {
		t.Logf("slow readers: %d closed without a close frame (error) beside %d with 3008", n, disc.count(true, metrics.ReasonSlowConsumer))
	}
	if c.expected < 1000 || c.delivered+c.lost < c.expected || c.dup != 0 {
		t.Errorf("normal users: %+v, want a thousand or more expected deliveries, each accounted for once", c)
	}
	if n := disc.normal(); n > 0 {
		t.Logf("%d normal-user disconnects: this machine starved them (the 64 KiB queue holds 4 bodies); their %v lost deliveries are not held against the server", n, c.lost)
		return
	}
	if c.lost != 0 || c.delivered != c.expected {
		t.Errorf("normal users, none disconnected: %+v, want every expected delivery delivered and none lost", c)
	}
}

// cohortDisconnects counts session ends by cohort and reason.
type cohortDisconnects struct {
	pop atomic.Pointer[engine.Population]
	mu  sync.Mutex
	n   map[string]int
}

func (d *cohortDisconnects) Disconnect(user int, reason string, _ error) {
	p := d.pop.Load()
	if p == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[fmt.Sprintf("%v/%s", p.Slow(user), reason)]++
}

func (d *cohortDisconnects) count(slow bool, reason string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[fmt.Sprintf("%v/%s", slow, reason)]
}

func (d *cohortDisconnects) normal() int {
	n := 0
	for _, r := range metrics.DisconnectReasons {
		if r != metrics.ReasonShutdown {
			n += d.count(false, r)
		}
	}
	return n
}

func (d *cohortDisconnects) all() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.n)
}

func (*cohortDisconnects) Login(int, time.Duration, error)                            {}
func (*cohortDisconnects) Ack(uint64, bool, time.Duration)                            {}
func (*cohortDisconnects) Unacked(uint64, string, string)                             {}
func (*cohortDisconnects) Received(int, *probe.Header, time.Duration, engine.Outcome) {}

// TestRealWrongSecret: a token signed with the wrong secret is refused by
// the real Centrifugo, and the failure is classed unauthorized, so that a
// rotated secret pages as an authentication failure and not as an outage.
func TestRealWrongSecret(t *testing.T) {
	url, _ := realServer(t, "IMCANARYTEST_CENTRIFUGO_URL")
	drv, err := New(Config{}, Options{URL: url, Secret: []byte("not the server's secret at all"), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = drv.Connect(context.Background(), uniquePrefix("wrongsecret")+"-u0", probe.Device{})
	if err == nil {
		t.Fatal("Connect with the wrong secret succeeded")
	}
	if got := probe.FailureReason(err); got != metrics.ConnectUnauthorized {
		t.Errorf("FailureReason(%v) = %q, want %q", err, got, metrics.ConnectUnauthorized)
	}
	t.Logf("%v: %s", err, probe.DescribeFailure(probe.FailureReason(err), err.Error()))
}

// TestRealChurnCatchUp: with catch-up, every session lives a couple of
// seconds on average and its device logs in again a quarter of a second
// later at the least, while the others keep publishing to its channels. What a device missed while
// away comes back by the resubscribe's recovery (or a history fetch),
// counted recovered: nothing is lost, nothing duplicated. Against a clean
// server, so every delivery owed is accounted: delivered + recovered =
// expected, but for the messages a churned session wrote and never saw
// acknowledged, which their recipients may still receive (delivered,
// never expected): per kind, at most those messages times their fan-out.
func TestRealChurnCatchUp(t *testing.T) {
	obs := &deviceObserver{}
	pc := popConfig{users: 20, groupSize: 5, rate: 5, deadline: time.Second, lostAfter: 4 * time.Second,
		catchUp: true, lifetime: 2 * time.Second, away: 250 * time.Millisecond, observer: obs}
	fx := newFixture(t, "churn", pc)
	obs.pop.Store(fx.pop)
	time.Sleep(10 * time.Second)
	fx.drain(pc.lostAfter)
	c := fx.counts()
	churned := metrics.Value(fx.set.Disconnects[metrics.ReasonChurn])
	ignored := map[string]float64{}
	for r, v := range fx.set.Ignored {
		if n := metrics.Value(v); n != 0 {
			ignored[r] = n
		}
	}
	t.Logf("counts %+v; churned sessions %v, ignored %v; server %+v", c, churned, ignored, fx.drv.ServerStats())
	if churned < float64(pc.users) {
		t.Fatalf("churned sessions = %v over 10 s with a 2 s mean lifetime, want at least one per user (%d)", churned, pc.users)
	}
	if c.lost != 0 || c.dup != 0 {
		t.Errorf("lost/duplicate = %v/%v with catch-up, want 0/0", c.lost, c.dup)
	}
	if c.recovered == 0 {
		t.Errorf("recovered = 0 after %v churned sessions, want what was published to devices while they were away", churned)
	}
	for k, fanout := range map[metrics.Kind]int{metrics.Direct: 1, metrics.Group: pc.groupSize - 1} {
		ks := &fx.set.Kind[k]
		sent, acked := metrics.Value(ks.Sent), float64(obs.acks[k].Load())
		got := metrics.Value(ks.Cohort[metrics.Normal].Delivered) + metrics.Value(ks.Cohort[metrics.Normal].Recovered)
		expected := metrics.Value(ks.Cohort[metrics.Normal].Expected)
		bound := (sent - acked) * float64(fanout)
		t.Logf("%s: sent %v, acked %v, expected %v, delivered+recovered %v", k.Name(), sent, acked, expected, got)
		if extra := got - expected; extra < 0 || extra > bound {
			t.Errorf("%s: delivered+recovered %v - expected %v = %v, want 0..%v (%v written, never acknowledged, × fan-out %d)",
				k.Name(), got, expected, extra, bound, sent-acked, fanout)
		}
	}
	for _, r := range []string{metrics.IgnoredMalformed, metrics.IgnoredStale, metrics.IgnoredAfterLost, metrics.IgnoredTooOld} {
		if ignored[r] != 0 {
			t.Errorf("ignored{reason=%q} = %v, want 0", r, ignored[r])
		}
	}
}

// deviceObserver counts acks by kind and the deliveries each user got of
// its own messages (from its other device).
type deviceObserver struct {
	cohortDisconnects
	acks   [2]atomic.Int64 // by metrics.Kind
	mirror atomic.Int64
	names  atomic.Pointer[[]string]
}

func (o *deviceObserver) Ack(_ uint64, group bool, _ time.Duration) {
	o.acks[metrics.KindOf(group)].Add(1)
}

func (o *deviceObserver) Received(user int, h *probe.Header, _ time.Duration, out engine.Outcome) {
	names := o.names.Load()
	if names != nil && string(h.Sender) == (*names)[user] && (out == engine.Delivered || out == engine.Recovered) {
		o.mirror.Add(1)
	}
}

// TestRealDevices: every user keeps two connections (devices) online at
// once. Each publication reaches every device of its recipients and the
// sender's other device, and the ledger expects it at each: direct
// messages 2+1, group messages of 5 members 4×2+1. On a clean run every
// expected delivery arrives once, and each user's devices mirror each
// other: one delivery per acknowledged message is the sender's own, at its
// other device.
func TestRealDevices(t *testing.T) {
	obs := &deviceObserver{}
	pc := popConfig{users: 20, groupSize: 5, rate: 5, deadline: 2 * time.Second, lostAfter: 5 * time.Second,
		catchUp: true, devices: 2, observer: obs}
	fx := newFixture(t, "devices", pc)
	names := fx.pop.Plan().Users
	obs.names.Store(&names)
	obs.pop.Store(fx.pop)
	if got := fx.pop.Online(); got != 2*pc.users {
		t.Fatalf("online sessions = %d, want %d (two devices per user)", got, 2*pc.users)
	}
	time.Sleep(6 * time.Second)
	fx.drain(pc.lostAfter)
	c := fx.counts()
	direct, group := obs.acks[metrics.Direct].Load(), obs.acks[metrics.Group].Load()
	t.Logf("counts %+v; acked direct %d, group %d; mirrored to the sender's other device %d; disconnects %v; server %+v",
		c, direct, group, obs.mirror.Load(), obs.all(), fx.drv.ServerStats())
	ed := metrics.Value(fx.set.Kind[metrics.Direct].Cohort[metrics.Normal].Expected)
	eg := metrics.Value(fx.set.Kind[metrics.Group].Cohort[metrics.Normal].Expected)
	if direct == 0 || group == 0 {
		t.Fatalf("acked direct %d, group %d: want both", direct, group)
	}
	if ed != float64(3*direct) || eg != float64(9*group) {
		t.Errorf("expected direct %v, group %v; want 3×%d = %d and 9×%d = %d: every device of each recipient and the sender's other one",
			ed, eg, direct, 3*direct, group, 9*group)
	}
	if c.lost != 0 || c.dup != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("delivered %v + recovered %v of expected %v, lost %v, duplicate %v: want every expected delivery once, none lost",
			c.delivered, c.recovered, c.expected, c.lost, c.dup)
	}
	if got := obs.mirror.Load(); got != direct+group {
		t.Errorf("deliveries of a user's own messages = %d, want one per acknowledged message (%d), at the sender's other device", got, direct+group)
	}
	if n := obs.normal(); n != 0 {
		t.Errorf("%d disconnects (%v), want none", n, obs.all())
	}
	if st := fx.drv.ServerStats(); st != (ServerStats{}) {
		t.Errorf("ServerStats() = %+v, want no gap", st)
	}
}
