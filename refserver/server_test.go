package refserver

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/testwait"
)

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string // substring of the error; "" for none
	}{
		{"zero", Options{}, ""},
		{"drop above one", Options{Faults: Faults{Drop: 1.5}}, "Options.Faults.Drop = 1.5"},
		{"negative duplicate", Options{Faults: Faults{Duplicate: -0.1}}, "Options.Faults.Duplicate"},
		{"NaN reorder", Options{Faults: Faults{Reorder: math.NaN()}}, "Options.Faults.Reorder"},
		{"negative delay", Options{Faults: Faults{Delay: -time.Second}}, "Options.Faults.Delay"},
		{"negative jitter", Options{Faults: Faults{Jitter: -time.Second}}, "Options.Faults.Jitter"},
		{"negative send queue", Options{SendQueue: -1}, "Options.SendQueue = -1"},
		{"negative offline queue", Options{OfflineQueue: -1}, "Options.OfflineQueue = -1"},
		{"negative idle timeout", Options{IdleTimeout: -1}, "Options.IdleTimeout"},
		{"negative max frame", Options{MaxFrame: -1}, "Options.MaxFrame = -1"},
		{"drop push above one", Options{Faults: Faults{DropPush: 2}}, "Options.Faults.DropPush = 2"},
		{"NaN skip device", Options{Faults: Faults{SkipDevice: math.NaN()}}, "Options.Faults.SkipDevice"},
		{"negative max devices", Options{MaxDevices: -1}, "Options.MaxDevices = -1"},
		{"unknown device policy", Options{DevicePolicy: "newest"}, `Options.DevicePolicy = "newest"`},
		{"negative history bytes", Options{HistoryBytes: -1}, "Options.HistoryBytes = -1"},
		{"negative history limit disables history", Options{HistoryLimit: -1}, ""},
		{"refuse policy", Options{MaxDevices: 1, DevicePolicy: DevicePolicyRefuse}, ""},
		{"probabilities at the bounds", Options{Faults: Faults{Drop: 1, Duplicate: 0, Reorder: 1}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.opts)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New(%+v) = %v, want no error", tt.opts, err)
			case tt.want == "":
				s.Close()
			case err == nil:
				t.Fatalf("New(%+v) = nil error, want one containing %q", tt.opts, tt.want)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("New(%+v) = %v, want an error containing %q", tt.opts, err, tt.want)
			}
		})
	}
}

func TestToken(t *testing.T) {
	// RFC 4231-style known answer (the classic "quick brown fox" vector).
	got := Token([]byte("key"), "The quick brown fox jumps over the lazy dog")
	want := "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
	if got != want {
		t.Errorf("Token(%q, fox) = %q, want %q", "key", got, want)
	}
}

func TestHealthz(t *testing.T) {
	_, url := startServer(t, Options{})
	resp, err := http.Get("http" + strings.TrimSuffix(strings.TrimPrefix(url, "ws"), "/ws") + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("GET /healthz = %d %q, want 200 %q", resp.StatusCode, body, "ok\n")
	}
}

func TestLogin(t *testing.T) {
	secret := []byte("s3cret")
	tests := []struct {
		name        string
		secret      []byte
		user, token string
		wantCode    int // 0: login_ok
	}{
		{"good token", secret, "u1", Token(secret, "u1"), 0},
		{"token of another user", secret, "u1", Token(secret, "u2"), CloseUnauthorized},
		{"uppercase token", secret, "u1", strings.ToUpper(Token(secret, "u1")), CloseUnauthorized},
		{"empty token", secret, "u1", "", CloseUnauthorized},
		{"no secret accepts any token", nil, "u1", "anything", 0},
		{"no secret still needs a token", nil, "u1", "", CloseUnauthorized},
		{"missing user", nil, "", "x", CloseUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, Options{Secret: tt.secret})
			c := dialWS(t, url)
			c.write(map[string]any{"type": "login", "user": tt.user, "token": tt.token})
			if tt.wantCode == 0 {
				c.readType("login_ok")
				c.roundTrip()
				if got := s.Stats().Logins; got != 1 {
					t.Errorf("Stats().Logins = %d, want 1", got)
				}
				return
			}
			if code, text := c.readClose(); code != tt.wantCode {
				t.Errorf("login(%q, %q): close %d %q, want %d", tt.user, tt.token, code, text, tt.wantCode)
			}
		})
	}
}

func TestDirectMessage(t *testing.T) {
	s, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	bodies := []string{"one", `two "quoted"`, "three\n\u2028ü"}
	var acks []frame
	for _, b := range bodies {
		id := u1.sendTo("u2", b)
		a := u1.readType("ack")
		if a.ID != id {
			t.Fatalf("ack id = %q, want %q", a.ID, id)
		}
		acks = append(acks, a)
	}
	for i, a := range acks {
		if a.Seq != uint64(i+1) || a.Conv != "d:u1:u2" || a.MsgID == "" {
			t.Errorf("ack %d = %s, want seq %d in conv d:u1:u2 with a msg_id", i, a.raw, i+1)
		}
		m := u2.readType("msg")
		if m.Seq != a.Seq || m.MsgID != a.MsgID || m.Body != bodies[i] || m.From != "u1" || m.To != "u2" || m.Conv != a.Conv {
			t.Errorf("delivery %d = %s, want seq %d msg_id %s body %q from u1 to u2", i, m.raw, a.Seq, a.MsgID, bodies[i])
		}
	}
	// The reply continues the same conversation.
	u2.sendTo("u1", "back")
	if a := u2.readType("ack"); a.Seq != 4 || a.Conv != "d:u1:u2" {
		t.Errorf("reply ack = %s, want seq 4 in d:u1:u2", a.raw)
	}
	if m := u1.readType("msg"); m.Seq != 4 || m.From != "u2" {
		t.Errorf("reply delivery = %s, want seq 4 from u2", m.raw)
	}
	if st := s.Stats(); st.Sent != 4 || st.Deliveries != 4 {
		t.Errorf("Stats() = %+v, want Sent 4, Deliveries 4", st)
	}
}

func TestGroupMessage(t *testing.T) {
	s, url := startServer(t, Options{})
	members := []string{"u1", "u2", "u3", "u4"}
	cs := make(map[string]*client)
	for _, m := range members {
		cs[m] = login(t, url, m, "t")
	}
	u1 := cs["u1"]
	for range 2 { // the same members again is a no-op
		id := u1.write(map[string]any{"type": "group", "group": "g1", "members": members})
		if f := u1.readType("ok"); f.ID != id {
			t.Fatalf("group ok id = %q, want %q", f.ID, id)
		}
	}
	for i := range 2 {
		u1.sendGroup("g1", "hello")
		a := u1.readType("ack")
		if a.Conv != "g:g1" || a.Seq != uint64(i+1) {
			t.Errorf("ack = %s, want seq %d in g:g1", a.raw, i+1)
		}
		var first []byte
		for _, m := range members[1:] {
			f := cs[m].readType("msg")
			if f.From != "u1" || f.Group != "g1" || f.Seq != a.Seq || f.MsgID != a.MsgID || f.Body != "hello" {
				t.Errorf("%s got %s, want the group message of ack %s", m, f.raw, a.raw)
			}
			if first == nil {
				first = f.raw
			} else if !bytes.Equal(f.raw, first) {
				t.Errorf("%s got %s, want the same bytes as %s", m, f.raw, first)
			}
		}
	}
	u1.roundTrip() // the sender did not get its own message
	if st := s.Stats(); st.Deliveries != 6 {
		t.Errorf("Stats().Deliveries = %d, want 6", st.Deliveries)
	}

	outsider := login(t, url, "u5", "t")
	for _, g := range []string{"g1", "nosuchgroup"} {
		id := outsider.sendGroup(g, "let me in")
		if f := outsider.readType("error"); f.Code != "not_member" || f.ID != id {
			t.Errorf("send to %q by a non-member = %s, want not_member error with id %q", g, f.raw, id)
		}
	}
	outsider.roundTrip() // still connected
}

func TestOfflineQueue(t *testing.T) {
	tests := []struct {
		name        string
		bound, sent int
		wantSeqs    []uint64
	}{
		{"within bound", 10, 5, []uint64{1, 2, 3, 4, 5}},
		{"oldest dropped beyond bound", 3, 5, []uint64{3, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, Options{OfflineQueue: tt.bound})
			u1 := login(t, url, "u1", "t")
			for range tt.sent {
				u1.sendTo("u2", "while you were out")
				u1.readType("ack")
			}
			u2 := login(t, url, "u2", "t")
			for _, want := range tt.wantSeqs {
				if f := u2.readType("msg"); f.Seq != want {
					t.Errorf("offline delivery seq = %d, want %d", f.Seq, want)
				}
			}
			// Live deliveries come after the backlog.
			u1.sendTo("u2", "now live")
			u1.readType("ack")
			if f := u2.readType("msg"); f.Seq != uint64(tt.sent+1) {
				t.Errorf("live delivery seq = %d, want %d", f.Seq, tt.sent+1)
			}
			st := s.Stats()
			wantDropped := uint64(tt.sent - len(tt.wantSeqs))
			if st.OfflineQueued != uint64(tt.sent) || st.OfflineDropped != wantDropped {
				t.Errorf("Stats() = %+v, want OfflineQueued %d, OfflineDropped %d", st, tt.sent, wantDropped)
			}
		})
	}
}

func TestSlowConsumer(t *testing.T) { bothModes(t, testSlowConsumer) }

func testSlowConsumer(t *testing.T, noReactor bool) {
	s, url := startServer(t, Options{SendQueue: 8, NoReactor: noReactor})
	// The victim never reads until it has been kicked. (Shrinking its
	// receive buffer would make the kick come sooner, but a window below
	// the loopback MSS stalls TCP on the persist timer afterwards.)
	victim := login(t, url, "victim", "t")
	ws := victim.ws

	sender := login(t, url, "sender", "t")
	bystander := login(t, url, "bystander", "t")
	body := strings.Repeat("x", 32<<10)
	for i := 0; s.Stats().SlowConsumerKicks == 0; i++ {
		if i == 10000 {
			t.Fatalf("no slow-consumer kick after %d messages: %+v", i, s.Stats())
		}
		sender.sendTo("victim", body)
		sender.readType("ack") // the sender keeps up, so only the victim is slow
	}

	n := 0
	code, text, err := func() (int, string, error) {
		ws.SetReadDeadline(time.Now().Add(ioTimeout))
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				if ce, ok := err.(*websocket.CloseError); ok {
					return ce.Code, ce.Text, nil
				}
				return 0, "", err
			}
			n++
		}
	}()
	if err != nil || code != CloseSlowConsumer {
		t.Fatalf("victim after %d frames: close %d %q (err %v), want %d", n, code, text, err, CloseSlowConsumer)
	}
	if n > 1000 {
		t.Errorf("victim drained %d frames before the close, want the queue bounded", n)
	}

	// Everyone else is unaffected.
	sender.sendTo("bystander", "still here")
	sender.readType("ack")
	if f := bystander.readType("msg"); f.Body != "still here" {
		t.Errorf("bystander got %s, want body %q", f.raw, "still here")
	}
	if got := s.Stats().SlowConsumerKicks; got != 1 {
		t.Errorf("Stats().SlowConsumerKicks = %d, want 1", got)
	}
	// What the victim missed after the kick waits for its next login.
	testwait.For(t, ioTimeout, "the victim to be gone", func() bool { return s.Stats().Connections == 2 })
	if s.Stats().OfflineQueued == 0 {
		t.Errorf("Stats().OfflineQueued = 0, want the overflowing delivery kept offline")
	}
}

func TestMalformed(t *testing.T) {
	tests := []struct {
		name     string
		login    bool
		mt       int
		frame    string
		wantText string
	}{
		{"not JSON", true, websocket.TextMessage, `{"type":`, "malformed JSON"},
		{"wrong field type", true, websocket.TextMessage, `{"type":"ping","id":5}`, "malformed JSON"},
		{"unknown type", true, websocket.TextMessage, `{"type":"nope","id":"1"}`, `unknown frame type "nope"`},
		{"missing type", true, websocket.TextMessage, `{"id":"1"}`, `missing frame "type"`},
		{"first frame not login", false, websocket.TextMessage, `{"type":"ping","id":"1"}`, "first frame must be login"},
		{"second login", true, websocket.TextMessage, `{"type":"login","id":"1","user":"u1","token":"t"}`, "already logged in"},
		{"too large", true, websocket.TextMessage, `{"type":"ping","id":"` + strings.Repeat("x", 2000) + `"}`, "frame too large: limit 1024 bytes"},
		{"binary", true, websocket.BinaryMessage, `{"type":"ping","id":"1"}`, "binary frames"},
		{"send without recipient", true, websocket.TextMessage, `{"type":"send","id":"1","body":"x"}`, "exactly one of"},
		{"send to both", true, websocket.TextMessage, `{"type":"send","id":"1","to":"u2","group":"g","body":"x"}`, "exactly one of"},
		{"body not a string", true, websocket.TextMessage, `{"type":"send","id":"1","to":"u2","body":5}`, "body must be a JSON string"},
		{"group without name", true, websocket.TextMessage, `{"type":"group","id":"1","members":["u1"]}`, "missing \"group\""},
		{"history without conv", true, websocket.TextMessage, `{"type":"history","id":"1","after":3}`, `history: missing "conv"`},
		{"history with a negative limit", true, websocket.TextMessage, `{"type":"history","id":"1","conv":"g:g","limit":-1}`, "history: limit -1 is negative"},
		{"history with a negative after", true, websocket.TextMessage, `{"type":"history","id":"1","conv":"g:g","after":-1}`, "malformed JSON"},
		{"history with a fractional limit", true, websocket.TextMessage, `{"type":"history","id":"1","conv":"g:g","limit":1.5}`, "malformed JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, url := startServer(t, Options{MaxFrame: 1024})
			var c *client
			if tt.login {
				c = login(t, url, "u1", "t")
			} else {
				c = dialWS(t, url)
			}
			c.writeRaw(tt.mt, []byte(tt.frame))
			code, text := c.readClose()
			if code != websocket.ClosePolicyViolation || !strings.Contains(text, tt.wantText) {
				t.Errorf("frame %.40q: close %d %q, want %d containing %q", tt.frame, code, text, websocket.ClosePolicyViolation, tt.wantText)
			}
		})
	}
}

func TestIdleTimeout(t *testing.T) { bothModes(t, testIdleTimeout) }

func testIdleTimeout(t *testing.T, noReactor bool) {
	_, url := startServer(t, Options{IdleTimeout: 300 * time.Millisecond, NoReactor: noReactor})
	silent := login(t, url, "silent", "t")
	pinger := login(t, url, "pinger", "t")

	// WebSocket pings alone keep a connection alive past the timeout.
	for range 8 {
		if err := pinger.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(ioTimeout)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := silent.readClose(); code != CloseIdle {
		t.Errorf("silent connection closed with %d, want %d", code, CloseIdle)
	}
	// Pongs answering the pings come first; then the ping frame's pong.
	id := pinger.write(map[string]any{"type": "ping"})
	if f := pinger.read(); f.Type != "pong" || f.ID != id {
		t.Errorf("pinger got %s, want pong %q", f.raw, id)
	}
}

// TestWebSocketPing: every WebSocket ping is answered with a pong that
// echoes its payload, an empty one included (a prober's heartbeat).
func TestWebSocketPing(t *testing.T) {
	bothModes(t, func(t *testing.T, noReactor bool) {
		_, url := startServer(t, Options{NoReactor: noReactor})
		c := login(t, url, "u1", "t")
		for _, payload := range []string{"", "heartbeat", strings.Repeat("p", 125), ""} {
			c.wsPing(payload)
		}
	})
}
