package jsonws_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/refserver"
)

// refTarget serves a reference server on loopback until the test ends and
// returns its URL.
func refTarget(t *testing.T) string {
	t.Helper()
	srv, err := refserver.New(refserver.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "ws://" + ln.Addr().String() + "/ws"
}

func TestTryWalksTheMapping(t *testing.T) {
	url := refTarget(t)
	drv, err := jsonws.New(mappedReference(t), jsonws.Options{URL: url, Secret: secret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := jsonws.Try(context.Background(), drv, "ann", "bob", 10*time.Second, &out); err != nil {
		t.Fatalf("Try: %v\n%s", err, &out)
	}
	got := out.String()
	for _, want := range []string{
		`ann > {"type":"login","id":"1","user":"ann","token":"[redacted]"}`,
		`matched login[0].reply: id=1`,
		`groups.create: ok`,
		`ann > {"type":"send"`,
		`matched send.ack.match`,
		`bob   matched delivery.match: type=msg`,
		"ok: bob got it",
		"every step passed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the walk does not show %q:\n%s", want, got)
		}
	}
	// The real token never shows: the server's HMAC of the user.
	if strings.Contains(got, refserver.Token(secret, "ann")) {
		t.Errorf("the walk shows ann's token:\n%s", got)
	}
}

func TestTryNamesTheFailingStep(t *testing.T) {
	url := refTarget(t)
	for _, tt := range []struct {
		name   string
		break_ func(*jsonws.Config)
		want   string
	}{
		{"delivery body elsewhere", func(c *jsonws.Config) { c.Delivery.Body = "text" },
			"body"},
		{"deliveries never match", func(c *jsonws.Config) { c.Delivery.Match = map[string]any{"type": "message"} },
			"got no frame matching delivery.match"},
		{"ack never matches", func(c *jsonws.Config) { c.Send.Ack.ID = "ref" },
			"no ack matched send.ack"},
		{"login refused", func(c *jsonws.Config) { c.Login[0].(map[string]any)["success"] = map[string]any{"type": "welcome"} },
			"login[0] (login) refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mappedReference(t)
			cfg.Login = []any{cloneMap(cfg.Login[0].(map[string]any))}
			tt.break_(&cfg)
			drv, err := jsonws.New(cfg, jsonws.Options{URL: url, Secret: secret, Heartbeat: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err = jsonws.Try(context.Background(), drv, "ann", "bob", 2*time.Second, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Try = %v, want an error saying %q\n%s", err, tt.want, &out)
			}
		})
	}
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// recorder is a Handler that keeps what it is given.
type recorder struct {
	mu         sync.Mutex
	deliveries int
	acks       chan uint64
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) {
	if r.acks != nil {
		r.acks <- ref
	}
}
func (r *recorder) OnReject(uint64, string) {}
func (r *recorder) OnDelivery(*probe.Delivery) {
	r.mu.Lock()
	r.deliveries++
	r.mu.Unlock()
}

// TestUnmatchedFramesAreCounted: a frame no rule matches is counted, and
// one an ignore rule names is not.
func TestUnmatchedFramesAreCounted(t *testing.T) {
	url := refTarget(t)
	for _, tt := range []struct {
		name   string
		ignore []any

		pong map[string]any
		want uint64
	}{
		{"pong unmapped", nil, nil, 1},
		{"pong ignored", []any{map[string]any{"type": "pong"}}, nil, 0},
		{"pong rule", nil, map[string]any{"type": "pong"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mappedReference(t)
			// An application ping, whose pong is the frame at stake.
			cfg.Keepalive.Ping = `{"type":"ping","id":"{{.ID}}"}`
			cfg.Ignore, cfg.Keepalive.Pong = tt.ignore, tt.pong
			drv, err := jsonws.New(cfg, jsonws.Options{URL: url, Secret: secret, Heartbeat: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s, err := drv.Connect(context.Background(), "ann", probe.Device{})
			if err != nil {
				t.Fatal(err)
			}
			r := &recorder{acks: make(chan uint64, 1)}
			done := make(chan error, 1)
			go func() { done <- s.Serve(r) }()
			if err := s.Ping(); err != nil {
				t.Fatal(err)
			}
			// A send after the ping: the server answers in order, so
			// its ack, once read, says the pong was handled.
			if err := s.Send(&probe.Message{Ref: 9, To: "bob", Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.acks:
			case <-time.After(10 * time.Second):
				t.Fatal("no ack")
			}
			_ = s.Close()
			if err := <-done; probe.ReasonOf(err) != metrics.ReasonShutdown {
				t.Fatalf("Serve = %v, want shutdown", err)
			}
			if got := drv.FramesUnmatched(); got != tt.want {
				t.Errorf("unmatched frames = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestMalformedFrameEndsTheSession: a server that sends broken JSON, or a
// binary frame, ends the session with an error that says so, and nothing
// is delivered.
func TestMalformedFrameEndsTheSession(t *testing.T) {
	for _, tt := range []struct {
		name string
		typ  int
		data string
		want string
	}{
		{"broken JSON", websocket.TextMessage, `{"type":"msg","body":"imc1 x`, "malformed frame"},
		{"binary", websocket.BinaryMessage, `{"type":"msg","body":"imc1 x"}`, "binary frame"},
	} {
		t.Run(tt.name, func(t *testing.T) { malformed(t, tt.typ, tt.data, tt.want) })
	}
}

func malformed(t *testing.T, typ int, data, want string) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, _, _ = c.ReadMessage() // the login
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"login_ok","id":"1"}`))
		_ = c.WriteMessage(typ, []byte(data))
		_, _, _ = c.ReadMessage() // until the client closes
	}))
	defer srv.Close()
	drv, err := jsonws.New(mappedReference(t), jsonws.Options{URL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws", Secret: secret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := drv.Connect(context.Background(), "ann", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	err = s.Serve(r)
	if probe.ReasonOf(err) != metrics.ReasonError || !strings.Contains(err.Error(), want) {
		t.Errorf("Serve = %v, want an error saying %q", err, want)
	}
	if r.deliveries != 0 {
		t.Errorf("%d deliveries from a malformed frame", r.deliveries)
	}
}

// FuzzServe runs a logged-in session of the mapped reference protocol
// against a server that sends one arbitrary frame, then closes: whatever
// the frame, Serve returns a *probe.Disconnect and never panics.
func FuzzServe(f *testing.F) {
	for _, s := range []string{
		`{"type":"msg","from":"u2","conv":"d:u1:u2","seq":1,"body":"imc1 r u2 d.u1 1 2 0-0"}`,
		`{"type":"ack","id":"18446744073709551615","seq":3,"conv":"d:u1:u2"}`,
		`{"type":"ok","id":"99999999999999999999999","last":3}`,
		`{"type":"seqs","id":"2","convs":{"d:u1:u2":18446744073709551615,"x":"y"}}`,
		`{"type":"msg",`, "\xff", ``, `[]`,
	} {
		f.Add([]byte(s))
	}
	cfg := mappedReference(f)
	f.Fuzz(func(t *testing.T, frame []byte) {
		up := websocket.Upgrader{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer c.Close()
			_, _, _ = c.ReadMessage()
			_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"login_ok","id":"1"}`))
			_ = c.WriteMessage(websocket.TextMessage, frame)
			_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "end"), time.Now().Add(time.Second))
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					return
				}
			}
		}))
		defer srv.Close()
		drv, err := jsonws.New(cfg, jsonws.Options{URL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws", Secret: secret, Heartbeat: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s, err := drv.Connect(context.Background(), "u1", probe.Device{Catchup: probe.NewCatchup(time.Millisecond)})
		if err != nil {
			return // a frame during login may fail it: said, not panicked
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(&recorder{}) }()
		select {
		case err := <-done:
			if _, ok := err.(*probe.Disconnect); !ok {
				t.Fatalf("Serve = %T %v, want a *probe.Disconnect", err, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return within 5s of the server's close")
		}
	})
}

// TestProvisionKeepsWhatItLearnt: what a group's creation captured is kept
// in data_dir, so that provisioning the same plan again, after a restart,
// sends nothing: a second driver provisions against a server that is no
// longer there.
func TestProvisionKeepsWhatItLearnt(t *testing.T) {
	url := refTarget(t)
	dir := t.TempDir()
	cfg := mappedReference(t)
	create := cloneMap(cfg.Groups.Create)
	create["capture"] = map[string]any{"tag": "id"}
	cfg.Groups.Create = create
	plan := probe.Plan{Users: []string{"ann", "bob"}, Groups: []probe.Group{{Name: "g1", Members: []string{"ann", "bob"}}}}
	drv, err := jsonws.New(cfg, jsonws.Options{URL: url, Secret: secret, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Provision(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "jsonws-directory.json")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600: it may hold what a server handed out", path, st.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"g1"`) || !strings.Contains(string(b), `"tag"`) {
		t.Errorf("%s = %s, want g1's captured tag", path, b)
	}
	again, err := jsonws.New(cfg, jsonws.Options{URL: "ws://127.0.0.1:1/ws", Secret: secret, DataDir: dir, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Provision(context.Background(), plan); err != nil {
		t.Errorf("provisioning a plan already provisioned: %v, want nothing sent", err)
	}
	// A group it has not seen is created, which needs the server.
	plan.Groups = append(plan.Groups, probe.Group{Name: "g2", Members: []string{"bob", "ann"}})
	if err := again.Provision(context.Background(), plan); err == nil {
		t.Error("provisioning a new group without a server succeeded")
	}
}

// TestDeliveryDuringLoginIsKept: a delivery the server pushes before it
// answers the login is kept and handled once Serve runs, never dropped.
func TestDeliveryDuringLoginIsKept(t *testing.T) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, _, _ = c.ReadMessage()
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"msg","from":"bob","conv":"d:ann:bob","seq":1,"body":"early"}`))
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"login_ok","id":"1"}`))
		_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "end"), time.Now().Add(time.Second))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	drv, err := jsonws.New(mappedReference(t), jsonws.Options{URL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws", Secret: secret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := drv.Connect(context.Background(), "ann", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	_ = s.Serve(r)
	if r.deliveries != 1 {
		t.Errorf("%d deliveries, want the one pushed during the login", r.deliveries)
	}
}
