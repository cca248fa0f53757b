package reference_test

import (
	"context"
	"errors"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/memnet"
	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// nopHandler ignores what a session reads.
type nopHandler struct{}

func (nopHandler) OnAck(uint64, probe.Ack)    {}
func (nopHandler) OnReject(uint64, string)    {}
func (nopHandler) OnDelivery(*probe.Delivery) {}

// fakeServer logs any user in, then behaves as then says: a server that
// misbehaves in one specific way. It serves on an in-memory network that
// newDriver dials, so that a test can run in a synctest bubble.
func fakeServer(t *testing.T, then func(c *websocket.Conn)) string {
	t.Helper()
	up := websocket.Upgrader{}
	return fakes.Start(t, "ws", "/ws", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"login_ok","id":"login"}`))
		then(c)
	}))
}

// fakes are the running fake servers, for newDriver to dial.
var fakes memnet.Fakes

// newDriver is reference.New, dialling the fake server at o.URL in memory.
func newDriver(t *testing.T, o reference.Options) *reference.Driver {
	t.Helper()
	drv, err := reference.New(o)
	if err != nil {
		t.Fatal(err)
	}
	dial, ok := fakes.Dial(o.URL)
	if !ok {
		t.Fatalf("no fake server at %s", o.URL)
	}
	reference.SetDial(drv, dial)
	return drv
}

func closeWith(code int, text string) func(c *websocket.Conn) {
	return func(c *websocket.Conn) {
		_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
		_, _, _ = c.ReadMessage()
	}
}

// TestDisconnectReasons checks each way a session can end is classified:
// imcanary_session_disconnects_total{reason="slow_consumer"} must mean the
// server's slow-reader close and nothing else.
func TestDisconnectReasons(t *testing.T) {
	tests := []struct {
		name     string
		server   func(c *websocket.Conn)
		ourClose bool
		reason   string
		code     int
		errText  string
	}{
		{name: "slow consumer close", server: closeWith(4008, "slow consumer"), reason: metrics.ReasonSlowConsumer, code: 4008},
		{name: "going away", server: closeWith(websocket.CloseGoingAway, "shutdown"), reason: metrics.ReasonServerClose, code: 1001},
		{name: "policy close", server: closeWith(websocket.ClosePolicyViolation, "bad"), reason: metrics.ReasonServerClose, code: 1008},
		{name: "connection dropped", server: func(c *websocket.Conn) { c.NetConn().Close() }, reason: metrics.ReasonError},
		{
			name: "malformed frame",
			server: func(c *websocket.Conn) {
				_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"msg",`))
				_, _, _ = c.ReadMessage()
			},
			reason:  metrics.ReasonError,
			errText: "malformed frame",
		},
		{name: "our shutdown", server: func(c *websocket.Conn) {
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					return
				}
			}
		}, ourClose: true, reason: metrics.ReasonShutdown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				drv := newDriver(t, reference.Options{URL: fakeServer(t, tt.server), Heartbeat: time.Second})
				s, err := drv.Connect(context.Background(), "u1", probe.Device{})
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				if tt.ourClose {
					go func() { time.Sleep(50 * time.Millisecond); _ = s.Close() }()
				}
				done := make(chan error, 1)
				go func() { done <- s.Serve(nopHandler{}) }()
				var got error
				select {
				case got = <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("Serve did not return")
				}
				var d *probe.Disconnect
				if !errors.As(got, &d) {
					t.Fatalf("Serve() = %v, want a *probe.Disconnect", got)
				}
				if d.Reason != tt.reason || d.Code != tt.code || !strings.Contains(d.Error(), tt.errText) {
					t.Errorf("Serve() = %v (reason %q, code %d), want reason %q, code %d, text containing %q",
						d, d.Reason, d.Code, tt.reason, tt.code, tt.errText)
				}
			})
		})
	}
}

// TestConnectErrors checks that a failed connect names what failed, is
// classed under the reason an operator needs (FailureReason), reads in
// words (DescribeFailure), never shows the URL's query, and leaves
// nothing open.
func TestConnectErrors(t *testing.T) {
	status := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }))
		t.Cleanup(srv.Close)
		return "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws?token=s3cret"
	}
	// A listener that accepts and never answers: the upgrade times out.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		hole.Close()
		heldMu.Lock()
		defer heldMu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	// A listener that hangs up at once: a network error.
	hangup, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { hangup.Close() })
	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	target, err := refserver.New(refserver.Options{Secret: []byte("the target's secret")})
	if err != nil {
		t.Fatal(err)
	}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tctx, stopTarget := context.WithCancel(context.Background())
	tdone := make(chan struct{})
	go func() { defer close(tdone); _ = target.Serve(tctx, tln) }()
	t.Cleanup(func() { stopTarget(); <-tdone })

	// A server that answers the login with something else: a protocol
	// error.
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, _, _ = c.ReadMessage()
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"welcome"}`))
		_, _, _ = c.ReadMessage()
	}))
	t.Cleanup(garbage.Close)

	tests := []struct {
		name, url string
		secret    []byte
		want      string // in the error
		reason    string
		words     string // in DescribeFailure
	}{
		{"nothing listening", "ws://127.0.0.1:1/ws", nil, "dial ws://127.0.0.1:1/ws", metrics.ConnectRefused,
			"connection refused (dial tcp 127.0.0.1:1: connect: connection refused)"},
		{"HTTP 404", status(404), nil, "WebSocket upgrade answered HTTP 404 Not Found", metrics.ConnectHTTP4xx,
			"the WebSocket upgrade was answered HTTP 404 Not Found"},
		{"HTTP 401 from a proxy", status(401), nil, "HTTP 401 Unauthorized", metrics.ConnectUnauthorized,
			"the WebSocket upgrade was answered HTTP 401 Unauthorized"},
		{"HTTP 403", status(403), nil, "HTTP 403 Forbidden", metrics.ConnectUnauthorized, "HTTP 403 Forbidden"},
		{"HTTP 503", status(503), nil, "HTTP 503 Service Unavailable", metrics.ConnectHTTP5xx, "HTTP 503 Service Unavailable"},
		{"HTTP 200 without an upgrade", status(200), nil, "HTTP 200 OK", metrics.ConnectHTTPOther, "HTTP 200 OK"},
		{"no answer", "ws://" + hole.Addr().String() + "/ws", nil, "timeout", metrics.ConnectTimeout, "timed out"},
		// EOF or a reset, as the race between the close and the write
		// goes.
		{"hang-up", "ws://" + hangup.Addr().String() + "/ws", nil, "dial ws://", metrics.ConnectNetwork, "network error"},
		{"untrusted certificate", "wss" + strings.TrimPrefix(tlsSrv.URL, "https") + "/ws", nil,
			"certificate signed by unknown authority", metrics.ConnectTLS, "TLS handshake failed (tls: failed to verify certificate"},
		{"plain WebSocket to a TLS port", "ws" + strings.TrimPrefix(tlsSrv.URL, "https") + "/ws", nil,
			"HTTP 400 Bad Request", metrics.ConnectHTTP4xx, "HTTP 400"},
		{"wrong secret", "ws://" + tln.Addr().String() + "/ws", []byte("not the target's secret"),
			`closed the login with 4001 "bad token"`, metrics.ConnectUnauthorized,
			`unauthorized: the target closed the login with 4001 "bad token"`},
		{"not this protocol", "ws" + strings.TrimPrefix(garbage.URL, "http") + "/ws", nil,
			`unexpected login reply type "welcome"`, metrics.ConnectProtocol, `protocol error (unexpected login reply type "welcome")`},
	}

	// With a Poller the connection is dialled for the reactor (over
	// TLS, the handshake made inside wsframe): it must fail in the same
	// words.
	links := []probe.Link{{}}
	if poller, err := netpoll.New(); err == nil {
		t.Cleanup(func() { poller.Close() })
		links = append(links, probe.Link{Poller: poller})
	}
	for _, tt := range tests {
		for _, link := range links {
			name := tt.name
			if link.Poller != nil {
				name += ", watchable"
			}
			t.Run(name, func(t *testing.T) {
				drv, err := reference.New(reference.Options{URL: tt.url, Secret: tt.secret, DialTimeout: 500 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				_, err = drv.Connect(context.Background(), "u1", probe.Device{Link: link})
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("Connect() = %v, want an error containing %q", err, tt.want)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("Connect() = %v: the error shows the URL's query", err)
				}
				if got := probe.FailureReason(err); got != tt.reason {
					t.Errorf("FailureReason(%v) = %q, want %q", err, got, tt.reason)
				}
				if got := probe.DescribeFailure(probe.FailureReason(err), err.Error()); !strings.Contains(got, tt.words) {
					t.Errorf("DescribeFailure(%v) = %q, want it to contain %q", err, got, tt.words)
				}
			})
		}
	}
}

// TestWriteTimeoutEndsSession: a server that stops reading makes a write
// time out. The session must end (so the user reconnects) rather than stay
// online, reading, with a connection that can never send again.
func TestWriteTimeoutEndsSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		url := fakeServer(t, func(c *websocket.Conn) {
			_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"pong"}`))
			// Never read again; hold the connection open until the test is
			// over (cleanups run last first: before the server's close).
			<-release
		})
		t.Cleanup(func() { close(release) })
		drv := newDriver(t, reference.Options{URL: url, Heartbeat: time.Hour, WriteTimeout: 200 * time.Millisecond})
		s, err := drv.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(nopHandler{}) }()
		big := make([]byte, 60<<10)
		for i := range big {
			big[i] = 'x'
		}
		var sendErr error
		for i := 0; i < 2000 && sendErr == nil; i++ {
			sendErr = s.Send(&probe.Message{Ref: uint64(i), To: "u2", Body: big})
		}
		if sendErr == nil {
			t.Fatal("no write timed out against a server that never reads")
		}
		select {
		case err := <-done:
			if r := probe.ReasonOf(err); r != metrics.ReasonError {
				t.Errorf("Serve() = %v (reason %s), want reason error", err, r)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("session still serving after its write failed")
		}
	})
}

// stamped is what stampRecorder keeps of one delivery.
type stamped struct {
	body string
	at   int64 // Delivery.At
	now  int64 // time.Now in OnDelivery
}

// stampRecorder passes each delivery's At on, with the time OnDelivery ran.
type stampRecorder struct {
	nopHandler
	got chan stamped
}

func (r stampRecorder) OnDelivery(d *probe.Delivery) {
	r.got <- stamped{body: string(d.Body), at: d.At, now: time.Now().UnixNano()}
}

// TestDeliveryAt checks every delivery says when its frame came off the
// socket: not zero, not after OnDelivery, and not before the server began
// writing the frame, or for a frame written in two parts, its last part.
func TestDeliveryAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const gap = 50 * time.Millisecond
		msgs := []string{
			`{"type":"msg","from":"u2","to":"u1","conv":"d:u1:u2","msg_id":"1","seq":1,"body":"direct"}`,
			`{"type":"msg","from":"u3","group":"g1","conv":"g:g1","msg_id":"2","seq":1,"body":"group"}`,
			`{"type":"msg","from":"u2","to":"u1","conv":"d:u1:u2","msg_id":"3","seq":2,"body":"split"}`,
		}
		// sent[i] is taken just before the server writes (the end of)
		// message i.
		sent := make(chan int64, len(msgs))
		url := fakeServer(t, func(c *websocket.Conn) {
			for _, m := range msgs[:2] {
				time.Sleep(gap)
				sent <- time.Now().UnixNano()
				_ = c.WriteMessage(websocket.TextMessage, []byte(m))
			}
			// The last one by hand, as an unmasked frame split in two
			// writes: its stamp must be the second's.
			raw := append([]byte{0x81, byte(len(msgs[2]))}, msgs[2]...)
			_, _ = c.NetConn().Write(raw[:20])
			time.Sleep(gap)
			sent <- time.Now().UnixNano()
			_, _ = c.NetConn().Write(raw[20:])
			_, _, _ = c.ReadMessage()
		})
		drv := newDriver(t, reference.Options{URL: url, Heartbeat: time.Second})
		s, err := drv.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		r := stampRecorder{got: make(chan stamped, len(msgs))}
		done := make(chan error, 1)
		go func() { done <- s.Serve(r) }()
		for i, want := range []string{"direct", "group", "split"} {
			var d stamped
			select {
			case d = <-r.got:
			case <-time.After(5 * time.Second):
				t.Fatalf("delivery %d (%s) did not come", i, want)
			}
			before := <-sent
			if d.body != want || d.at == 0 || d.at > d.now || d.at < before {
				t.Errorf("delivery %d = %q at %d (OnDelivery at %d), want %q at or after %d, the server's write, and at most OnDelivery's time",
					i, d.body, d.at, d.now, want, before)
			}
		}
		_ = s.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after Close")
		}
	})
}
