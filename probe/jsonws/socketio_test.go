package jsonws_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/protocols"
)

// These tests run configs/socketio.yaml, and nothing else specific to
// Socket.IO, against a real Socket.IO 4 server: the test server of
// testdata/socketio, which .ci/socketio.sh starts. Without it they skip.
//
//	IMCANARYTEST_SOCKETIO_URL       its WebSocket URL
//	IMCANARYTEST_SOCKETIO_DROP_URL  one started with SOCKETIO_DROP=0.02
//	IMCANARYTEST_SOCKETIO_SECRET    the secret both check tokens with

// socketIO returns the driver of configs/socketio.yaml for the server at
// the URL in env, or skips.
func socketIO(t *testing.T, env string) (*jsonws.Driver, string) {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		t.Skipf("%s not set: no Socket.IO server to test against (.ci/socketio.sh starts one)", env)
	}
	cfg, err := protocols.Loader().Load("../../configs/socketio.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := jsonws.New(config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig()), jsonws.Options{
		URL: u, Secret: []byte(os.Getenv("IMCANARYTEST_SOCKETIO_SECRET")), Heartbeat: 5 * time.Second, DataDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	pu, _ := url.Parse(u)
	return drv, "http://" + pu.Host
}

// sioStats are the test server's counters (GET /stats).
type sioStats struct {
	Sent, Delivered, Dropped, Replayed, Killed uint64
}

func getStats(t *testing.T, base string) sioStats {
	t.Helper()
	resp, err := http.Get(base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s sioStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// runPrefix makes user and group names no earlier run used: the server
// keeps its conversations for its lifetime.
func runPrefix(name string) string {
	return fmt.Sprintf("%s%d", name, time.Now().UnixNano()%1e9)
}

// TestSocketIOPopulation: 500 users in groups of 5 and in pairs, through
// the mapping only: every message acked, delivered, none lost; a receiver
// whose connections are killed mid-run comes back and fetches what it
// missed through the server's history, counted recovered and never lost.
func TestSocketIOPopulation(t *testing.T) {
	drv, base := socketIO(t, "IMCANARYTEST_SOCKETIO_URL")
	pc := popConfig{prefix: runPrefix("sio"), users: 500, groupSize: 5, rate: 0.5, ramp: 2 * time.Second,
		deadline: 2 * time.Second, lostAfter: 4 * time.Second, catchUp: true, backoff: 2 * time.Second}
	before := getStats(t, base)
	fx := startPopulation(t, drv, pc)
	time.Sleep(2 * time.Second)
	// Kill a few receivers: every connection of each, no close frame.
	var killed int
	for i := range 5 {
		user := fmt.Sprintf("%s-u%d", pc.prefix, 10+i*37)
		resp, err := http.Post(base+"/kill?user="+url.QueryEscape(user), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		var k struct{ Killed int }
		_ = json.NewDecoder(resp.Body).Decode(&k)
		resp.Body.Close()
		killed += k.Killed
	}
	if killed == 0 {
		t.Fatalf("killed no connection: the user names are not %s-uN", pc.prefix)
	}
	time.Sleep(3 * time.Second)
	c := fx.soak(0, pc.lostAfter)
	st := getStats(t, base)
	t.Logf("socket.io: %+v; server: sent %d, delivered %d, replayed %d, killed %d connections",
		c, st.Sent-before.Sent, st.Delivered-before.Delivered, st.Replayed-before.Replayed, killed)
	fx.checkComplete(c, killed)
	if float64(st.Replayed-before.Replayed) < c.recovered {
		t.Errorf("recovered %v, but the server replayed only %d", c.recovered, st.Replayed-before.Replayed)
	}
	if d := metrics.Value(fx.set.Disconnects[metrics.ReasonError]); d < float64(killed) {
		t.Errorf("%v sessions ended by error, want one per killed connection (%d)", d, killed)
	}
	if n := drv.FramesUnmatched(); n != 0 {
		t.Errorf("%d frames matched no rule of configs/socketio.yaml", n)
	}
}

// TestSocketIOServerGaps: a server that drops 2% of pushes but keeps them
// in its history: the mapped seq shows each gap, catch-up fetches it, and
// the ledger counts it recovered, never lost.
func TestSocketIOServerGaps(t *testing.T) {
	drv, base := socketIO(t, "IMCANARYTEST_SOCKETIO_DROP_URL")
	pc := popConfig{prefix: runPrefix("siod"), users: 40, groupSize: 5, rate: 5, ramp: 500 * time.Millisecond,
		deadline: 2 * time.Second, lostAfter: 4 * time.Second, catchUp: true}
	before := getStats(t, base)
	fx := startPopulation(t, drv, pc)
	c := fx.soak(4*time.Second, pc.lostAfter)
	st := getStats(t, base)
	dropped := float64(st.Dropped - before.Dropped)
	gaps, missed := drv.ServerGaps()
	t.Logf("socket.io drop: %+v; server dropped %v; gaps %d, missed %d", c, dropped, gaps, missed)
	if dropped == 0 {
		t.Fatal("the server dropped nothing: SOCKETIO_DROP is not set on it")
	}
	if math.Abs(c.recovered-dropped) > math.Max(5, 0.2*dropped) {
		t.Errorf("recovered %v, the server dropped %v: want within 20%%", c.recovered, dropped)
	}
	if c.lost != 0 || c.delivered+c.recovered != c.expected {
		t.Errorf("lost %v; delivered %v + recovered %v of %v: the store had every dropped push", c.lost, c.delivered, c.recovered, c.expected)
	}
	if gaps == 0 || float64(missed) > dropped+1 {
		t.Errorf("server gaps %d missing %d, want some, and no more missing than the %v dropped", gaps, missed, dropped)
	}
}

// TestSocketIORefusedToken: a token the server does not accept fails the
// login as unauthorized, with the server's own reason.
func TestSocketIORefusedToken(t *testing.T) {
	u := os.Getenv("IMCANARYTEST_SOCKETIO_URL")
	if u == "" || os.Getenv("IMCANARYTEST_SOCKETIO_SECRET") == "" {
		t.Skip("IMCANARYTEST_SOCKETIO_URL and _SECRET not set")
	}
	cfg, err := protocols.Loader().Load("../../configs/socketio.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := jsonws.New(config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig()),
		jsonws.Options{URL: u, Secret: []byte("not-the-servers-secret"), Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = drv.Connect(context.Background(), "mallory", probe.Device{})
	if err == nil {
		t.Fatal("a login with a wrong token succeeded")
	}
	if r := probe.FailureReason(err); r != metrics.ConnectUnauthorized || !strings.Contains(err.Error(), "unauthorized") {
		t.Errorf("login error %q classed %s, want unauthorized with the server's reason", err, r)
	}
}
