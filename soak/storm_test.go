package soak

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// stormProfile drops half of 200 users a second into sending. Its
// recovery thresholds are far beyond anything a loopback server takes:
// TestStormRows judges the rows themselves.
func stormProfile(users int, fraction float64) config.Profile {
	p := testProfile()
	p.Name, p.Users, p.Rate = "storm", users, 1
	p.Duration, p.Drain = 4*time.Second, 2*time.Second
	p.Storm = config.Storm{Fraction: fraction, After: time.Second}
	p.Thresholds.Recovery99, p.Thresholds.Recovery100 = time.Hour, time.Hour
	// What the storm costs the deliveries is reported, not judged here:
	// a loaded machine makes its catch-up late.
	p.Thresholds.MaxLate, p.Thresholds.P99Ack, p.Thresholds.P99Delivery = 1, time.Minute, time.Minute
	return p
}

// refusing refuses every connect of user once on is set: a session the
// server will not take back.
type refusing struct {
	probe.Driver
	user string
	on   atomic.Bool
}

func (d *refusing) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	if d.on.Load() && user == d.user {
		return nil, errors.New("refused by the test")
	}
	return d.Driver.Connect(ctx, user, dev)
}

// TestStormDrillOwnCohort drops half of a run's own sessions without a
// close: every one comes back, each is counted as a drop of the drill and
// not a disconnect of the server, and the process's connect attempts stay
// within max_connect_rate over the time they took.
func TestStormDrillOwnCohort(t *testing.T) {
	// 100 dropped at 50/s: the limiter holds them back for 2 s.
	const users, limit = 200, 50.0
	url, srv := startTarget(t, refserver.Faults{})
	r, m := newTestRunner(t, url)
	r.o.MaxConnectRate = limit
	r.o.Limiter = engine.NewConnectLimiter(limit)
	// The messages in flight to a dropped session are lost with its
	// socket; catch-up fetches them from the server's history.
	r.o.CatchUp = true
	p := stormProfile(users, 0.5)
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Storm
	if s == nil {
		t.Fatalf("Storm = nil, want the drill's section; notes %q", rep.Notes)
	}
	t.Logf("storm: %+v; run: %+v", *s, rep.Deliveries["all"])
	if s.Population != metrics.SourceSoak || s.Online != users || s.Dropped != users/2 {
		t.Errorf("dropped %d of %d %s sessions, want %d of %d soak", s.Dropped, s.Online, s.Population, users/2, users)
	}
	if s.Back != s.Dropped || !s.Reached99 || !s.Reached100 || s.Recovery99 <= 0 || s.Recovery99 > s.Recovery100 {
		t.Errorf("back %d, 99%% %v (%v), 100%% %v (%v): want all %d back, 0 < 99%% ≤ 100%%",
			s.Back, s.Recovery99, s.Reached99, s.Recovery100, s.Reached100, s.Dropped)
	}
	// Every dropped session logged in again, once, on the server (and
	// the reference driver's provisioner once, to make the groups).
	if got := srv.Stats().Logins; got != uint64(1+users+s.Dropped) {
		t.Errorf("server logins = %d, want %d (the provisioner, every user, then every dropped one again)", got, 1+users+s.Dropped)
	}
	if s.Login.Count != int64(s.Dropped) || s.Login.P50 <= 0 || s.Login.P99 > s.Recovery100 {
		t.Errorf("login latency %+v, want %d logins, none longer than the recovery %v", s.Login, s.Dropped, s.Recovery100)
	}
	// Without a close: the population saw each session fail (error),
	// not end cleanly (shutdown); the run's counts leave the drill's
	// drops out.
	set := m.For("t", metrics.SourceSoak)
	if n := metrics.Value(set.Disconnects[metrics.ReasonError]); n != float64(s.Dropped) {
		t.Errorf("disconnects{reason=error} = %v, want %d (each drop ends with no close frame)", n, s.Dropped)
	}
	if th := row(rep, "max_disconnects"); !th.Pass {
		t.Errorf("max_disconnects = %+v, want the drill's drops left out", th)
	}
	if th := row(rep, "min_online_ratio"); !th.Pass {
		t.Errorf("min_online_ratio = %+v, want the drill's drops left out", th)
	}
	// The limiter's own bound over the span measured: a burst, then the
	// rate.
	if bound := float64(s.Burst) + limit*s.AttemptsSpan.Seconds(); s.Attempts < int64(s.Dropped) || float64(s.Attempts) > bound {
		t.Errorf("%d attempts in %v, want %d to %.0f (burst %d + %v/s)", s.Attempts, s.AttemptsSpan, s.Dropped, bound, s.Burst, limit)
	}
	if s.AttemptsOf != "process" || s.MaxConnectRate != limit || s.PeakPerSec <= 0 {
		t.Errorf("attempts of %q, limit %v, peak %v/s: want the process's against %v, a peak measured", s.AttemptsOf, s.MaxConnectRate, s.PeakPerSec, limit)
	}
	// Any second of the storm holds at most a burst and a second's
	// worth: the peak counts attempts when they go, not when they ask.
	if s.PeakPerSec > limit+float64(s.Burst) {
		t.Errorf("peak %v attempts/s, want at most %v (limit %v + burst %d)", s.PeakPerSec, limit+float64(s.Burst), limit, s.Burst)
	}
	// The storm window's phases are exactly the storm's reconnects:
	// each dropped session's successful attempt, and the phases of its
	// failed ones, none of the ramp's logins.
	c := s.ConnectPath
	if c == nil || s.ConnectUntilEnd {
		t.Fatalf("storm connect path %+v, until the end %v: want one over the storm, which ended", c, s.ConnectUntilEnd)
	}
	t.Logf("storm connect path: %+v", c.Phases)
	for _, ph := range []metrics.Phase{metrics.TCP, metrics.Upgrade, metrics.Login} {
		n := c.Phases[ph].Count
		if n < int64(s.Back) || n > int64(s.Back)+s.FailedAttempts || (ph == metrics.Login && n != int64(s.Back)) {
			t.Errorf("storm %s phase counted %d, want the %d dropped sessions' successful attempts (%d failed)", metrics.ConnectPhases[ph], n, s.Back, s.FailedAttempts)
		}
	}
	if n := c.Phases[metrics.TLS].Count + c.Phases[metrics.DNS].Count; n != 0 {
		t.Errorf("storm dns and tls phases counted %d over ws:// to an address, want none", n)
	}
	// The run's own path holds the ramp's logins and the storm's.
	if got, want := rep.ConnectPath.Phases[metrics.Login].Count, int64(users+s.Back); got != want {
		t.Errorf("run's login phase counted %d, want %d (every user, then every dropped one again)", got, want)
	}
	if d := s.Deliveries; d.Expected == 0 || d.Lost+d.Undelivered != 0 || d.Delivered+d.Recovered != d.Expected {
		t.Errorf("storm deliveries %+v (%d in flight at the drop), want some owed, each delivered or recovered exactly once, none lost on a clean server", d, s.InFlightAtDrop)
	}
	for _, name := range []string{"recovery_99", "recovery_100"} {
		if th := row(rep, name); !th.Pass {
			t.Errorf("%s = %+v, want a pass", name, th)
		}
	}
	if rep.Result != metrics.ResultPass {
		t.Errorf("Result = %s, want pass; thresholds %+v", rep.Result, rep.Thresholds)
	}
}

// TestStormDrillNotBack: a dropped session the server never takes back
// fails recovery_100, naming how many came back, while 99% came back.
func TestStormDrillNotBack(t *testing.T) {
	const users = 100
	url, _ := startTarget(t, refserver.Faults{})
	drv := &refusing{Driver: newTestDriver(t, url), user: "s-storm-u7"}
	r, _ := newTestRunnerWith(t, drv)
	p := stormProfile(users, 1)
	p.Thresholds.MinOnlineRatio = 0
	var st atomic.Pointer[string]
	// Refuse from the drop on: the first progress report of the send
	// phase comes before it (the drop is a second in).
	rep, err := r.Run(context.Background(), p, func(pr Progress) {
		if pr.Phase == report.PhaseSend && st.Load() == nil {
			s := "on"
			st.Store(&s)
			drv.on.Store(true)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Storm
	if s == nil {
		t.Fatal("Storm = nil, want the drill's section")
	}
	if s.Dropped != users || s.Back != users-1 || !s.Reached99 || s.Reached100 || s.FailedAttempts == 0 {
		t.Errorf("dropped %d, back %d, 99%% %v, 100%% %v, failed attempts %d: want %d dropped, one refused",
			s.Dropped, s.Back, s.Reached99, s.Reached100, s.FailedAttempts, users)
	}
	th := row(rep, "recovery_100")
	if th.Pass || th.Actual != "not reached: 99 of 100 back" {
		t.Errorf("recovery_100 = %+v, want a failure naming 99 of 100 back", th)
	}
	if !row(rep, "recovery_99").Pass || rep.Result != metrics.ResultFail {
		t.Errorf("recovery_99 %+v, result %s: want 99%% passing and the run failed", row(rep, "recovery_99"), rep.Result)
	}
}

func TestStormRows(t *testing.T) {
	lim := config.Thresholds{Recovery99: 2 * time.Second, Recovery100: 5 * time.Second}
	tests := []struct {
		name   string
		s      *report.Storm
		err    error
		actual [2]string
		pass   [2]bool
	}{
		{"within", &report.Storm{Dropped: 10, Back: 10, Recovery99: time.Second, Reached99: true, Recovery100: 4 * time.Second, Reached100: true},
			nil, [2]string{"1s", "4s"}, [2]bool{true, true}},
		{"too slow", &report.Storm{Dropped: 10, Back: 10, Recovery99: 3 * time.Second, Reached99: true, Recovery100: 6 * time.Second, Reached100: true},
			nil, [2]string{"3s", "6s"}, [2]bool{false, false}},
		{"not all back", &report.Storm{Dropped: 200, Back: 198, Recovery99: time.Second, Reached99: true},
			nil, [2]string{"1s", "not reached: 198 of 200 back"}, [2]bool{true, false}},
		{"nothing dropped", &report.Storm{}, nil, [2]string{"nothing dropped", "nothing dropped"}, [2]bool{false, false}},
		{"drop failed", nil, errors.New("cannot abort"), [2]string{"not run: cannot abort", "not run: cannot abort"}, [2]bool{false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows := stormRows(lim, tt.s, tt.err)
			for i, name := range []string{"recovery_99", "recovery_100"} {
				if r := rows[i]; r.Name != name || r.Actual != tt.actual[i] || r.Pass != tt.pass[i] {
					t.Errorf("stormRows()[%d] = %s %q pass %v, want %s %q pass %v", i, r.Name, r.Actual, r.Pass, name, tt.actual[i], tt.pass[i])
				}
			}
		})
	}
	if !strings.HasPrefix(stormRows(lim, nil, errors.New("x"))[0].Limit, "2s") {
		t.Errorf("limit = %q, want 2s", stormRows(lim, nil, errors.New("x"))[0].Limit)
	}
}

// TestGoldenStormNote: the note the runner writes for a storm drill is what
// package report's golden storm report shows for the same drill.
func TestGoldenStormNote(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "report", "testdata", "report-storm.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if r.Storm == nil || len(r.Notes) == 0 {
		t.Fatalf("golden storm report has storm %v and %d notes, want both", r.Storm, len(r.Notes))
	}
	if got, want := stormNote(r.Storm), r.Notes[len(r.Notes)-1]; got != want {
		t.Errorf("stormNote() = %q,\nwant the golden report's %q", got, want)
	}
}
