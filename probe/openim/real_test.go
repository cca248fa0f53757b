package openim_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/openim"
)

// These tests run against the real OpenIM v3.8.3 services that .ci/openim.sh
// starts (Redis and etcd from Debian, kfake as Kafka, FerretDB behind
// mongofix as MongoDB): registration, tokens, the gateway's login, its
// heartbeat, sends and their acks, the kick, GetNewestSeq, and the message
// path behind them, seqs, storage and pushes.
const (
	apiVar    = "IMCANARYTEST_OPENIM_API"
	wsVar     = "IMCANARYTEST_OPENIM_WS"
	secretVar = "IMCANARYTEST_OPENIM_SECRET_FILE"
	// slowPrefix names a second server of the same kind, for the
	// slow-reader drill alone: the slow readers hold up every push of
	// the server they are on (see TestConformanceReal).
	slowPrefix = "IMCANARYTEST_OPENIM_SLOW_"
)

// realServer is the real OpenIM's API and gateway, and its API secret.
type realServer struct {
	api, ws string
	secret  []byte
}

func (r realServer) APIURL() string { return r.api }
func (r realServer) WSURL() string  { return r.ws }

// realTarget returns the real services, or skips.
func realTarget(t *testing.T) realServer {
	t.Helper()
	return realFrom(t, apiVar, wsVar, secretVar)
}

// realSlowTarget returns the real services kept for the slow-reader
// drill, or skips.
func realSlowTarget(t *testing.T) realServer {
	t.Helper()
	return realFrom(t, slowPrefix+"API", slowPrefix+"WS", slowPrefix+"SECRET_FILE")
}

func realFrom(t *testing.T, apiVar, wsVar, secretVar string) realServer {
	t.Helper()
	api, ws, file := os.Getenv(apiVar), os.Getenv(wsVar), os.Getenv(secretVar)
	if api == "" || ws == "" || file == "" {
		t.Skipf("%s, %s or %s not set: no OpenIM to test against (.ci/openim.sh starts one)", apiVar, wsVar, secretVar)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return realServer{api: api, ws: ws, secret: []byte(strings.TrimSpace(string(b)))}
}

// realDriver returns a driver for the real services, or skips.
func realDriver(t *testing.T, o openim.Options) *openim.Driver {
	t.Helper()
	srv := realTarget(t)
	if o.Secret == nil {
		o.Secret = srv.secret
	}
	o.URL = srv.ws
	if o.Heartbeat == 0 {
		o.Heartbeat = 5 * time.Second
	}
	drv, err := openim.New(openim.Config{APIURL: srv.api}, o)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// recorder is a Handler that keeps what a session read.
type recorder struct {
	mu         sync.Mutex
	acks       map[uint64]time.Time
	rejects    map[uint64]string
	deliveries int
}

func newRecorder() *recorder {
	return &recorder{acks: map[uint64]time.Time{}, rejects: map[uint64]string{}}
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) {
	r.mu.Lock()
	r.acks[ref] = time.Now()
	r.mu.Unlock()
}

func (r *recorder) OnReject(ref uint64, reason string) {
	r.mu.Lock()
	r.rejects[ref] = reason
	r.mu.Unlock()
}

func (r *recorder) OnDelivery(*probe.Delivery) {
	r.mu.Lock()
	r.deliveries++
	r.mu.Unlock()
}

func (r *recorder) answered(ref uint64) (time.Time, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.acks[ref]
	reason, rejected := r.rejects[ref]
	return at, reason, ok || rejected
}

// serve runs s.Serve on a goroutine of its own; the channel gets its end.
func serve(s probe.Session, h probe.Handler) <-chan error {
	ended := make(chan error, 1)
	go func() { ended <- s.Serve(h) }()
	return ended
}

// realUsers returns n user names of this run, with the '-' imcanary's own
// names carry, which OpenIM's ids cannot (the driver escapes it).
func realUsers(n int) []string {
	p := fmt.Sprintf("imcreal%d", time.Now().UnixNano()%1e9)
	u := make([]string, n)
	for i := range u {
		u[i] = fmt.Sprintf("%s-u%d", p, i)
	}
	return u
}

// TestRealSendAck: users registered (twice: the second time changes
// nothing), a login per device, and 100 sends each acked by the real
// gateway with the msgIncr it was sent under, and pushed to the recipient;
// the ack latency is logged.
func TestRealSendAck(t *testing.T) {
	drv := realDriver(t, openim.Options{})
	ctx := context.Background()
	users := realUsers(2)
	plan := probe.Plan{Users: users, Direct: []probe.Pair{{From: users[0], To: users[1]}}}
	for i := range 2 {
		if err := drv.Provision(ctx, plan); err != nil {
			t.Fatalf("provision #%d: %v", i+1, err)
		}
	}
	a, err := drv.Connect(ctx, users[0], probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := drv.Connect(ctx, users[1], probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ra, rb := newRecorder(), newRecorder()
	endA, endB := serve(a, ra), serve(b, rb)
	var lat []time.Duration
	for ref := uint64(1); ref <= 100; ref++ {
		sent := time.Now()
		if err := a.Send(&probe.Message{Ref: ref, To: users[1], Body: []byte(fmt.Sprintf("imc1 real %d", ref))}); err != nil {
			t.Fatalf("send %d: %v", ref, err)
		}
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Microsecond) {
			at, reason, ok := ra.answered(ref)
			if ok {
				if reason != "" {
					t.Fatalf("send %d rejected: %s", ref, reason)
				}
				lat = append(lat, at.Sub(sent))
				break
			}
			if time.Now().After(end) {
				t.Fatalf("send %d: no ack within 10 s", ref)
			}
		}
	}
	slices.Sort(lat)
	t.Logf("100 sends acked by the real gateway: ack latency min %v, median %v, p99 %v, max %v",
		lat[0], lat[50], lat[98], lat[99])
	// Each is stored, numbered and pushed to the recipient.
	acked := time.Now()
	testwait.For(t, 30*time.Second, "the recipient's 100 pushes", func() bool {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		return rb.deliveries == 100
	})
	t.Logf("the 100th push came %v after the last ack", time.Since(acked).Round(time.Millisecond))
	for _, ended := range []<-chan error{endA, endB} {
		select {
		case err := <-ended:
			t.Fatalf("a session ended: %v", err)
		default:
		}
	}
}

// TestRealHeartbeatAndNewestSeq: a session on a platform the gateway does
// not ping (Windows, 3) stays up past the gateway's 30 s read deadline on
// imcanary's text pings alone, and GetNewestSeq is answered.
func TestRealHeartbeatAndNewestSeq(t *testing.T) {
	drv := realDriver(t, openim.Options{})
	ctx := context.Background()
	users := realUsers(1)
	if err := drv.Provision(ctx, probe.Plan{Users: users}); err != nil {
		t.Fatal(err)
	}
	s, err := drv.Connect(ctx, users[0], probe.Device{Index: 1, Catchup: probe.NewCatchup(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ended := serve(s, newRecorder())
	began := time.Now()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for time.Since(began) < 35*time.Second {
		select {
		case err := <-ended:
			t.Fatalf("session on platform 3 ended after %v despite its pings: %v", time.Since(began).Round(time.Millisecond), err)
		case <-tick.C:
			if err := s.Ping(); err != nil {
				t.Fatalf("ping: %v", err)
			}
		}
	}
	// Connect asked the newest seq once (catch-up on); ask again.
	if err := s.(probe.Syncer).Sync(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); drv.Stats().Newest < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d GetNewestSeq answers, want 2 (at login and on sync)", drv.Stats().Newest)
		}
	}
	t.Logf("platform 3 session up %v on text pings every 5 s; %d GetNewestSeq answers", time.Since(began).Round(time.Second), drv.Stats().Newest)
}

// TestRealKick: a second login of a user on the same platform makes the
// real gateway kick the first (2002), which ends as conflict; a login on
// another platform kicks nobody.
func TestRealKick(t *testing.T) {
	drv := realDriver(t, openim.Options{})
	ctx := context.Background()
	users := realUsers(1)
	if err := drv.Provision(ctx, probe.Plan{Users: users}); err != nil {
		t.Fatal(err)
	}
	first, err := drv.Connect(ctx, users[0], probe.Device{Index: 0})
	if err != nil {
		t.Fatal(err)
	}
	ended := serve(first, newRecorder())
	other, err := drv.Connect(ctx, users[0], probe.Device{Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	otherEnded := serve(other, newRecorder())
	second, err := drv.Connect(ctx, users[0], probe.Device{Index: 0})
	if err != nil {
		t.Fatalf("second login on platform 5: %v", err)
	}
	defer second.Close()
	select {
	case err := <-ended:
		if r := probe.ReasonOf(err); r != metrics.ReasonConflict {
			t.Errorf("first session ended %q (%v), want conflict", r, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("first session not kicked within 10 s")
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-otherEnded:
		t.Errorf("the session on another platform ended: %v", err)
	default:
	}
	if k := drv.Stats().Kicked; k != 1 {
		t.Errorf("kicked = %d, want 1", k)
	}
}

// TestRealRefused: a token the gateway refuses is got again once and the
// login goes through; a wrong API secret fails as unauthorized, in an
// error that holds neither the secret nor OpenIM's call stack.
func TestRealRefused(t *testing.T) {
	drv := realDriver(t, openim.Options{})
	ctx := context.Background()
	users := realUsers(1)
	if err := drv.Provision(ctx, probe.Plan{Users: users}); err != nil {
		t.Fatal(err)
	}
	drv.SetToken(users[0], 5, "garbage")
	s, err := drv.Connect(ctx, users[0], probe.Device{Index: 0})
	if err != nil {
		t.Fatalf("login after a refused token: %v", err)
	}
	s.Close()

	bad := realDriver(t, openim.Options{Secret: []byte("not-the-api-secret")})
	err = bad.Provision(ctx, probe.Plan{Users: realUsers(1)})
	if err == nil || probe.FailureReason(err) != metrics.ConnectUnauthorized {
		t.Fatalf("provision with a wrong secret = %v (%s), want unauthorized", err, probe.FailureReason(err))
	}
	if msg := err.Error(); strings.Contains(msg, "not-the-api-secret") || strings.Contains(msg, ".go:") {
		t.Errorf("error %q holds the secret or the server's stack", msg)
	}
	bad.SetToken(users[0], 5, "garbage")
	_, err = bad.Connect(ctx, users[0], probe.Device{Index: 0})
	if err == nil || probe.FailureReason(err) != metrics.ConnectUnauthorized {
		t.Fatalf("login with a refused token and a wrong secret = %v (%s), want unauthorized", err, probe.FailureReason(err))
	}
	if msg := err.Error(); strings.Contains(msg, "garbage") || strings.Contains(msg, ".go:") {
		t.Errorf("error %q holds the token or the server's stack", msg)
	}
	t.Logf("refused: %v", err)
}
