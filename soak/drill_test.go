package soak

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// drillProfile is testProfile with a fifth of the users reading slowly:
// 50 ms after every delivery, so 20 deliveries a second against the 50 or
// so each receives. They read steadily rather than pause: a paused reader
// reads its close frame only once it reads again, so whether it sees the
// 4008 at all would hang on how long the target keeps a kicked connection
// open for it (with a one-second wait, a 5 s pause ended in reason error,
// no close code).
func drillProfile() config.Profile {
	p := testProfile()
	p.Duration = 4 * time.Second
	p.SlowReaders = config.SlowReaders{Fraction: 0.2, ReadDelay: 50 * time.Millisecond}
	// Loose latency limits: the test is about who is disconnected and
	// who loses messages, and the latency of 8 KiB messages on a busy
	// machine under -race is the prober's, not the target's.
	p.Deadline, p.LostAfter = 2*time.Second, 4*time.Second
	p.Thresholds.P99Ack, p.Thresholds.P99Delivery = 2*time.Second, 2*time.Second
	return p
}

// Drill sizes, measured on loopback under -race on two busy cores. A slow
// reader falls behind by about 30 messages of 8 KiB a second; the target's
// 48-message send queue overflows once about 180 KB of socket buffers
// (the target's send buffer capped at 16 KiB, the reader's receive buffer
// as Linux starts it) are full as well, and the reader reads the close
// frame behind them: about 2.2 s after its login, then under a second in
// the sessions after, whose offline backlog refills the buffers at once.
// Normal users keep loopback's megabytes of buffers, and the long queue
// lets the target's writers fall a second behind on a loaded machine
// before a normal user is kicked too (with 8 messages, one was).
const (
	drillSendQueue   = 48
	drillMessageSize = 8 << 10
	drillSndbuf      = 16 << 10
)

// splitDriver connects the slow readers through one driver and everyone
// else through another: here, two listeners of one target, the slow
// readers' with small socket buffers.
type splitDriver struct {
	normal, slow probe.Driver
	isSlow       map[string]bool
}

func (d splitDriver) Provision(ctx context.Context, plan probe.Plan) error {
	// Both drivers learn the groups, which each re-creates at a login.
	if err := d.normal.Provision(ctx, plan); err != nil {
		return err
	}
	return d.slow.Provision(ctx, plan)
}

func (d splitDriver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	if d.isSlow[user] {
		return d.slow.Connect(ctx, user, dev)
	}
	return d.normal.Connect(ctx, user, dev)
}

// slowUsers returns the names of the users a runner with the test prefix
// makes slow readers in profile p, from a population laid out the same
// way, so that the test does not repeat the layout's arithmetic.
func slowUsers(t *testing.T, p config.Profile) map[string]bool {
	t.Helper()
	set := metrics.New(prometheus.NewRegistry()).For("layout", metrics.SourceSoak)
	pop, err := engine.NewPopulation(engine.Options{
		Connection: engine.Connection{
			Driver:     splitDriver{},
			Heartbeat:  time.Second,
			BackoffMin: time.Millisecond,
			BackoffMax: time.Millisecond,
		},
		Set:         set,
		Prefix:      "s-" + p.Name,
		Users:       p.Users,
		GroupSize:   p.GroupSize,
		Deadline:    p.Deadline,
		LostAfter:   p.LostAfter,
		SlowReaders: engine.SlowReaders{Fraction: p.SlowReaders.Fraction},
	})
	if err != nil {
		t.Fatal(err)
	}
	slow := map[string]bool{}
	for i, name := range pop.Plan().Users {
		if pop.Slow(i) {
			slow[name] = true
		}
	}
	return slow
}

// TestSoakSlowReaderDrill runs a drill against the reference server, which
// closes a session whose send queue overflows with 4008: the slow readers
// must be reported disconnected as slow consumers, apart from the normal
// users, who lose nothing and pass.
func TestSoakSlowReaderDrill(t *testing.T) {
	p := drillProfile()
	srv := newTarget(t, refserver.Options{SendQueue: drillSendQueue})
	slow := slowUsers(t, p)
	drv := splitDriver{
		normal: newTestDriver(t, serveTarget(t, srv, 0)),
		slow:   newTestDriver(t, serveTarget(t, srv, drillSndbuf)),
		isSlow: slow,
	}
	r, m := newTestRunnerWith(t, drv)
	r.o.MessageSize = drillMessageSize
	start := time.Now()
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	dr := rep.Drill
	if dr == nil {
		t.Fatalf("Drill = nil, want the drill's section; report %+v", rep)
	}
	all := rep.Deliveries["all"]
	t.Logf("drill in %v: %s; %d slow readers, kicks %d, deliveries %+v, latency %+v, normal p99 %v, disconnects %v, codes %v, time to disconnect %+v, max lag %d",
		took.Round(time.Millisecond), dr.Reaction, dr.SlowReaders, srv.Stats().SlowConsumerKicks, dr.Deliveries,
		dr.Latency, dr.NormalP99, dr.Disconnects, dr.CloseCodes, dr.TimeToDisconnect, dr.MaxLagMessages)
	t.Logf("normal users: %s, %+v, disconnects %v, min online %v", rep.Result, all, rep.Disconnects, rep.Users.MinOnlineRatio)

	if dr.SlowReaders != len(slow) || dr.SlowReaders != 4 {
		t.Errorf("Drill.SlowReaders = %d, want 4 (%d slow users in the layout)", dr.SlowReaders, len(slow))
	}
	if dr.Fraction != 0.2 || dr.ReadDelay != p.SlowReaders.ReadDelay || dr.Pause != 0 || dr.PauseEvery != 0 {
		t.Errorf("Drill config = %v %v %v %v, want the profile's", dr.Fraction, dr.ReadDelay, dr.Pause, dr.PauseEvery)
	}
	if dr.Disconnects[metrics.ReasonSlowConsumer] == 0 || dr.CloseCodes["4008"] == 0 {
		t.Errorf("Drill disconnects = %v, close codes %v; want slow_consumer and 4008", dr.Disconnects, dr.CloseCodes)
	}
	if !strings.HasPrefix(dr.Reaction, "disconnected as slow consumers (close 4008) after ") {
		t.Errorf("Drill.Reaction = %q, want disconnected as slow consumers (close 4008) after …", dr.Reaction)
	}
	if dr.TimeToDisconnect.Count == 0 || dr.TimeToDisconnect.P50 <= 0 || dr.TimeToDisconnect.Max > 5*time.Second {
		t.Errorf("Drill.TimeToDisconnect = %+v, want counted, within seconds", dr.TimeToDisconnect)
	}
	if dr.MaxLagMessages == 0 {
		t.Error("Drill.MaxLagMessages = 0: the slow readers never fell behind")
	}
	if d := dr.Deliveries; d.Expected == 0 || d.Delivered == 0 || d.Expected == all.Expected {
		t.Errorf("Drill.Deliveries = %+v, want the slow readers' own counts", d)
	}
	maxNormal := max(rep.Latency["delivery_direct"].Max, rep.Latency["delivery_group"].Max)
	if dr.Latency.Count == 0 || dr.NormalP99 <= 0 || dr.NormalP99 > maxNormal {
		t.Errorf("Drill latency %+v, normal p99 %v; want both measured", dr.Latency, dr.NormalP99)
	}

	// The normal users are judged alone, and pass.
	if all.Lost != 0 || all.LossRatio != 0 || all.Expected == 0 || all.Delivered != all.Expected {
		t.Errorf("normal deliveries = %+v, want every one delivered", all)
	}
	var normalDisc int64
	for _, n := range rep.Disconnects {
		normalDisc += n
	}
	if normalDisc != 0 {
		t.Errorf("normal users' disconnects = %v, want none", rep.Disconnects)
	}
	if rep.Result != metrics.ResultPass {
		t.Errorf("Result = %s, want pass (the normal users were fine); thresholds %+v", rep.Result, rep.Thresholds)
	}
	if rep.Users.MinOnlineRatio != 1 {
		t.Errorf("min online ratio = %v, want 1: slow readers' disconnects must not count", rep.Users.MinOnlineRatio)
	}
	var slowDisc int64
	for _, s := range rep.Samples {
		slowDisc = max(slowDisc, s.SlowReaderDisconnects)
		if s.Disconnects != 0 {
			t.Errorf("sample at %v counts %d disconnects, want the normal users' 0", s.T, s.Disconnects)
		}
	}
	if slowDisc == 0 {
		t.Error("no sample counts a slow reader's disconnect")
	}
	for _, e := range rep.Errors {
		if strings.Contains(e.Error, "slow_consumer") {
			t.Errorf("top errors list the drill's disconnects: %q", e.Error)
		}
	}
	if !hasNote(rep, "Slow-reader drill: 4 of 20 users") {
		t.Errorf("notes = %q, want one on the drill", rep.Notes)
	}
	// The metrics count the slow readers in their own cohort.
	if v := metrics.Value(m.Deliveries.WithLabelValues("t", metrics.SourceSoak, metrics.KindGroup, metrics.CohortSlowReader)); v == 0 {
		t.Error("imcanary_deliveries_total{cohort=slow_reader} = 0")
	}
	if took > 15*time.Second {
		t.Errorf("the drill took %v, want under 15 s", took)
	}
}

// TestSoakNoDrill: the same profile without slow readers has no drill
// section, and nothing of one in its samples or notes.
func TestSoakNoDrill(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	p := drillProfile()
	p.Duration = time.Second
	p.SlowReaders = config.SlowReaders{}
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Drill != nil {
		t.Errorf("Drill = %+v, want nil without slow readers", rep.Drill)
	}
	if rep.Result != metrics.ResultPass {
		t.Errorf("Result = %s, want pass; thresholds %+v", rep.Result, rep.Thresholds)
	}
	for _, s := range rep.Samples {
		if s.SlowReaderDisconnects != 0 || s.SlowReaderLag != 0 {
			t.Errorf("sample %+v has slow-reader numbers", s)
		}
	}
	if hasNote(rep, "Slow-reader drill") {
		t.Errorf("notes = %q, want none on a drill", rep.Notes)
	}
}

func hasNote(r *report.Soak, prefix string) bool {
	for _, n := range r.Notes {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

func TestDrillReaction(t *testing.T) {
	end := func(reason string, code int, n int64) drillEnd {
		return drillEnd{slowEnd: slowEnd{reason: reason, code: code}, n: n}
	}
	for _, tc := range []struct {
		name string
		dr   report.Drill
		ends []drillEnd
		hit  int
		want string
	}{
		{
			name: "slow consumer",
			dr: report.Drill{SlowReaders: 4, Disconnects: map[string]int64{"slow_consumer": 7},
				TimeToDisconnect: report.Percentiles{Count: 7, P50: 2140 * time.Millisecond}},
			ends: []drillEnd{end("slow_consumer", 4008, 7)}, hit: 4,
			want: "disconnected as slow consumers (close 4008) after 2.1s median: 4 of 4 slow readers, 7 disconnects",
		},
		{
			name: "policy close, some cut",
			dr: report.Drill{SlowReaders: 3, Disconnects: map[string]int64{"server_close": 2, "error": 1},
				TimeToDisconnect: report.Percentiles{Count: 3, P50: 30 * time.Second}},
			ends: []drillEnd{end("error", 0, 1), end("server_close", 1008, 2)}, hit: 2,
			want: "disconnected (server_close 1008) after 30s median: 2 of 3 slow readers, 3 disconnects (error 1, server_close 2)",
		},
		{
			name: "no close frame",
			dr:   report.Drill{SlowReaders: 1, Disconnects: map[string]int64{"error": 1}},
			ends: []drillEnd{end("error", 0, 1)}, hit: 1,
			want: "disconnected without a close frame (error): 1 of 1 slow readers, 1 disconnect",
		},
		{
			name: "buffered",
			dr:   report.Drill{SlowReaders: 2, MaxLagMessages: 1234, Deliveries: report.Deliveries{Expected: 5000, Delivered: 3766}},
			want: "kept connected: slow readers fell up to 1,234 messages behind (the server buffered or throttled; imcanary cannot tell which from outside)",
		},
		{
			name: "dropped",
			dr:   report.Drill{SlowReaders: 2, MaxLagMessages: 128, Deliveries: report.Deliveries{Expected: 5000, Delivered: 4000, Lost: 1000}},
			want: "kept connected, but 1,000 of 5,000 deliveries to slow readers were lost (the server dropped messages rather than disconnect); they fell up to 128 messages behind",
		},
		{
			name: "never behind",
			dr:   report.Drill{SlowReaders: 2, Deliveries: report.Deliveries{Expected: 10, Delivered: 10}},
			want: "kept connected and never seen behind: the drill may be too gentle to fill the buffers between the server and a slow reader (try a longer pause or larger messages)",
		},
		{
			name: "nothing owed",
			dr:   report.Drill{SlowReaders: 2},
			want: "not tested: no deliveries were owed to the slow readers",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := drillReaction(&tc.dr, tc.ends, tc.hit); got != tc.want {
				t.Errorf("drillReaction() = %q, want %q", got, tc.want)
			}
		})
	}
}
