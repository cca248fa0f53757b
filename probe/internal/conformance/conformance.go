// Package conformance is the suite every adapter's tests run: one set of
// behaviours, proved the same way for every protocol, against the adapter's
// fake server and, where CI runs one, its real server. An adapter's test
// describes its server (Server) and calls Run; the suite makes drivers
// with the adapter's registry entry, as the daemon does, and checks:
//
//   - provision: a plan provisioned twice succeeds both times;
//   - session: two users log in, one's direct and group messages are
//     acknowledged to it and delivered to the other, byte for byte, and a
//     Close ends both sessions with reason shutdown and closes their
//     connections;
//   - population: a population sends direct and group messages and the
//     ledger finds every one delivered once, in order, on time;
//   - dead-peer: a server that goes silent without closing (a peer that
//     died) ends the session within the adapter's idle deadline, and its
//     connection is closed;
//   - catch-up, where the server keeps history: a user away for seconds
//     misses nothing, and nothing is counted twice;
//   - faults, where the fake server injects them: duplicated pushes are
//     counted as duplicates, dropped pushes recovered (or lost, without
//     catch-up), each in the number the server injected;
//   - slow-reader, where the server has a slow-consumer policy that shows
//     within seconds: readers that stop are closed with the reason the
//     adapter must tell (or lose what the server drops), and the other
//     users lose nothing;
//   - kick, where the server can end a session: the adapter reports the
//     reason the server gave;
//   - secret, where the server checks it: a login signed with another
//     secret fails as unauthorized.
//
// It is imported by tests only.
package conformance

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/probetest"
)

// Faults are what a fake server does wrong on purpose, as fractions of the
// pushes it makes to one connection.
type Faults struct {
	// Duplicate pushes are sent twice.
	Duplicate float64
	// DropPush pushes are not sent, while the message stays in the
	// recipient's history: a gap the adapter fills by catch-up.
	DropPush float64
}

// Server is a server an adapter is proved against.
type Server struct {
	// Adapter is the adapter's registry entry: the suite makes every
	// driver with Adapter.New.
	Adapter probe.Adapter
	// CatchUp says that the adapter fetches what a device missed from
	// this server's history.
	CatchUp bool
	// Faulty says that Start can inject Faults; a real server cannot.
	Faulty bool
	// WrongSecret says that the server refuses a login signed with
	// another secret than its own.
	WrongSecret bool
	// Start starts the server with faults f (zero for one that is not
	// Faulty; a real server is already running) and returns an instance
	// of it, the host:port of its session endpoint (where the sessions'
	// connections go) passed through via.
	Start func(t *testing.T, f Faults, via func(hostport string) string) Instance
	// SlowStart, if set, starts a server (or names a running one) whose
	// policy for a reader that stops reading shows within seconds: a
	// small send queue, a short send timeout. SlowReason is the
	// disconnect reason the adapter must report for it, or "" for a
	// server that drops what the reader cannot take and keeps its
	// session, which must then count as loss in the slow readers'
	// cohort. SlowMessageSize is the drill's message size, 0 for 4 KiB:
	// large enough to fill the server's queue within seconds. SlowPause
	// is how long a slow reader stops reading, 0 for 6 s, and SlowRate
	// the messages a second each other user sends meanwhile, 0 for 20:
	// a server whose policy is a write deadline needs a pause past the
	// deadline plus the time its pushes take to fill the socket.
	SlowStart       func(t *testing.T, via func(hostport string) string) Instance
	SlowReason      string
	SlowMessageSize int
	SlowPause       time.Duration
	SlowRate        float64
	// Silence is the longest the adapter, as the target configures it,
	// may take to notice a server gone silent (a dead peer); 0 is a
	// WebSocket session's idle deadline, wsconn.IdleFor: two heartbeats
	// and 5 s.
	Silence time.Duration
	// Reactor runs the suite's populations with population.reactor on:
	// every session the adapter can have watched (probe.Watcher) is read
	// on the population's poller, and the population and slow-reader
	// subtests check that every session was: a slow reader's pauses
	// then hold its watched connection's reading (probe.Holder), with no
	// goroutine asleep.
	Reactor bool
	// SlowOnce runs the slow-reader drill only with the reactor, for a
	// server whose slow-consumer instance one drill leaves unable to take
	// a second in time (Centrifugo's, whose small queue is still
	// draining).
	SlowOnce bool
	// Scale stretches the suite's time limits for a server that is slow
	// at what it does (a password hash per login, a database write per
	// message): 0 is 1.
	Scale float64
	// Rate is the messages a second each user of the population and
	// catch-up subtests sends: 0 is the suite's 5. A server that takes one
	// conversation's messages one after another (the real OpenIM in CI
	// pushed one conversation's about 7 a second) needs less, or its
	// pushes queue behind each other and catch-up fetches them first.
	Rate float64
}

// Instance is one started server.
type Instance struct {
	// Target is what the adapter's driver is made for. Heartbeat, if
	// zero, is the suite's (half a second).
	Target probe.Target
	// Injected, if set, returns how many pushes the server has
	// duplicated and dropped so far (Faults).
	Injected func() (duplicated, dropped uint64)
	// Kick, if set, has the server end user's sessions for a reason of
	// its own, for which the adapter must report KickReason.
	Kick       func(user string)
	KickReason string
}

// Run runs the suite against s. Its subtests run in parallel: each has
// users, groups and (on a fake server) a server of its own, and most of
// their time is spent waiting on timers (a deadline, a silent peer).
func Run(t *testing.T, s Server) {
	if s.Scale == 0 {
		s.Scale = 1
	}
	for _, st := range []struct {
		name string
		// skip, if not empty, says why the server cannot show it.
		skip string
		run  func(*testing.T, Server)
	}{
		{"provision", "", provision},
		{"session", "", session},
		{"population", "", population},
		{"dead-peer", "", deadPeer},
		{"catch-up", cond(!s.CatchUp, "the adapter does not catch up from this server"), catchUp},
		{"faults", cond(!s.Faulty, "the server cannot inject faults"), faults},
		{"slow-reader", cmp.Or(cond(s.SlowStart == nil, "the server has no slow-consumer policy that shows within seconds here"),
			cond(s.SlowOnce && !s.Reactor, "the drill runs once, with the reactor: one leaves this server's instance unable to take another")), slowReader},
		{"kick", "", kick},
		{"secret", cond(!s.WrongSecret, "the server does not check the secret"), secret},
	} {
		t.Run(st.name, func(t *testing.T) {
			if st.skip != "" {
				t.Skip(st.skip)
			}
			t.Parallel()
			st.run(t, s)
		})
	}
}

// cond is why if c, else "".
func cond(c bool, why string) string {
	if c {
		return why
	}
	return ""
}

// scaled is d stretched by s.Scale.
func (s Server) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.Scale)
}

// driver starts the server with f, its session endpoint through via (nil
// for none), and makes a driver for it.
func (s Server) driver(t *testing.T, f Faults, via func(string) string) (probe.Driver, Instance) {
	t.Helper()
	if via == nil {
		via = func(a string) string { return a }
	}
	in := s.Start(t, f, via)
	if in.Target.Heartbeat == 0 {
		in.Target.Heartbeat = 500 * time.Millisecond
	}
	in.Target.Logger = dbgLog()
	drv, err := s.Adapter.New(in.Target)
	if err != nil {
		t.Fatalf("%s: New: %v", s.Adapter.Config.Name, err)
	}
	return drv, in
}

// prefix names a run's users apart from every earlier run's: a real server
// keeps them.
func prefix(tag string) string {
	return fmt.Sprintf("cf%s%d", tag, time.Now().UnixNano()%1e8)
}

// viaProxy returns a via that puts a proxy in front of the session
// endpoint, and the proxy, once the server has been started.
func viaProxy(t *testing.T) (func(string) string, func() *proxy) {
	var p *proxy
	return func(hostport string) string {
			p = newProxy(t, hostport)
			return p.Addr()
		}, func() *proxy {
			if p == nil {
				t.Fatal("Start never passed the session endpoint through via")
			}
			return p
		}
}

func provision(t *testing.T, s Server) {
	drv, _ := s.driver(t, Faults{}, nil)
	pre := prefix("p")
	plan := probe.Plan{
		Users:  []string{pre + "-u0", pre + "-u1", pre + "-u2"},
		Groups: []probe.Group{{Name: pre + "-g0", Members: []string{pre + "-u0", pre + "-u1", pre + "-u2"}}},
		Direct: []probe.Pair{{From: pre + "-u0", To: pre + "-u1"}, {From: pre + "-u1", To: pre + "-u0"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.scaled(30*time.Second))
	defer cancel()
	for i := range 2 {
		if err := drv.Provision(ctx, plan); err != nil {
			t.Fatalf("provision #%d: %v", i+1, err)
		}
	}
}

// recorder is a Handler that keeps what a session read.
type recorder struct {
	mu         sync.Mutex
	acks       map[uint64]probe.Ack
	rejects    map[uint64]string
	deliveries []delivery
}

type delivery struct {
	from  string
	group bool
	body  string
}

func newRecorder() *recorder {
	return &recorder{acks: map[uint64]probe.Ack{}, rejects: map[uint64]string{}}
}

func (r *recorder) OnAck(ref uint64, a probe.Ack) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acks[ref] = probe.Ack{Seq: a.Seq}
}

func (r *recorder) OnReject(ref uint64, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejects[ref] = reason
}

func (r *recorder) OnDelivery(d *probe.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries = append(r.deliveries, delivery{from: string(d.From), group: d.Group, body: string(d.Body)})
}

func (r *recorder) acked(ref uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.acks[ref]
	return ok
}

func (r *recorder) rejected() map[uint64]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.rejects)
}

func (r *recorder) got(body string) (delivery, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.deliveries {
		if d.body == body {
			return d, true
		}
	}
	return delivery{}, false
}

// served is a session and the end of its Serve.
type served struct {
	probe.Session
	rec  *recorder
	done chan error
}

// serve connects user as device 0 and serves the session until the test
// ends.
func serve(t *testing.T, ctx context.Context, drv probe.Driver, user string) *served {
	t.Helper()
	sess, err := drv.Connect(ctx, user, probe.Device{})
	if err != nil {
		t.Fatalf("connect %s: %v", user, err)
	}
	sv := &served{Session: sess, rec: newRecorder(), done: make(chan error, 1)}
	go func() { sv.done <- sess.Serve(sv.rec) }()
	t.Cleanup(func() {
		_ = sess.Close()
		<-sv.done
	})
	return sv
}

// ended waits up to limit for the session's Serve to return, and returns
// its error.
func (sv *served) ended(t *testing.T, limit time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-sv.done:
		sv.done <- err // for the cleanup
		return err
	case <-time.After(limit):
		t.Fatalf("%s: Serve still running after %v", what, limit)
		return nil
	}
}

// body is a probe body from user, numbered seq in stream.
func body(user, stream string, seq uint64) []byte {
	return probe.AppendBody(nil, &probe.Header{
		Run: []byte("conformance"), Sender: []byte(user), Stream: []byte(stream),
		Seq: seq, Intended: time.Now().UnixNano(),
	}, 0)
}

func session(t *testing.T, s Server) {
	via, prox := viaProxy(t)
	drv, _ := s.driver(t, Faults{}, via)
	pre := prefix("s")
	// Three members: a group of two is refused by some servers
	// (Mattermost's group channels hold 3 to 8).
	a, b, c, g := pre+"-u0", pre+"-u1", pre+"-u2", pre+"-g0"
	ctx, cancel := context.WithTimeout(context.Background(), s.scaled(30*time.Second))
	defer cancel()
	if err := drv.Provision(ctx, probe.Plan{
		Users: []string{a, b, c}, Groups: []probe.Group{{Name: g, Members: []string{a, b, c}}},
		Direct: []probe.Pair{{From: a, To: b}, {From: b, To: a}},
	}); err != nil {
		t.Fatal(err)
	}
	sa, sb := serve(t, ctx, drv, a), serve(t, ctx, drv, b)
	if err := sa.Ping(); err != nil {
		t.Fatalf("ping: %v", err)
	}
	direct, group := body(a, "d."+b, 1), body(a, "g."+g, 1)
	limit := s.scaled(10 * time.Second)
	// A server may take a moment to route to a session that has just
	// logged in (a subscription, a presence): the first message is sent
	// again until it arrives, as a fresh session's first is by a person.
	var ref uint64
	testwait.For(t, limit, "the first direct message delivered", func() bool {
		ref++
		if err := sa.Send(&probe.Message{Ref: ref, To: b, Body: direct}); err != nil {
			t.Fatalf("send direct: %v", err)
		}
		return waitUntil(500*time.Millisecond, func() bool { _, ok := sb.rec.got(string(direct)); return ok })
	})
	testwait.For(t, limit, "the direct message acknowledged", func() bool { return sa.rec.acked(ref) })
	d, _ := sb.rec.got(string(direct))
	if d.group || d.from == "" {
		t.Errorf("direct delivery %+v: want group false and its sender named", d)
	}
	const gref = 1 << 20
	if err := sa.Send(&probe.Message{Ref: gref, Group: g, Body: group}); err != nil {
		t.Fatalf("send to group: %v", err)
	}
	testwait.For(t, limit, "the group message acknowledged", func() bool { return sa.rec.acked(gref) })
	testwait.For(t, limit, "the group message delivered", func() bool { _, ok := sb.rec.got(string(group)); return ok })
	if d, _ := sb.rec.got(string(group)); !d.group {
		t.Errorf("group delivery %+v: want group true", d)
	}
	if ra, rb := sa.rec.rejected(), sb.rec.rejected(); len(ra)+len(rb) != 0 {
		t.Errorf("rejects %v %v, want none", ra, rb)
	}

	for _, sv := range []*served{sa, sb} {
		if err := sv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if r := probe.ReasonOf(sv.ended(t, limit, "after Close")); r != metrics.ReasonShutdown {
			t.Errorf("Serve after Close ended with reason %q, want %q", r, metrics.ReasonShutdown)
		}
		if err := sv.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
	}
	closeIdle(drv)
	testwait.For(t, limit, "the sessions' connections closed", func() bool { return prox().Open() == 0 })
}

// waitUntil polls cond for up to d.
func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func deadPeer(t *testing.T, s Server) {
	via, prox := viaProxy(t)
	drv, in := s.driver(t, Faults{}, via)
	pre := prefix("d")
	a := pre + "-u0"
	ctx, cancel := context.WithTimeout(context.Background(), s.scaled(30*time.Second))
	defer cancel()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{a}}); err != nil {
		t.Fatal(err)
	}
	sv := serve(t, ctx, drv, a)
	// The population pings every heartbeat; so does this test.
	hb := in.Target.Heartbeat
	stop := make(chan struct{})
	var pinger sync.WaitGroup
	pinger.Go(func() {
		tick := time.NewTicker(hb)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = sv.Ping()
			}
		}
	})
	defer func() { close(stop); pinger.Wait() }()
	prox().Freeze()
	began := time.Now()
	silence := s.Silence
	if silence == 0 {
		silence = 2*hb + 5*time.Second
	}
	limit := s.scaled(2*silence + 5*time.Second)
	err := sv.ended(t, limit, "a silent peer")
	t.Logf("silent peer noticed after %v (the adapter allows %v): %v", time.Since(began).Round(time.Millisecond), silence, err)
	if r := probe.ReasonOf(err); r == metrics.ReasonShutdown {
		t.Errorf("a silent peer ended the session with reason %q, as if closed cleanly", r)
	}
	closeIdle(drv)
	testwait.For(t, limit, "the dead session's connection closed", func() bool { return prox().Open() == 0 })
}

// closeIdle closes the idle connections of a driver that keeps them past
// its sessions (probe.IdleCloser), as closing its target does.
func closeIdle(drv probe.Driver) {
	if ic, ok := drv.(probe.IdleCloser); ok {
		ic.CloseIdleConnections()
	}
}

func kick(t *testing.T, s Server) {
	drv, in := s.driver(t, Faults{}, nil)
	if in.Kick == nil {
		t.Skip("the server cannot end a session on demand")
	}
	pre := prefix("k")
	a := pre + "-u0"
	ctx, cancel := context.WithTimeout(context.Background(), s.scaled(30*time.Second))
	defer cancel()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{a}}); err != nil {
		t.Fatal(err)
	}
	sv := serve(t, ctx, drv, a)
	in.Kick(a)
	err := sv.ended(t, s.scaled(10*time.Second), "kicked")
	if r := probe.ReasonOf(err); r != in.KickReason {
		t.Errorf("kicked session ended with %v (reason %q), want reason %q", err, r, in.KickReason)
	}
}

func secret(t *testing.T, s Server) {
	drv, in := s.driver(t, Faults{}, nil)
	pre := prefix("x")
	a := pre + "-u0"
	ctx, cancel := context.WithTimeout(context.Background(), s.scaled(30*time.Second))
	defer cancel()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{a}}); err != nil {
		t.Fatal(err)
	}
	wrong := in.Target
	wrong.Secret = append([]byte("not-"), in.Target.Secret...)
	bad, err := s.Adapter.New(wrong)
	if err != nil {
		t.Fatalf("New with another secret: %v", err)
	}
	// The daemon provisions before it logs in, after a secret rotation
	// too: either may be the one refused.
	err = bad.Provision(ctx, probe.Plan{Users: []string{a}})
	if err == nil {
		var sess probe.Session
		if sess, err = bad.Connect(ctx, a, probe.Device{}); err == nil {
			_ = sess.Close()
			t.Fatal("a login signed with another secret succeeded")
		}
	}
	if r := probe.FailureReason(err); r != metrics.ConnectUnauthorized {
		t.Errorf("a login signed with another secret failed as %q (%v), want %q", r, err, metrics.ConnectUnauthorized)
	}
}

// run is a population monitoring one server.
type run struct {
	pop  *engine.Population
	set  *metrics.Set
	kill *probetest.Killer
	in   Instance
}

const (
	runUsers     = 6
	runGroupSize = 3
	runRate      = 5
	runLostAfter = 10 * time.Second
)

func start(t *testing.T, s Server, f Faults, catchUp bool) *run {
	t.Helper()
	drv, in := s.driver(t, f, nil)
	return startOn(t, s, drv, in, popOpts{users: runUsers, groupSize: runGroupSize, rate: cmp.Or(s.Rate, runRate), catchUp: catchUp})
}

// popOpts is what a subtest sets of its population.
type popOpts struct {
	users, groupSize int
	rate             float64
	catchUp          bool
	messageSize      int
	slow             engine.SlowReaders
}

// startOn runs a population of o on drv, a driver for in, until the test
// ends, and returns once it is online.
func startOn(t *testing.T, s Server, drv probe.Driver, in Instance, o popOpts) *run {
	t.Helper()
	r := &run{in: in, set: metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)}
	r.kill = &probetest.Killer{Driver: drv, Abort: func(s probe.Session) {
		if a, ok := s.(probe.Aborter); ok {
			a.Abort()
			return
		}
		_ = s.Close()
	}}
	var err error
	r.pop, err = engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver: r.kill, Run: "conformance", Heartbeat: in.Target.Heartbeat,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, CatchUp: o.catchUp,
			Reactor: s.Reactor,
		},
		Set: r.set, Prefix: prefix("r"), Users: o.users, GroupSize: o.groupSize, MessageSize: o.messageSize,
		Rate: o.rate, Ramp: time.Second, Deadline: s.scaled(2 * time.Second), LostAfter: s.scaled(runLostAfter),
		SlowReaders: o.slow, Logger: dbgLog(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.pop.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	probetest.WaitReady(t, r.pop, o.users, s.scaled(10*time.Second), s.scaled(60*time.Second))
	return r
}

// soak sends until n deliveries are owed, or for limit, and settles.
func (r *run) soak(t *testing.T, s Server, n float64, limit time.Duration) probetest.Totals {
	return probetest.SoakUntil(t, r.pop, r.set, n, s.scaled(limit), s.scaled(runLostAfter), metrics.Normal)
}

// kind returns the normal cohort's totals of one kind.
func (r *run) kind(k metrics.Kind) probetest.Totals {
	c := r.set.Kind[k].Cohort[metrics.Normal]
	return probetest.Totals{
		Sent: metrics.Value(r.set.Kind[k].Sent), Expected: metrics.Value(c.Expected),
		Delivered: metrics.Value(c.Delivered), Recovered: metrics.Value(c.Recovered), Lost: metrics.Value(c.Lost),
		Late: metrics.Value(c.Late), Dup: metrics.Value(c.Duplicate), Reordered: metrics.Value(c.Reordered),
	}
}

// nonzero returns the counters of cs that have counted something, by
// their label.
func nonzero(cs map[string]prometheus.Counter) map[string]float64 {
	out := map[string]float64{}
	for reason, c := range cs {
		if v := metrics.Value(c); v > 0 {
			out[reason] = v
		}
	}
	return out
}

func population(t *testing.T, s Server) {
	r := start(t, s, Faults{}, s.CatchUp)
	if s.Reactor {
		if w, g := r.pop.Watched(), r.pop.Served(); w != runUsers || g != 0 {
			t.Errorf("%d sessions watched by the reactor and %d read by a goroutine each, want all %d watched", w, g, runUsers)
		}
	}
	c := r.soak(t, s, 150, 30*time.Second)
	t.Logf("%v; send errors %v", c, nonzero(r.set.SendErrors))
	for _, k := range []metrics.Kind{metrics.Direct, metrics.Group} {
		kc := r.kind(k)
		if kc.Expected < 20 {
			t.Errorf("%s: expected %v deliveries, want at least 20", metrics.Kinds[k], kc.Expected)
		}
		if kc.Delivered != kc.Expected || kc.Recovered+kc.Lost+kc.Dup+kc.Reordered+kc.Late != 0 {
			t.Errorf("%s: %v: want every expected delivery delivered once, in order, on time", metrics.Kinds[k], kc)
		}
	}
	if e := nonzero(r.set.SendErrors); len(e) != 0 {
		t.Errorf("send errors %v, want none", e)
	}
}

// watched checks, with the reactor, that no session of r is read by a
// goroutine of its own.
func watched(t *testing.T, s Server, r *run, when string) {
	t.Helper()
	if g := r.pop.Served(); s.Reactor && g != 0 {
		t.Errorf("%s: %d sessions read by a goroutine each and %d watched, want all watched", when, g, r.pop.Watched())
	}
}

// slowReader: a fifth of the users stop reading for longer than the
// server's slow-consumer policy allows. The server does what it does to
// them (a close, or dropping what they cannot take), and the adapter must
// say which; the others must not pay for it: nothing of theirs lost or
// counted twice.
func slowReader(t *testing.T, s Server) {
	in := s.SlowStart(t, func(a string) string { return a })
	if in.Target.Heartbeat == 0 {
		in.Target.Heartbeat = 500 * time.Millisecond
	}
	drv, err := s.Adapter.New(in.Target)
	if err != nil {
		t.Fatalf("%s: New: %v", s.Adapter.Config.Name, err)
	}
	size := cmp.Or(s.SlowMessageSize, 4<<10)
	pause := cmp.Or(s.SlowPause, 6*time.Second)
	r := startOn(t, s, drv, in, popOpts{users: 10, groupSize: 5, rate: cmp.Or(s.SlowRate, 20), catchUp: s.CatchUp, messageSize: size,
		slow: engine.SlowReaders{Fraction: 0.2, Pause: pause}})
	watched(t, s, r, "at the start")
	began := time.Now()
	if s.SlowReason != "" {
		testwait.For(t, s.scaled(pause+10*time.Second), "a slow reader disconnected as "+s.SlowReason, func() bool {
			return metrics.Value(r.set.Disconnects[s.SlowReason]) >= 1
		})
		t.Logf("first slow reader disconnected as %s after %v", s.SlowReason, time.Since(began).Round(time.Millisecond))
	} else {
		time.Sleep(pause)
	}
	// Traffic goes on a while: a message the server dropped at the end
	// of the pause shows as a gap only once a later one arrives. Only the
	// population's own sweeper runs meanwhile, as in production.
	time.Sleep(2 * time.Second)
	normal := probetest.Settle(t, r.pop, r.set, s.scaled(runLostAfter), metrics.Normal)
	if s.SlowReason == "" {
		// What the server dropped is lost once lost_after has passed
		// since a later message revealed it.
		testwait.For(t, s.scaled(2*runLostAfter), "the slow readers' loss counted", func() bool {
			return probetest.Cohort(r.set, metrics.SlowReader).Lost > 0
		})
	}
	// The slow readers' own counts are not settled: a reader that stops
	// again in every session leaves its last messages in flight (a gap
	// at a stream's tail shows only once something later arrives).
	slow := probetest.Cohort(r.set, metrics.SlowReader)
	watched(t, s, r, "at the end")
	t.Logf("normal %v; slow readers %v; disconnects %v", normal, slow, nonzero(r.set.Disconnects))
	if normal.Expected == 0 || normal.Lost+normal.Dup != 0 {
		t.Errorf("normal users %v: a slow reader must cost the others nothing", normal)
	}
	if slow.Expected == 0 {
		t.Errorf("slow readers %v: nothing owed to them, want their deliveries counted in their own cohort", slow)
	}
}

func catchUp(t *testing.T, s Server) {
	r := start(t, s, Faults{}, true)
	// Let traffic flow, then take user 0 away for a while: messages
	// sent to it meanwhile wait on the server, which pushes them at its
	// next login (an offline queue) or has them fetched (history).
	testwait.For(t, s.scaled(20*time.Second), "traffic", func() bool { return probetest.Cohort(r.set, metrics.Normal).Expected >= 30 })
	user := r.pop.Plan().Users[0]
	if n := r.kill.Kill(user, 2*time.Second); n == 0 {
		t.Fatalf("%s had no session to drop", user)
	}
	c := r.soak(t, s, probetest.Cohort(r.set, metrics.Normal).Expected+150, 30*time.Second)
	t.Logf("user away 2 s: %v", c)
	if c.Lost+c.Dup != 0 || !c.Accounted() {
		t.Errorf("%v: want nothing lost or duplicated, every expected delivery accounted for", c)
	}
}

func faults(t *testing.T, s Server) {
	f := Faults{Duplicate: 0.05}
	if s.CatchUp {
		f.DropPush = 0.05
	}
	r := start(t, s, f, s.CatchUp)
	c := r.soak(t, s, 400, 40*time.Second)
	var dups, drops uint64
	if r.in.Injected != nil {
		dups, drops = r.in.Injected()
	}
	t.Logf("faults %+v: %v; server duplicated %d, dropped %d pushes", f, c, dups, drops)
	if c.Dup == 0 {
		t.Errorf("%v: no duplicate counted of %.0f%% duplicated pushes", c, 100*f.Duplicate)
	}
	if s.CatchUp && (c.Recovered == 0 || c.Lost != 0) {
		t.Errorf("%v: with catch-up, dropped pushes must be recovered, none lost", c)
	}
	if r.in.Injected == nil {
		return
	}
	// The ledger may see a few fewer than the server made: a push made
	// after the settle's last sweep is not counted, and a duplicate of a
	// push a gap fill recovered first is a late push, not a duplicate.
	near := func(got float64, want uint64) bool {
		return math.Abs(got-float64(want)) <= 0.1*float64(want)+3
	}
	if !near(c.Dup, dups) {
		t.Errorf("%v: %v duplicates counted, the server duplicated %d", c, c.Dup, dups)
	}
	if s.CatchUp && !near(c.Recovered, drops) {
		t.Errorf("%v: %v recovered, the server dropped %d pushes", c, c.Recovered, drops)
	}
}

// HostPort returns the host:port of a URL, for a Start that passes it
// through via; Rehost puts it back.
func HostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// Rehost returns raw with its host:port replaced by hostport.
func Rehost(t *testing.T, raw, hostport string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

// Via returns raw with its host:port passed through via.
func Via(t *testing.T, raw string, via func(string) string) string {
	t.Helper()
	return Rehost(t, raw, via(HostPort(t, raw)))
}

// LoginAgain logs user in once more as dev through a driver of its own,
// and keeps the session until the test ends: the kick of a server whose
// policy ends a user's (or a device's) older session at a new login.
func LoginAgain(t *testing.T, a probe.Adapter, tg probe.Target, user string, dev probe.Device) {
	t.Helper()
	drv, err := a.New(tg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := drv.Provision(ctx, probe.Plan{Users: []string{user}}); err != nil {
		t.Fatalf("provision %s for the login that kicks: %v", user, err)
	}
	s, err := drv.Connect(ctx, user, dev)
	if err != nil {
		t.Fatalf("the second login that kicks %s: %v", user, err)
	}
	t.Cleanup(func() { _ = s.Close() })
}

// dbgLog is the logger of the suite's populations and drivers: none,
// unless IMCANARYTEST_DEBUG_LOG is set, when it writes every debug line
// to stderr (which messages a run lost, and what the adapter did about
// them), for a failure that comes once in many runs.
func dbgLog() *slog.Logger {
	if os.Getenv("IMCANARYTEST_DEBUG_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
