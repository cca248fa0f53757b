package soak

import (
	"context"
	"math"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

var testSecret = []byte("soak-test")

func startTarget(t *testing.T, f refserver.Faults) (string, *refserver.Server) {
	t.Helper()
	srv := newTarget(t, refserver.Options{Faults: f})
	return serveTarget(t, srv, 0), srv
}

// newTarget returns an in-process target with o, signed with the test
// secret; serveTarget puts it on the network.
func newTarget(t *testing.T, o refserver.Options) *refserver.Server {
	t.Helper()
	o.Secret = testSecret
	srv, err := refserver.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// serveTarget serves srv on a new loopback listener until the test ends,
// and returns its URL. A server may be served on several. sndbuf, if above
// 0, caps the send buffer of every connection the listener accepts.
func serveTarget(t *testing.T, srv *refserver.Server, sndbuf int) string {
	t.Helper()
	var ln net.Listener
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if sndbuf > 0 {
		ln = sndbufListener{ln.(*net.TCPListener), sndbuf}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "ws://" + ln.Addr().String() + "/ws"
}

// sndbufListener sets the send buffer of each connection it accepts.
// Loopback's 64 KiB MSS lets Linux size a socket's buffers in megabytes
// (about 4 MB between a writer and a reader that stopped, measured), where
// a server on a real network has far less in flight: a slow-reader drill
// on plain loopback needs seconds of traffic to overflow anything.
type sndbufListener struct {
	*net.TCPListener
	size int
}

func (l sndbufListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	if err := c.SetWriteBuffer(l.size); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func newTestRunner(t *testing.T, url string) (*Runner, *metrics.Metrics) {
	t.Helper()
	return newTestRunnerWith(t, newTestDriver(t, url))
}

func newTestDriver(t *testing.T, url string) *reference.Driver {
	t.Helper()
	drv, err := reference.New(reference.Options{URL: url, Secret: testSecret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func newTestRunnerWith(t *testing.T, drv probe.Driver) (*Runner, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewPedanticRegistry())
	return NewRunner(RunnerOptions{
		Connection: engine.Connection{
			Driver:     drv,
			Run:        "r1",
			Heartbeat:  time.Second,
			BackoffMin: 20 * time.Millisecond,
			BackoffMax: 300 * time.Millisecond,
		},
		Metrics:     m,
		Target:      "t",
		Prefix:      "s",
		SampleEvery: 200 * time.Millisecond,
	}), m
}

// testProfile is small enough for a loaded 2-core machine under -race:
// 20 users at 20 msg/s for 2 s, about 800 messages and 2,000 deliveries.
func testProfile() config.Profile {
	return config.Profile{
		Name: "test", Users: 20, GroupSize: 5, Rate: 20,
		Ramp: 200 * time.Millisecond, Duration: 2 * time.Second, Drain: 3 * time.Second,
		Deadline: time.Second, LostAfter: 2 * time.Second,
		Thresholds: config.Thresholds{
			MaxLoss: 0.001, MaxLate: 0.01, P99Ack: time.Second, P99Delivery: time.Second,
			MinOnlineRatio: 1, MaxDisconnects: 0,
		},
	}
}

func row(r *report.Soak, name string) report.Threshold {
	for _, th := range r.Thresholds {
		if th.Name == name {
			return th
		}
	}
	return report.Threshold{Name: "missing " + name}
}

func TestSoakCleanPasses(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, m := newTestRunner(t, url)
	var progress int
	rep, err := r.Run(context.Background(), testProfile(), func(Progress) { progress++ })
	if err != nil {
		t.Fatal(err)
	}
	all := rep.Deliveries["all"]
	t.Logf("clean: result %s, %+v, latency %+v", rep.Result, all, rep.Latency)
	if rep.Result != metrics.ResultPass {
		t.Errorf("Result = %s, want pass; thresholds %+v", rep.Result, rep.Thresholds)
	}
	if all.Expected < 1000 || all.Delivered != all.Expected || all.Lost+all.Undelivered != 0 {
		t.Errorf("deliveries = %+v, want every one of 1000+ delivered", all)
	}
	if rep.Users.LoggedIn != 20 || rep.Users.MinOnlineRatio != 1 {
		t.Errorf("users = %+v, want 20 logged in, min online ratio 1", rep.Users)
	}
	if rep.Messages.Sent == 0 || rep.Messages.Acked != rep.Messages.Sent {
		t.Errorf("messages = %+v, want every sent message acked", rep.Messages)
	}
	if l := rep.Latency["delivery_group"]; l.Count == 0 || l.P99 <= 0 || l.P99 > l.Max || l.Mean <= 0 || l.Mean > l.Max {
		t.Errorf("group delivery latency = %+v, want counted percentiles and a mean under the max", l)
	}
	if rep.Latency["login"].Count < 20 {
		t.Errorf("login latency count = %d, want ≥ 20", rep.Latency["login"].Count)
	}
	if len(rep.Samples) < 10 || progress == 0 {
		t.Errorf("%d samples, %d progress reports; want a time series", len(rep.Samples), progress)
	}
	if len(rep.Phases) != 3 {
		t.Fatalf("phases = %+v, want ramp, send, drain", rep.Phases)
	}
	// A run that sent for its whole duration: the rate is over the send
	// phase as it ran, from its start to no later than the drain's.
	msgs, p := rep.Messages, testProfile()
	if ran := rep.Phases[2].Start.Sub(rep.Phases[1].Start).Seconds(); msgs.SendSeconds < p.Duration.Seconds() || msgs.SendSeconds > ran {
		t.Errorf("send_seconds = %v, want from the profile's %v to the %v between send and drain", msgs.SendSeconds, p.Duration.Seconds(), ran)
	}
	if want := float64(msgs.Sent) / msgs.SendSeconds; math.Abs(msgs.SentPerSec-want) > 1e-9*want {
		t.Errorf("sent_per_second = %v, want sent / send_seconds = %v", msgs.SentPerSec, want)
	}
	if v := metrics.Value(m.SoakRuns.WithLabelValues("t", "test", metrics.ResultPass)); v != 1 {
		t.Errorf("soak_runs_total{result=pass} = %v, want 1", v)
	}
	if v := metrics.Value(m.SoakLastSuccess.WithLabelValues("t", "test")); v != 1 {
		t.Errorf("soak_last_run_success = %v, want 1", v)
	}
}

func TestSoakDropFailsMaxLoss(t *testing.T) {
	url, srv := startTarget(t, refserver.Faults{Drop: 0.02})
	r, m := newTestRunner(t, url)
	rep, err := r.Run(context.Background(), testProfile(), nil)
	if err != nil {
		t.Fatal(err)
	}
	all := rep.Deliveries["all"]
	th := row(rep, "max_loss")
	t.Logf("drop 2%%: %+v; max_loss row %+v; target dropped %d", all, th, srv.Stats().Dropped)
	if rep.Result != metrics.ResultFail || th.Pass {
		t.Errorf("Result = %s, max_loss pass = %v; want fail on max_loss", rep.Result, th.Pass)
	}
	if all.LossRatio < 0.01 || all.LossRatio > 0.03 {
		t.Errorf("loss ratio = %.4f, want about 0.02", all.LossRatio)
	}
	if got, want := all.Lost+all.Undelivered, int64(srv.Stats().Dropped); got != want {
		t.Errorf("lost + undelivered = %d, target dropped %d: want equal", got, want)
	}
	if v := metrics.Value(m.SoakRuns.WithLabelValues("t", "test", metrics.ResultFail)); v != 1 {
		t.Errorf("soak_runs_total{result=fail} = %v, want 1", v)
	}
}

func TestSoakAbort(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	p := testProfile()
	p.Duration = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	start := time.Now()
	rep, err := r.Run(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("aborted run took %v to stop", took)
	}
	if rep.Result != metrics.ResultAborted {
		t.Errorf("Result = %s, want aborted", rep.Result)
	}
}

// TestSoakAbortRatesOverElapsed stops a run planned to send for a minute a
// few seconds into its send phase: its rate must be what it sent over the
// time it sent, as this test measures that time, not over the minute
// planned. Its progress reports must say loss is pending until lost_after
// has passed since sending began.
func TestSoakAbortRatesOverElapsed(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	p := testProfile()
	p.Duration = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type seen struct {
		Progress
		at time.Time
	}
	var (
		mu       sync.Mutex
		reports  []seen
		once     sync.Once
		canceled time.Time
	)
	progress := func(pr Progress) {
		now := time.Now()
		mu.Lock()
		reports = append(reports, seen{pr, now})
		mu.Unlock()
		if pr.Phase == report.PhaseSend {
			// Past lost_after into sending, so some reports are judged.
			once.Do(func() {
				time.AfterFunc(p.LostAfter+500*time.Millisecond, func() {
					mu.Lock()
					canceled = time.Now()
					mu.Unlock()
					cancel()
				})
			})
		}
	}
	rep, err := r.Run(ctx, p, progress)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Result != metrics.ResultAborted || len(rep.Phases) != 2 || rep.Phases[1].Name != report.PhaseSend {
		t.Fatalf("result %s, phases %+v; want aborted in the send phase", rep.Result, rep.Phases)
	}
	mu.Lock()
	defer mu.Unlock()
	sendStart := rep.Phases[1].Start
	m := rep.Messages
	// Sending stopped after the cancel and before the run's end.
	lo, hi := canceled.Sub(sendStart).Seconds(), rep.End.Sub(sendStart).Seconds()
	t.Logf("sent %d in %.3fs (%.3fs to the cancel, %.3fs to the end): %.1f/s", m.Sent, m.SendSeconds, lo, hi, m.SentPerSec)
	if m.Sent == 0 {
		t.Fatal("nothing sent in the send phase")
	}
	if m.SendSeconds < lo || m.SendSeconds > hi {
		t.Errorf("send_seconds = %v, want between %v (send start to cancel) and %v (to the run's end)", m.SendSeconds, lo, hi)
	}
	if want := float64(m.Sent) / m.SendSeconds; math.Abs(m.SentPerSec-want) > 1e-9*want {
		t.Errorf("sent_per_second = %v, want sent / send_seconds = %v", m.SentPerSec, want)
	}
	if atMost, atLeast := float64(m.Sent)/lo, float64(m.Sent)/hi; m.SentPerSec > atMost || m.SentPerSec < atLeast {
		t.Errorf("sent_per_second = %v, want %d sent over the time sent, between %v and %v", m.SentPerSec, m.Sent, atLeast, atMost)
	}
	if !strings.Contains(strings.Join(rep.Notes, " "), "the send rate is over the "+report.FormatSpan(time.Duration(m.SendSeconds*float64(time.Second)))+" it sent, not the 1m planned") {
		t.Errorf("notes = %q, want one saying the rate is over the time sent", rep.Notes)
	}

	var judged int
	for _, s := range reports {
		if s.LostAfter != p.LostAfter {
			t.Errorf("progress lost_after = %v, want the profile's %v", s.LostAfter, p.LostAfter)
		}
		// Judged only once lost_after has passed since sending began:
		// the report arrives after the sample that made it.
		if s.LossJudged {
			judged++
			if s.Phase == report.PhaseRamp || s.at.Sub(sendStart) < p.LostAfter {
				t.Errorf("progress at %v into sending (%s) says loss is judged; lost_after is %v", s.at.Sub(sendStart), s.Phase, p.LostAfter)
			}
		}
		if s.Phase == report.PhaseSend {
			// The rest of a minute's sending and the drain, counted from
			// when sending began.
			if s.Remaining > p.Duration+p.Drain || s.Remaining+s.at.Sub(sendStart) < p.Duration+p.Drain {
				t.Errorf("progress %v into sending: remaining %v, want %v less at most that", s.at.Sub(sendStart), s.Remaining, p.Duration+p.Drain)
			}
		}
	}
	// The sample at the end of sending came after the cancel, past
	// lost_after.
	if judged == 0 {
		t.Errorf("no progress report judged loss, though sending ran %vs with lost_after %v", m.SendSeconds, p.LostAfter)
	}
}

func TestSoakOverlapIsSkipped(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, m := newTestRunner(t, url)
	p := testProfile()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Run(context.Background(), p, nil)
	}()
	// Until the run holds the runner: a TryLock that succeeds is before
	// it, and is let go at once.
	for r.busy.TryLock() {
		r.busy.Unlock()
		runtime.Gosched()
	}
	if _, err := r.TryRun(context.Background(), p, nil); err != ErrBusy {
		t.Errorf("TryRun during a run = %v, want ErrBusy", err)
	}
	<-done
	if v := metrics.Value(m.SoakSkipped.WithLabelValues("t", "test")); v != 1 {
		t.Errorf("soak_runs_skipped_total = %v, want 1", v)
	}
}

// TestSoakLateLogins has half the users log in a second into the send
// phase: what was sent to them meanwhile must arrive from the target's
// offline queue, late but not lost.
func TestSoakLateLogins(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	p := testProfile()
	p.LateLogins, p.LateAfter = 0.5, 1500*time.Millisecond
	p.Thresholds.MaxLate, p.Thresholds.P99Delivery = 1, 10*time.Second
	p.Drain = 4 * time.Second
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	all := rep.Deliveries["all"]
	t.Logf("late logins: %s %+v users %+v", rep.Result, all, rep.Users)
	if all.Late == 0 {
		t.Error("no late deliveries: the offline users' messages should arrive late")
	}
	if all.Lost+all.Undelivered != 0 || all.Delivered != all.Expected {
		t.Errorf("deliveries = %+v, want none lost", all)
	}
	if rep.Users.LoggedIn != p.Users || rep.Result != metrics.ResultPass {
		t.Errorf("logged in %d of %d, result %s; thresholds %+v", rep.Users.LoggedIn, p.Users, rep.Result, rep.Thresholds)
	}
}

// TestSoakWaitsForEveryDevice: with two devices a user, the send phase
// starts once every user's two sessions are online, not once there are as
// many sessions as users: a run that starts sending with half its users
// still logging in fails min_online_ratio on the target's behalf.
func TestSoakWaitsForEveryDevice(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	p := testProfile()
	// A ramp long enough that the first samples of the send phase would
	// land inside it.
	p.Devices, p.Ramp = 2, 2*time.Second
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("two devices: %s, min online %v, %+v", rep.Result, rep.Users.MinOnlineRatio, rep.Deliveries["all"])
	if rep.Users.MinOnlineRatio != 1 {
		t.Errorf("min online ratio = %v, want 1: sending started before every device was online", rep.Users.MinOnlineRatio)
	}
}
