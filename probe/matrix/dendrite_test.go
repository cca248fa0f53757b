package matrix_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/probetest"
	"github.com/imcanary/imcanary/probe/matrix"
	"github.com/imcanary/imcanary/protocols"
)

// Dendrite is started by .ci/matrix.sh (from .ci/run); without its
// variables these tests skip.
const (
	urlVar    = "IMCANARYTEST_MATRIX_URL"
	secretVar = "IMCANARYTEST_MATRIX_SECRET"
)

func server(t testing.TB) (string, []byte) {
	t.Helper()
	u, s := os.Getenv(urlVar), os.Getenv(secretVar)
	if u == "" || s == "" {
		t.Skipf("%s and %s not set: no homeserver to test against (.ci/matrix.sh starts Dendrite)", urlVar, secretVar)
	}
	return u, []byte(s)
}

type popConfig struct {
	users, groupSize, devices int
	rate                      float64
	catchUp                   bool
	lostAfter                 time.Duration
	slow                      engine.SlowReaders
	timelineLimit             int
	// url, if set, is where the driver talks to (a proxy in front of
	// Dendrite).
	url string
}

type fixture struct {
	t      *testing.T
	pop    *engine.Population
	set    *metrics.Set
	drv    *matrix.Driver
	k      *probetest.Killer
	prefix string
}

func (fx *fixture) soak(d, lostAfter time.Duration, co metrics.Cohort) probetest.Totals {
	time.Sleep(d)
	return probetest.Settle(fx.t, fx.pop, fx.set, lostAfter, co)
}

func (fx *fixture) soakUntil(n float64, limit, lostAfter time.Duration, co metrics.Cohort) probetest.Totals {
	return probetest.SoakUntil(fx.t, fx.pop, fx.set, n, limit, lostAfter, co)
}

// config is the shipped configs/matrix.yaml's section, as a user runs it.
func shippedConfig(t testing.TB) matrix.Config {
	t.Helper()
	cfg, err := protocols.Loader().Load("../../configs/matrix.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return config.Section[matrix.Config](cfg, "matrix", matrix.DefaultConfig())
}

// runPrefix names this run's users and rooms apart from earlier runs'
// on the same homeserver.
func runPrefix(tag string) string {
	return fmt.Sprintf("imct%s%d", tag, time.Now().UnixNano()%1e9)
}

func start(t *testing.T, pc popConfig) *fixture {
	t.Helper()
	u, secret := server(t)
	if pc.url != "" {
		u = pc.url
	}
	c := shippedConfig(t)
	c.PollTimeout = 5 * time.Second
	if pc.timelineLimit > 0 {
		c.TimelineLimit = pc.timelineLimit
	}
	drv, err := matrix.New(c, matrix.Options{URL: u, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{t: t, drv: drv, prefix: runPrefix("")}
	fx.k = &probetest.Killer{Driver: drv, Abort: matrix.Abort, Provisioned: func(plan probe.Plan, took time.Duration, _ error) {
		t.Logf("provisioned %d users, %d groups, %d direct pairs in %s", len(plan.Users), len(plan.Groups), len(plan.Direct), took.Round(time.Millisecond))
	}}
	fx.set = metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
	lostAfter := pc.lostAfter
	if lostAfter == 0 {
		lostAfter = 10 * time.Second
	}
	fx.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver: fx.k, Run: "testrun", Heartbeat: time.Second,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, CatchUp: pc.catchUp,
		},
		Set: fx.set, Prefix: fx.prefix, Users: pc.users, GroupSize: pc.groupSize, Rate: pc.rate,
		Ramp: time.Second, Deadline: 5 * time.Second, LostAfter: lostAfter, Devices: pc.devices,
		SlowReaders: pc.slow,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	began := time.Now()
	wg.Go(func() { _ = fx.pop.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	// Registering and logging in a user is a password hash on the
	// server: the bound follows from the users asked for.
	limit := 60*time.Second + time.Duration(pc.users*max(pc.devices, 1))*200*time.Millisecond
	for !fx.pop.Ready() {
		if time.Since(began) > limit {
			t.Fatalf("population not online after %s: %v of %d sessions", limit, fx.pop.Online(), pc.users)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d users provisioned and online in %s", pc.users, time.Since(began).Round(time.Millisecond))
	return fx
}

func (fx *fixture) user(i int) string { return fmt.Sprintf("%s-u%d", fx.prefix, i) }

// TestDendritePopulation: 500 users in groups of 5 and in pairs, catch-up
// on. Every acked message is delivered once; the receivers whose
// sessions are dropped mid-run resume from their /sync position, and what
// they missed meanwhile counts recovered, never lost.
func TestDendritePopulation(t *testing.T) {
	fx := start(t, popConfig{users: 500, groupSize: 5, rate: 0.02, catchUp: true, lostAfter: 30 * time.Second})
	time.Sleep(3 * time.Second)
	killed := 0
	for i := range 20 {
		killed += fx.k.Kill(fx.user(11+i*23), 12*time.Second)
	}
	c := fx.soakUntil(2500, 4*time.Minute, 30*time.Second, metrics.Normal)
	ack := metrics.Count(fx.set.Kind[metrics.Group].AckLatency)
	lat := metrics.Count(fx.set.Kind[metrics.Group].Cohort[metrics.Normal].DeliveryLatency)
	k := fx.set.Kind[metrics.Group]
	t.Logf("500 users: %v; %d sessions dropped; unmatched %d; retries %d; group acks timed %d (p50 ≤%s, p99 ≤%s), deliveries timed %d (p50 ≤%s, p99 ≤%s)",
		c, killed, fx.drv.FramesUnmatched(), fx.drv.Retries(), ack, probetest.Quantile(k.AckLatency, 0.5), probetest.Quantile(k.AckLatency, 0.99),
		lat, probetest.Quantile(k.Cohort[metrics.Normal].DeliveryLatency, 0.5), probetest.Quantile(k.Cohort[metrics.Normal].DeliveryLatency, 0.99))
	if c.Expected < 2500 {
		t.Fatalf("%v expected deliveries, want thousands", c.Expected)
	}
	dup := c.Dup
	if dup > 0 {
		// A duplicate the homeserver stored is its own, not the resume's:
		// Dendrite checks a send's transaction id before the send is
		// done, so a retry of a PUT still in flight (retries above) makes
		// a second event. What the rooms hold says how many deliveries
		// such events explain.
		stored := fx.storedTwice()
		t.Logf("%v duplicate deliveries; the rooms hold events stored twice for %d deliveries", dup, stored)
		dup -= min(dup, float64(stored))
	}
	if c.Lost != 0 || dup != 0 || c.Delivered+c.Recovered != c.Expected {
		t.Errorf("%v: want every acked message delivered or recovered, once (duplicates the server stored aside)", c)
	}
	if c.Recovered == 0 {
		t.Errorf("nothing recovered after %d sessions dropped: the resumed /sync was not counted", killed)
	}
	if ack == 0 || lat == 0 {
		t.Errorf("ack latency observed %d times, delivery latency %d: want both recorded", ack, lat)
	}
	if n := fx.drv.FramesUnmatched(); n != 0 {
		t.Errorf("%d events matched no room", n)
	}
}

// TestDendriteCatchUpOff: without catch-up a session starts from the
// server's present, so what is sent to a device while it is away is lost
// to it, and the ledger says so.
func TestDendriteCatchUpOff(t *testing.T) {
	fx := start(t, popConfig{users: 40, groupSize: 5, rate: 0.25, catchUp: false, lostAfter: 10 * time.Second})
	time.Sleep(time.Second)
	for range 3 {
		fx.k.Kill(fx.user(3), 3*time.Second)
		fx.k.Kill(fx.user(17), 3*time.Second)
		time.Sleep(4 * time.Second)
	}
	c := fx.soak(2*time.Second, 10*time.Second, metrics.Normal)
	t.Logf("catch-up off, two receivers dropped three times: %v", c)
	if c.Lost == 0 {
		t.Errorf("%v: nothing lost, want the messages sent to the away devices counted lost", c)
	}
	if c.Recovered != 0 {
		t.Errorf("%v: recovered with catch-up off", c)
	}
}

// TestDendriteSlowReader: one reader in ten stops reading for 10 s while
// its rooms send, with a timeline limit of 2: at 0.4 sends a second per
// user its group room alone gets about 7 messages meanwhile, so the
// limit is passed by chance with odds of about 0.05 per slow reader
// (Poisson), not by a coin toss as at limit 5 and 0.3/s. Matrix never disconnects a
// slow reader: its next /sync says the timeline is limited, and the
// session fills the gap with /messages. Its fate is recovery: recovered,
// none lost, and the others are not touched.
func TestDendriteSlowReader(t *testing.T) {
	fx := start(t, popConfig{users: 30, groupSize: 5, rate: 0.4, catchUp: true, timelineLimit: 2, lostAfter: 20 * time.Second,
		slow: engine.SlowReaders{Fraction: 0.1, Pause: 10 * time.Second}})
	var maxLag int64
	for end := time.Now().Add(11 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		maxLag = max(maxLag, fx.pop.SlowReaderLag())
	}
	c := fx.soak(time.Second, 20*time.Second, metrics.Normal)
	sr := fx.soak(0, 20*time.Second, metrics.SlowReader)
	drops := 0.0
	for _, r := range []string{metrics.ReasonSlowConsumer, metrics.ReasonServerClose, metrics.ReasonError} {
		drops += metrics.Value(fx.set.Disconnects[r])
	}
	t.Logf("normal %v; slow %v; slow reader's largest lag %d; disconnects %v", c, sr, maxLag, drops)
	if c.Lost != 0 || c.Delivered+c.Recovered != c.Expected {
		t.Errorf("normal users %v: a slow reader must cost the others nothing", c)
	}
	if sr.Recovered == 0 || sr.Lost != 0 || sr.Delivered+sr.Recovered != sr.Expected {
		t.Errorf("slow reader %v: want its limited timelines filled by /messages, recovered, none lost", sr)
	}
	if drops != 0 {
		t.Errorf("%v sessions ended: Matrix keeps a slow reader's session", drops)
	}
	if maxLag < 3 {
		t.Errorf("slow reader's lag peaked at %d, want it seen while it did not read", maxLag)
	}
}

// TestDendriteDevices: two devices per user, each its own login and /sync:
// each gets every message owed to it, its sibling's sends included.
func TestDendriteDevices(t *testing.T) {
	fx := start(t, popConfig{users: 40, groupSize: 5, rate: 0.2, catchUp: true, devices: 2})
	c := fx.soakUntil(400, time.Minute, 10*time.Second, metrics.Normal)
	t.Logf("2 devices: %v", c)
	if c.Expected < 300 || c.Lost != 0 || c.Dup != 0 || c.Delivered+c.Recovered != c.Expected {
		t.Errorf("%v: want every message on every device it is owed to, once", c)
	}
}

// TestRetriedSendCountedOnce: a third of the sends get no answer, so
// imcanary retries them with the same transaction id; Dendrite answers a
// retry with the event it already made, and no message is counted twice.
// The control: a server that makes a second event for the same send (the
// "double" proxy) is seen as duplicates, so the first result is not the
// ledger's blindness.
func TestRetriedSendCountedOnce(t *testing.T) {
	target, _ := server(t)
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"drop", "double"} {
		t.Run(mode, func(t *testing.T) {
			p := &probetest.SendProxy{Mode: mode, Target: u,
				Match: func(r *http.Request) bool {
					return r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/send/m.room.message/")
				},
				// The transaction id, last in the path.
				Key: func(r *http.Request, _ []byte) string { return r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:] },
				// The same message under another transaction id.
				Again: func(r *http.Request, body []byte) (string, []byte) { return r.URL.Path + "x", body },
			}
			srv := p.Start(t)
			fx := start(t, popConfig{users: 20, groupSize: 5, rate: 0.4, catchUp: true, url: srv.URL})
			c := fx.soakUntil(300, time.Minute, 10*time.Second, metrics.Normal)
			t.Logf("%s: %v; sends meddled with %d, retries %d", mode, c, p.Meddled.Load(), fx.drv.Retries())
			if p.Meddled.Load() == 0 {
				t.Fatal("the proxy meddled with no send")
			}
			switch mode {
			case "drop":
				if fx.drv.Retries() < uint64(p.Meddled.Load()) {
					t.Errorf("%d retries for %d unanswered sends", fx.drv.Retries(), p.Meddled.Load())
				}
				if c.Dup != 0 || c.Lost != 0 || c.Delivered+c.Recovered != c.Expected {
					t.Errorf("%v: want every retried send delivered once", c)
				}
			case "double":
				if c.Dup == 0 {
					t.Errorf("%v: %d sends made twice by the server, no duplicate seen", c, p.Meddled.Load())
				}
			}
		})
	}
}

// TestProvisionIdempotent: a second driver (imcanary restarted) provisions
// the same plan again: users log in instead of registering, rooms are
// found by alias, and both drivers send into the same rooms.
func TestProvisionIdempotent(t *testing.T) {
	u, secret := server(t)
	prefix := runPrefix("p")
	plan := probe.Plan{
		Users:  []string{prefix + "-a", prefix + "-b", prefix + "-c"},
		Groups: []probe.Group{{Name: prefix + "-g", Members: []string{prefix + "-a", prefix + "-b", prefix + "-c"}}},
		Direct: []probe.Pair{{From: prefix + "-a", To: prefix + "-b"}, {From: prefix + "-b", To: prefix + "-a"}},
	}
	ctx := context.Background()
	var rooms [2]map[string]string
	for i := range rooms {
		drv, err := matrix.New(shippedConfig(t), matrix.Options{URL: u, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Provision(ctx, plan); err != nil {
			t.Fatalf("provisioning #%d: %v", i+1, err)
		}
		rooms[i] = matrix.Rooms(drv)
	}
	if len(rooms[0]) != 2 {
		t.Fatalf("rooms %v: want a group and a direct room", rooms[0])
	}
	for k, v := range rooms[0] {
		if rooms[1][k] != v {
			t.Errorf("%s: room %s, then %s", k, v, rooms[1][k])
		}
	}
	// Another secret cannot take the users over.
	drv, err := matrix.New(shippedConfig(t), matrix.Options{URL: u, Secret: []byte("not-the-secret")})
	if err != nil {
		t.Fatal(err)
	}
	err = drv.Provision(ctx, plan)
	if err == nil {
		t.Fatal("provisioned with a wrong shared secret")
	}
	if bytes.Contains([]byte(err.Error()), secret) {
		t.Errorf("error %q shows the secret", err)
	}
	t.Logf("wrong secret: %v", err)
}

// storedTwice reads every room's history and returns how many deliveries
// are owed to messages the homeserver stored more than once (one body in
// two events): each copy past the first, times the room's receivers.
func (fx *fixture) storedTwice() int {
	t := fx.t
	u, _ := server(t)
	members := map[string][]string{}
	plan := fx.pop.Plan()
	for _, g := range plan.Groups {
		members["g:"+g.Name] = g.Members
	}
	n := 0
	for conv, id := range matrix.Rooms(fx.drv) {
		m := members[conv]
		if strings.HasPrefix(conv, "d:") {
			m = strings.Split(strings.TrimPrefix(conv, "d:"), ",")
		}
		if len(m) < 2 {
			continue
		}
		tok := matrix.Token(fx.drv, m[0])
		if tok == "" {
			t.Logf("room %s: no token of %s to read it with", conv, m[0])
			continue
		}
		bodies := map[string]int{}
		from := ""
		for page := 0; page < 50; page++ {
			q := url.Values{"dir": {"b"}, "limit": {"1000"}}
			if from != "" {
				q.Set("from", from)
			}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u+"/_matrix/client/v3/rooms/"+url.PathEscape(id)+"/messages?"+q.Encode(), nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Logf("room %s: %v", conv, err)
				break
			}
			var out struct {
				Chunk []struct {
					Type    string `json:"type"`
					Content struct {
						Body string `json:"body"`
					} `json:"content"`
				} `json:"chunk"`
				End string `json:"end"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil {
				t.Logf("room %s: %v", conv, err)
				break
			}
			for _, ev := range out.Chunk {
				if ev.Type == "m.room.message" && ev.Content.Body != "" {
					bodies[ev.Content.Body]++
				}
			}
			if len(out.Chunk) == 0 || out.End == "" || out.End == from {
				break
			}
			from = out.End
		}
		for _, k := range bodies {
			if k > 1 {
				t.Logf("room %s holds one message %d times", conv, k)
				n += (k - 1) * (len(m) - 1)
			}
		}
	}
	return n
}
