package centrifugo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/memnet"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// These tests run the driver against a fake Centrifugo: an HTTP server on
// an in-memory network (memnet) with a real WebSocket upgrader that speaks the protocol from a script,
// with frames shaped like those captured from Centrifugo v6.9.1.

var testSecret = []byte("unit-test-secret")

// command is a client command as the fake decodes it, with encoding/json:
// the driver's hand-built JSON is checked by an independent decoder.
type command struct {
	ID      uint32 `json:"id"`
	Connect *struct {
		Token string `json:"token"`
		Name  string `json:"name"`
	} `json:"connect"`
	Subscribe *struct {
		Channel     string `json:"channel"`
		Positioned  bool   `json:"positioned"`
		Recoverable bool   `json:"recoverable"`
		Recover     bool   `json:"recover"`
		Offset      uint64 `json:"offset"`
		Epoch       string `json:"epoch"`
	} `json:"subscribe"`
	Publish *struct {
		Channel string          `json:"channel"`
		Data    json.RawMessage `json:"data"`
	} `json:"publish"`
	Refresh *struct {
		Token string `json:"token"`
	} `json:"refresh"`
	History *struct {
		Channel string `json:"channel"`
		Limit   int    `json:"limit"`
		Since   *struct {
			Offset uint64 `json:"offset"`
			Epoch  string `json:"epoch"`
		} `json:"since"`
	} `json:"history"`
	raw string
}

// fakeConn is the server side of one connection.
type fakeConn struct {
	t       *testing.T
	c       *websocket.Conn
	pending []command
}

// read returns the next command, reading a frame when none is pending: a
// frame may hold several commands, one per line.
func (fc *fakeConn) read() (command, error) {
	for len(fc.pending) == 0 {
		_ = fc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, b, err := fc.c.ReadMessage()
		if err != nil {
			return command{}, err
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			var cmd command
			if err := json.Unmarshal(line, &cmd); err != nil {
				return command{}, fmt.Errorf("command %q: %w", line, err)
			}
			cmd.raw = string(line)
			fc.pending = append(fc.pending, cmd)
		}
	}
	cmd := fc.pending[0]
	fc.pending = fc.pending[1:]
	return cmd, nil
}

func (fc *fakeConn) send(s string) {
	if err := fc.c.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		fc.t.Errorf("fake server write: %v", err)
	}
}

func (fc *fakeConn) close(code int, text string) {
	_ = fc.c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

// drain reads until the client goes away.
func (fc *fakeConn) drain() {
	for {
		if _, _, err := fc.c.ReadMessage(); err != nil {
			return
		}
	}
}

// acceptConnect reads the connect command, checks its token and replies
// with reply (a connect result). It returns the token's claims.
func (fc *fakeConn) acceptConnect(reply string) *jwt.RegisteredClaims {
	cmd, err := fc.read()
	if err != nil || cmd.Connect == nil {
		fc.t.Errorf("fake server: first command = %q, %v; want connect", cmd.raw, err)
		return nil
	}
	var claims jwt.RegisteredClaims
	_, err = jwt.ParseWithClaims(cmd.Connect.Token, &claims, func(*jwt.Token) (any, error) { return testSecret, nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired())
	if err != nil {
		fc.t.Errorf("fake server: connect token: %v", err)
	}
	if cmd.Connect.Name != "imcanary" {
		fc.t.Errorf("connect name = %q, want imcanary", cmd.Connect.Name)
	}
	fc.send(fmt.Sprintf(`{"id":%d,"connect":%s}`, cmd.ID, reply))
	return &claims
}

const connectOK = `{"client":"c1","version":"6.9.1 OSS","expires":true,"ttl":3600,"ping":25,"pong":true}`

// subscribes reads the subscribe commands (all in the frame after the
// connect reply) and answers each with reply(cmd), a subscribe result or
// error; want is how many.
func (fc *fakeConn) subscribes(want int, reply func(command) string) []command {
	var cmds []command
	for range want {
		cmd, err := fc.read()
		if err != nil || cmd.Subscribe == nil {
			fc.t.Errorf("fake server: command = %q, %v; want subscribe", cmd.raw, err)
			return cmds
		}
		cmds = append(cmds, cmd)
	}
	var replies []string
	for _, cmd := range cmds {
		replies = append(replies, fmt.Sprintf(`{"id":%d,%s}`, cmd.ID, reply(cmd)))
	}
	fc.send(strings.Join(replies, "\n"))
	return cmds
}

// positioned answers every subscribe as Centrifugo does in a namespace
// with history: the stream's epoch and offset.
func positioned(epoch string, offset uint64) func(command) string {
	return func(command) string {
		return fmt.Sprintf(`"subscribe":{"epoch":%q,"offset":%d,"positioned":true}`, epoch, offset)
	}
}

// startFake serves script on every connection.
func startFake(t *testing.T, script func(fc *fakeConn)) string {
	t.Helper()
	up := websocket.Upgrader{}
	return fakes.Start(t, "ws", "/connection/websocket", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		script(&fakeConn{t: t, c: c})
	}))
}

// fakes are the running fake servers, for newTestDriver to dial in memory
// in place of TCP: a test that runs in a synctest bubble then has the
// fake's pacing and the driver's timers on the bubble's clock.
var fakes memnet.Fakes

// startFakeNth is startFake for a script that plays each connection
// differently: n is the connection's number, from 1.
func startFakeNth(t *testing.T, script func(fc *fakeConn, n int)) string {
	t.Helper()
	var conns atomic.Int64
	return startFake(t, func(fc *fakeConn) { script(fc, int(conns.Add(1))) })
}

// testPlan gives u1 the channels chat:g1 and dm:#u1,u2.
var testPlan = probe.Plan{
	Users:  []string{"u1", "u2", "u3"},
	Groups: []probe.Group{{Name: "g1", Members: []string{"u1", "u2", "u3"}}},
	Direct: []probe.Pair{{From: "u1", To: "u2"}, {From: "u2", To: "u1"}},
}

// testDevice returns device 0 of a user, with a Catchup of a short grace
// if catchUp: reused across Connects, it is one device logging in again.
func testDevice(catchUp bool) probe.Device {
	if !catchUp {
		return probe.Device{}
	}
	return probe.Device{Catchup: probe.NewCatchup(20 * time.Millisecond)}
}

func newTestDriver(t *testing.T, url string, mod func(*Options)) *Driver {
	t.Helper()
	o := Options{URL: url, Secret: testSecret, Heartbeat: time.Second, DialTimeout: 3 * time.Second}
	if mod != nil {
		mod(&o)
	}
	d, err := New(Config{TokenTTL: time.Hour}, o)
	if err != nil {
		t.Fatal(err)
	}
	if dial, ok := fakes.Dial(url); ok {
		d.conn.Dial = dial
	}
	if err := d.Provision(context.Background(), testPlan); err != nil {
		t.Fatal(err)
	}
	return d
}

// delivered is a Delivery copied out of the read buffer.
type delivered struct {
	from  string
	group bool
	body  string
	seq   uint64
}

// recorder is a Handler that keeps what it is given.
type recorder struct {
	mu         sync.Mutex
	acks       []uint64
	rejects    map[uint64]string
	deliveries []delivered
	// ats holds each delivery's At, and badAt the deliveries whose At
	// was unset or later than their OnDelivery.
	ats   []int64
	badAt []string
	// recovered holds each delivery's Recovered.
	recovered []bool
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) {
	r.mu.Lock()
	r.acks = append(r.acks, ref)
	r.mu.Unlock()
}

func (r *recorder) OnReject(ref uint64, reason string) {
	r.mu.Lock()
	if r.rejects == nil {
		r.rejects = map[uint64]string{}
	}
	r.rejects[ref] = reason
	r.mu.Unlock()
}

func (r *recorder) OnDelivery(d *probe.Delivery) {
	r.mu.Lock()
	r.deliveries = append(r.deliveries, delivered{string(d.From), d.Group, string(d.Body), d.ServerSeq})
	r.ats = append(r.ats, d.At)
	r.recovered = append(r.recovered, d.Recovered)
	if now := time.Now().UnixNano(); d.At == 0 || d.At > now {
		r.badAt = append(r.badAt, fmt.Sprintf("%q: At %d, OnDelivery at %d", d.Body, d.At, now))
	}
	r.mu.Unlock()
}

// stamps returns each delivery's At so far, after checking every one was
// set and no later than its OnDelivery.
func (r *recorder) stamps(t *testing.T) []int64 {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.badAt {
		t.Errorf("delivery %s: want At set and at most the time of OnDelivery", b)
	}
	return append([]int64(nil), r.ats...)
}

// fetched returns each delivery's Recovered so far.
func (r *recorder) fetched() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.recovered...)
}

func (r *recorder) got() []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivered(nil), r.deliveries...)
}

// serve runs s.Serve(h) and returns its result, failing after 5 s.
func serve(t *testing.T, s probe.Session, h probe.Handler) *probe.Disconnect {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Serve(h) }()
	select {
	case err := <-done:
		var d *probe.Disconnect
		if !errors.As(err, &d) {
			t.Fatalf("Serve() = %v, want a *probe.Disconnect", err)
		}
		if r, ok := h.(*recorder); ok {
			r.stamps(t)
		}
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	return nil
}

// TestConnectFlow runs the whole exchange once: connect with a valid
// token, one subscribe per channel, a batched frame of pushes and a ping,
// the pong, and the server's slow-consumer close.
func TestConnectFlow(t *testing.T) {
	pong := make(chan string, 1)
	claimsC := make(chan *jwt.RegisteredClaims, 1)
	subsC := make(chan []command, 1)
	sentAt := make(chan int64, 1)
	url := startFake(t, func(fc *fakeConn) {
		claimsC <- fc.acceptConnect(connectOK)
		subsC <- fc.subscribes(2, positioned("EP", 7))
		sentAt <- time.Now().UnixNano()
		fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 from u2"},"info":{"user":"u2","client":"x"},"offset":8}}}` + "\n" +
			`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 own"},"info":{"user":"u1","client":"c1"},"offset":9}}}` + "\n" +
			`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 sibling"},"info":{"user":"u1","client":"y"},"offset":10}}}` + "\n" +
			`{"push":{"channel":"dm:#u1,u2","pub":{"data":{"b":"esc \"q\" \\ \u00e9 \n"},"info":{"user":"u2"},"offset":8}}}` + "\n" +
			`{"push":{"channel":"chat:g1","join":{"info":{"user":"u3"}}}}` + "\n" +
			`{}`)
		cmd, err := fc.read()
		if err != nil {
			t.Errorf("reading pong: %v", err)
		}
		pong <- cmd.raw
		fc.close(CloseSlow, "slow")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	start := time.Now()
	s, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	claims, subs := <-claimsC, <-subsC
	if claims == nil || claims.Subject != "u1" {
		t.Errorf("token claims = %+v, want sub u1", claims)
	} else if exp := claims.ExpiresAt.Time; exp.Before(start.Add(59*time.Minute)) || exp.After(start.Add(61*time.Minute)) {
		t.Errorf("token exp = %v, want about an hour after %v", exp, start)
	}
	var chans []string
	for _, c := range subs {
		chans = append(chans, c.Subscribe.Channel)
		if !c.Subscribe.Positioned || c.Subscribe.Recover || c.Subscribe.Recoverable {
			t.Errorf("subscribe %s = %s, want positioned only (Recover off)", c.Subscribe.Channel, c.raw)
		}
	}
	if got := strings.Join(chans, " "); got != "chat:g1 dm:#u1,u2" {
		t.Errorf("subscribed to %q, want %q", got, "chat:g1 dm:#u1,u2")
	}
	var rec recorder
	disc := serve(t, s, &rec)
	want := []delivered{
		{"u2", true, "imc1 from u2", 8},
		{"u1", true, "imc1 sibling", 10},
		{"u2", false, "esc \"q\" \\ é \n", 8},
	}
	if got := rec.got(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("deliveries = %+v, want %+v (this connection's own publication skipped, the user's other device's delivered)", got, want)
	}
	// One frame, one read: every publication shares its stamp.
	if ats, sent := rec.stamps(t), <-sentAt; len(ats) != 3 || ats[0] != ats[1] || ats[1] != ats[2] || ats[0] < sent {
		t.Errorf("delivery At = %v, want three equal stamps, at or after the server's write at %d", ats, sent)
	}
	select {
	case p := <-pong:
		if p != "{}" {
			t.Errorf("answer to the server's ping = %q, want {}", p)
		}
	default:
		t.Error("no pong")
	}
	if disc.Reason != metrics.ReasonSlowConsumer || disc.Code != CloseSlow {
		t.Errorf("Serve() = %v, want slow_consumer with code 3008", disc)
	}
	if st := d.ServerStats(); st != (ServerStats{}) {
		t.Errorf("ServerStats() = %+v with contiguous offsets, want zero", st)
	}
}

// TestSendAckReject checks publishes carry the body as data.b on the right
// channel, and that replies are matched to refs by id.
func TestSendAckReject(t *testing.T) {
	type pubCmd struct {
		channel string
		data    map[string]any
	}
	got := make(chan pubCmd, 4)
	url := startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		fc.subscribes(2, positioned("EP", 0))
		for i := range 3 {
			cmd, err := fc.read()
			if err != nil || cmd.Publish == nil {
				t.Errorf("command = %q, %v; want publish", cmd.raw, err)
				return
			}
			var data map[string]any
			if err := json.Unmarshal(cmd.Publish.Data, &data); err != nil {
				t.Errorf("publish data %s: %v", cmd.Publish.Data, err)
			}
			got <- pubCmd{cmd.Publish.Channel, data}
			if i == 1 {
				fc.send(fmt.Sprintf(`{"id":%d,"error":{"code":103,"message":"permission denied"}}`, cmd.ID))
			} else {
				fc.send(fmt.Sprintf(`{"id":%d,"publish":{}}`, cmd.ID))
			}
		}
		fc.close(websocket.CloseGoingAway, "shutdown")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	s, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	done := make(chan *probe.Disconnect, 1)
	go func() { done <- serve(t, s, &rec) }()
	msgs := []probe.Message{
		{Ref: 101, Group: "g1", Body: []byte("imc1 group")},
		{Ref: 102, To: "u2", Body: []byte(`imc1 "quoted" \ direct`)},
		{Ref: 103, To: "u0", Body: []byte("imc1 to a lower name")},
	}
	for i := range msgs {
		if err := s.Send(&msgs[i]); err != nil {
			t.Fatalf("Send(%d): %v", msgs[i].Ref, err)
		}
	}
	want := []pubCmd{
		{"chat:g1", map[string]any{"b": "imc1 group"}},
		{"dm:#u1,u2", map[string]any{"b": `imc1 "quoted" \ direct`}},
		{"dm:#u0,u1", map[string]any{"b": "imc1 to a lower name"}},
	}
	for _, w := range want {
		g := <-got
		if fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("publish = %+v, want %+v", g, w)
		}
	}
	<-done
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if fmt.Sprint(rec.acks) != "[101 103]" {
		t.Errorf("acks = %v, want [101 103]", rec.acks)
	}
	if r := rec.rejects[102]; r != "103 permission denied" {
		t.Errorf("reject of 102 = %q, want %q", r, "103 permission denied")
	}
}

// TestDisconnectReasons checks each way a session can end is classified:
// imcanary_session_disconnects_total{reason="slow_consumer"} must mean the
// server's slow-reader close and nothing else.
func TestDisconnectReasons(t *testing.T) {
	send := func(frame string) func(fc *fakeConn) {
		return func(fc *fakeConn) { fc.send(frame); fc.drain() }
	}
	closeWith := func(code int, text string) func(fc *fakeConn) {
		return func(fc *fakeConn) { fc.close(code, text); fc.drain() }
	}
	tests := []struct {
		name     string
		server   func(fc *fakeConn)
		ourClose bool
		reason   string
		code     int
		text     string
	}{
		{name: "slow", server: closeWith(3008, "slow"), reason: metrics.ReasonSlowConsumer, code: 3008, text: "slow"},
		{name: "insufficient state", server: closeWith(3010, "insufficient state"), reason: metrics.ReasonServerClose, code: 3010, text: "gap"},
		{name: "shutdown", server: closeWith(3001, "shutdown"), reason: metrics.ReasonServerClose, code: 3001, text: "shutdown"},
		{name: "no pong", server: closeWith(3012, "no pong"), reason: metrics.ReasonServerClose, code: 3012},
		{name: "displaced by the same user", server: closeWith(3504, "connection limit"), reason: metrics.ReasonConflict, code: 3504, text: "logged in elsewhere"},
		{name: "force reconnect", server: closeWith(3011, "force reconnect"), reason: metrics.ReasonServerClose, code: 3011},
		{name: "going away", server: closeWith(websocket.CloseGoingAway, ""), reason: metrics.ReasonServerClose, code: 1001},
		{name: "connection dropped", server: func(fc *fakeConn) { fc.c.NetConn().Close() }, reason: metrics.ReasonError},
		{name: "disconnect push slow", server: send(`{"push":{"disconnect":{"code":3008,"reason":"slow","reconnect":true}}}`),
			reason: metrics.ReasonSlowConsumer, code: 3008},
		{name: "disconnect push in a batch", server: send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"x"},"offset":1}}}` + "\n" +
			`{"push":{"disconnect":{"code":3010,"reason":"insufficient state"}}}`),
			reason: metrics.ReasonServerClose, code: 3010, text: "gap"},
		{name: "final unsubscribe", server: send(`{"push":{"channel":"chat:g1","unsubscribe":{"code":2000,"reason":"server unsubscribe"}}}`),
			reason: metrics.ReasonServerClose, text: "unsubscribed from chat:g1"},
		{name: "malformed frame", server: send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"x"}}`), reason: metrics.ReasonError, text: "malformed frame"},
		{name: "malformed second message", server: send(`{}` + "\n" + `{"id":1,`), reason: metrics.ReasonError, text: "malformed frame"},
		{name: "our shutdown", server: func(fc *fakeConn) { fc.drain() }, ourClose: true, reason: metrics.ReasonShutdown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				url := startFake(t, func(fc *fakeConn) {
					fc.acceptConnect(connectOK)
					fc.subscribes(2, positioned("EP", 0))
					tt.server(fc)
				})
				d := newTestDriver(t, url, nil)
				s, err := d.Connect(context.Background(), "u1", probe.Device{})
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				if tt.ourClose {
					go func() { time.Sleep(50 * time.Millisecond); _ = s.Close() }()
				}
				disc := serve(t, s, &recorder{})
				if disc.Reason != tt.reason || disc.Code != tt.code || !strings.Contains(disc.Error(), tt.text) {
					t.Errorf("Serve() = %v (reason %q, code %d), want reason %q, code %d, text containing %q",
						disc, disc.Reason, disc.Code, tt.reason, tt.code, tt.text)
				}
				if tt.code == CloseInsufficientState && d.ServerGaps() != 1 {
					t.Errorf("ServerGaps() = %d after insufficient state, want 1", d.ServerGaps())
				}
			})
		})
	}
}

// TestMalformedFrameClosesSession checks the server is told why: a close
// frame with 1003, and nothing of the frame delivered.
func TestMalformedFrameClosesSession(t *testing.T) {
	closed := make(chan int, 1)
	url := startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		fc.subscribes(2, positioned("EP", 0))
		fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 ok"},"offset":1}}}` + "\n" + `{"push":nope}`)
		_, _, err := fc.c.ReadMessage()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			closed <- ce.Code
		}
		close(closed)
	})
	d := newTestDriver(t, url, nil)
	s, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	disc := serve(t, s, &rec)
	if disc.Reason != metrics.ReasonError || !strings.Contains(disc.Error(), "malformed frame from server") {
		t.Errorf("Serve() = %v, want an error naming the malformed frame", disc)
	}
	if code := <-closed; code != websocket.CloseUnsupportedData {
		t.Errorf("server saw close code %d, want %d", code, websocket.CloseUnsupportedData)
	}
	// The valid message before the bad one was handled: the frame is
	// processed message by message.
	if got := rec.got(); len(got) != 1 {
		t.Errorf("deliveries = %+v, want the one valid message", got)
	}
}

// TestConnectErrors checks a failed connect names what failed.
func TestConnectErrors(t *testing.T) {
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	tests := []struct {
		name, url, want string
	}{
		{"nothing listening", "ws://127.0.0.1:1/connection/websocket", "dial ws://127.0.0.1:1/connection/websocket"},
		{"not a websocket endpoint", "ws" + strings.TrimPrefix(notFound.URL, "http") + "/connection/websocket", "HTTP 404"},
		{"malformed connect reply", startFake(t, func(fc *fakeConn) {
			cmd, _ := fc.read()
			fc.send(fmt.Sprintf(`{"id":%d,"connect":{"client":`, cmd.ID))
			fc.drain()
		}), "malformed frame from server"},
		{"connect error", startFake(t, func(fc *fakeConn) {
			cmd, _ := fc.read()
			fc.send(fmt.Sprintf(`{"id":%d,"error":{"code":109,"message":"token expired"}}`, cmd.ID))
			fc.drain()
		}), "connect refused: 109 token expired"},
		{"invalid token close", startFake(t, func(fc *fakeConn) {
			_, _ = fc.read()
			fc.close(3500, "invalid token")
			fc.drain()
		}), `server closed the connection: 3500 "invalid token"`},
		{"user connection limit", startFake(t, func(fc *fakeConn) {
			_, _ = fc.read()
			fc.close(3504, "connection limit")
			fc.drain()
		}), `3504 "connection limit": the user has as many connections as client.user_connection_limit allows`},
		{"subscribe refused", startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			fc.subscribes(2, func(cmd command) string {
				if strings.HasPrefix(cmd.Subscribe.Channel, "dm:") {
					return `"error":{"code":103,"message":"permission denied"}`
				}
				return `"subscribe":{}`
			})
			fc.drain()
		}), "subscribe dm:#u1,u2 refused: 103 permission denied"},
	}
	tests = append(tests, struct{ name, url, want string }{"flood during login", startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		// Publications before the subscriptions are confirmed are kept
		// for Serve, but not without bound.
		pad := strings.Repeat("x", 2000)
		for i := range 20 {
			// The client hangs up part way: that is the point.
			msg := fmt.Sprintf(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"%s"},"offset":%d}}}`, pad, i+1)
			if fc.c.WriteMessage(websocket.TextMessage, []byte(msg)) != nil {
				return
			}
		}
		fc.drain()
	}), "too much traffic during login"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, tt.url, func(o *Options) { o.DialTimeout = 2 * time.Second; o.MaxFrame = 4096 })
			if _, err := d.Connect(context.Background(), "u1", probe.Device{}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Connect() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestConnectTimeout: a server that accepts the WebSocket and never
// answers must not hold a login past DialTimeout.
func TestConnectTimeout(t *testing.T) {
	url := startFake(t, func(fc *fakeConn) { fc.drain() })
	d := newTestDriver(t, url, func(o *Options) { o.DialTimeout = 300 * time.Millisecond })
	start := time.Now()
	_, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err == nil {
		t.Fatal("Connect() = nil against a silent server")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Connect took %v with DialTimeout 300ms", took)
	}
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		c    Config
		o    Options
		want string
	}{
		{Config{}, Options{Secret: testSecret}, "no url"},
		{Config{}, Options{URL: "ws://x"}, "no token secret"},
		{Config{GroupNamespace: "a:b"}, Options{URL: "ws://x", Secret: testSecret}, `namespace "a:b"`},
		{Config{GroupNamespace: "dm"}, Options{URL: "ws://x", Secret: testSecret}, "both"},
		{Config{TokenTTL: time.Second}, Options{URL: "ws://x", Secret: testSecret}, "token ttl"},
	}
	for _, tt := range tests {
		if _, err := New(tt.c, tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v, %+v) = %v, want an error containing %q", tt.c, tt.o, err, tt.want)
		}
	}
	d, err := New(Config{}, Options{URL: "ws://x", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.DirectChannel("bob", "alice"); got != "dm:#alice,bob" {
		t.Errorf("DirectChannel(bob, alice) = %q, want dm:#alice,bob", got)
	}
	if err := d.Provision(context.Background(), probe.Plan{Direct: []probe.Pair{{From: "a,b", To: "c"}}}); err == nil {
		t.Error("Provision accepted a user name with ',' in a user-limited channel")
	}
}

// TestProvisionChannels checks who subscribes to what: both ends of a
// direct pair, every member of a group, and a re-provision replaces a
// user's channels rather than adding to them.
func TestProvisionChannels(t *testing.T) {
	d, err := New(Config{}, Options{URL: "ws://x", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	plan := probe.Plan{
		Users:  []string{"a", "b", "c"},
		Groups: []probe.Group{{Name: "g", Members: []string{"a", "b", "c"}}},
		Direct: []probe.Pair{{From: "a", To: "b"}, {From: "b", To: "a"}, {From: "c", To: "b"}},
	}
	for range 2 {
		if err := d.Provision(context.Background(), plan); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"a": "chat:g dm:#a,b",
		"b": "chat:g dm:#a,b dm:#b,c",
		"c": "chat:g dm:#b,c",
	}
	for u, w := range want {
		if got := strings.Join(d.chans.Of(u), " "); got != w {
			t.Errorf("channels of %s = %q, want %q", u, got, w)
		}
	}
	if err := d.Provision(context.Background(), probe.Plan{Users: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if got := d.chans.Of("a"); len(got) != 0 {
		t.Errorf("channels of a after a plan without its groups = %v, want none", got)
	}
}

// TestWriteTimeoutEndsSession: a server that stops reading makes a write
// time out. The session must end (so the user reconnects) rather than stay
// online, reading, with a connection that can never send again.
func TestWriteTimeoutEndsSession(t *testing.T) {
	release := make(chan struct{})
	url := startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		fc.subscribes(2, positioned("EP", 0))
		// Never read again; hold the connection until the test is over
		// (cleanups run last first: before the server's close).
		<-release
	})
	t.Cleanup(func() { close(release) })
	d := newTestDriver(t, url, func(o *Options) { o.WriteTimeout = 200 * time.Millisecond })
	s, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(&recorder{}) }()
	big := bytes.Repeat([]byte("x"), 60<<10)
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
}
