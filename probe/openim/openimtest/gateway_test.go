package openimtest

import (
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/push"
	"github.com/openimsdk/protocol/sdkws"
)

func TestLoginRefused(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "alice", "bob")
	alice := userToken(t, s, admin, "alice", constant.WindowsPlatformID)

	// Refused before the upgrade: HTTP 200 with an errCode body.
	tests := []struct {
		name     string
		id       string
		platform int32
		token    string
		extra    url.Values
		code     int
	}{
		{"no token", "alice", 3, "", nil, codeConnArgs},
		{"platform not a number", "alice", 3, alice, url.Values{"platformID": {"pc"}}, codeConnArgs},
		{"gob", "alice", 3, alice, url.Values{"sdkType": {"go"}}, codeConnArgs},
		{"no sdkType is gob", "alice", 3, alice, url.Values{"sdkType": {""}}, codeConnArgs},
		{"garbage token", "alice", 3, "garbage", url.Values{"isMsgResp": {"false"}}, codeTokenMalformed},
		{"someone else's token", "bob", 3, alice, nil, codeTokenInvalid},
		{"token of another platform", "alice", 5, alice, nil, codeTokenInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, resp, err := tryDial(t, s, tt.id, tt.platform, tt.token, dialOpt{extra: tt.extra})
			if !errors.Is(err, websocket.ErrBadHandshake) || resp == nil {
				t.Fatalf("dial = %v, want a refused handshake", err)
			}
			defer resp.Body.Close()
			var e apiEnvelope
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || json.Unmarshal(b, &e) != nil || e.ErrCode != tt.code {
				t.Errorf("refusal = %d %s, want HTTP 200 with errCode %d", resp.StatusCode, b, tt.code)
			}
		})
	}
	// With isMsgResp=true a bad token is upgraded, told in a text frame,
	// and closed.
	c, _, err := tryDial(t, s, "alice", 3, "garbage", dialOpt{})
	if err != nil {
		t.Fatalf("dial with a garbage token and isMsgResp: %v", err)
	}
	f := c.waitFrame(func(f frame) bool { return f.text != nil })
	var e apiEnvelope
	if json.Unmarshal(f.text, &e) != nil || e.ErrCode != codeTokenMalformed {
		t.Errorf("first frame = %s, want errCode %d", f.text, codeTokenMalformed)
	}
	c.waitEnd()
	if st := s.Stats(); st.RefusedLogins != int64(len(tests))+1 || st.Logins != 0 {
		t.Errorf("stats = %+v, want %d refused, 0 logins", st, len(tests)+1)
	}
}

func TestSamePlatformKick(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "u")
	tok1 := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	old := dial(t, s, "u", constant.WindowsPlatformID, tok1, dialOpt{})
	web := dial(t, s, "u", constant.WebPlatformID, userToken(t, s, admin, "u", constant.WebPlatformID), dialOpt{})

	// The same token again: the old connection is kicked, the token stays
	// valid (InvalidateToken preserves the new connection's own).
	again := dial(t, s, "u", constant.WindowsPlatformID, tok1, dialOpt{})
	old.waitFrame(func(f frame) bool { return f.resp.ReqIdentifier == wsKickOnlineMsg })
	old.waitEnd()
	if _, _, err := s.tokens.parse(tok1); err != nil {
		t.Errorf("token after a same-token relogin: %v, want valid", err)
	}
	// A new token's login kicks again, and the old token with it.
	tok2 := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	fresh := dial(t, s, "u", constant.WindowsPlatformID, tok2, dialOpt{})
	again.waitFrame(func(f frame) bool { return f.resp.ReqIdentifier == wsKickOnlineMsg })
	again.waitEnd()
	_, resp, err := tryDial(t, s, "u", constant.WindowsPlatformID, tok1, dialOpt{noMsgResp: true})
	if err == nil {
		t.Fatal("login with a kicked token succeeded")
	}
	var e apiEnvelope
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if json.Unmarshal(b, &e) != nil || e.ErrCode != codeTokenKicked {
		t.Errorf("login with the kicked token = %s, want errCode %d", b, codeTokenKicked)
	}
	// The Web connection was never touched.
	if r := web.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "u"}, nil); r.ErrCode != 0 {
		t.Errorf("web connection after two Windows kicks: errCode %d", r.ErrCode)
	}
	// Kick, as a new login would.
	s.Kick("u", constant.WindowsPlatformID)
	fresh.waitFrame(func(f frame) bool { return f.resp.ReqIdentifier == wsKickOnlineMsg })
	fresh.waitEnd()
	if _, _, err := s.tokens.parse(tok2); parseError(err).ErrCode != codeTokenKicked {
		t.Errorf("token after Kick: %v, want kicked", err)
	}
	st := waitStats(t, s, "one connection left", func(st Stats) bool { return st.ConnsOpen == 1 })
	if st.Kicks != 3 || st.Logins != 4 {
		t.Errorf("stats = %+v, want 3 kicks, 4 logins", st)
	}
}

// TestConnectionEnds covers what closes a connection: OpenIM closes the
// TCP connection without a close frame, except that gorilla itself
// answers an oversize frame with 1009.
func TestConnectionEnds(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "u")
	tok := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	tests := []struct {
		name  string
		write func(c *client) error
		check func(t *testing.T, err error)
	}{
		{"oversize frame", func(c *client) error {
			return c.writeBinary(make([]byte, maxMessageSize+1))
		}, func(t *testing.T, err error) {
			if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
				t.Errorf("read error %v, want close 1009", err)
			}
		}},
		{"unknown reqIdentifier", func(c *client) error {
			b, _ := json.Marshal(wireReq{ReqIdentifier: 1999, SendID: "u", OperationID: "o", MsgIncr: "1"})
			return c.writeBinary(b)
		}, nil},
		{"sendID not the connection's", func(c *client) error {
			b, _ := json.Marshal(wireReq{ReqIdentifier: wsGetNewestSeq, SendID: "other", OperationID: "o", MsgIncr: "1"})
			return c.writeBinary(b)
		}, nil},
		{"not JSON", func(c *client) error { return c.writeBinary([]byte("{")) }, nil},
		{"unknown text type", func(c *client) error { return c.writeText(`{"type":"hello"}`) }, nil},
		{"logout", func(c *client) error {
			if r := c.call(wsLogoutMsg, &push.DelUserPushTokenReq{UserID: "u", PlatformID: 3}, nil); r.ErrCode != 0 {
				t.Errorf("logout answer errCode %d, want 0", r.ErrCode)
			}
			return nil
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, s, "u", constant.WindowsPlatformID, tok, dialOpt{})
			if err := tt.write(c); err != nil {
				t.Fatal(err)
			}
			err := c.waitEnd()
			if tt.check != nil {
				tt.check(t, err)
			} else if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseMessageTooBig) {
				t.Errorf("read error %v, want the TCP connection closed without a close frame", err)
			}
			waitStats(t, s, "connection gone", func(st Stats) bool { return st.ConnsOpen == 0 })
		})
	}
}

func TestPings(t *testing.T) {
	s := newServer(t, Options{PingPeriod: 20 * time.Millisecond})
	admin := adminToken(t, s)
	register(t, s, admin, "u")
	pong := make(chan string, 1)
	winPinged := make(chan struct{}, 100)
	win := dial(t, s, "u", constant.WindowsPlatformID, userToken(t, s, admin, "u", constant.WindowsPlatformID), dialOpt{
		onPong: func(app string) error { pong <- app; return nil },
		onPing: func(string) error { winPinged <- struct{}{}; return nil },
	})
	if err := win.writeText(`{"type":"ping"}`); err != nil {
		t.Fatal(err)
	}
	f := win.waitFrame(func(f frame) bool { return f.text != nil && !strings.Contains(string(f.text), "errCode") })
	if string(f.text) != `{"type":"pong","body":null}` {
		t.Errorf("text ping answer = %s, want {\"type\":\"pong\",\"body\":null}", f.text)
	}
	if err := win.ws.WriteControl(websocket.PingMessage, []byte("hi"), time.Now().Add(waitGuard)); err != nil {
		t.Fatal(err)
	}
	select {
	case app := <-pong:
		if app != "hi" {
			t.Errorf("pong %q, want hi", app)
		}
	case <-time.After(waitGuard):
		t.Fatal("no pong")
	}
	if st := s.Stats(); st.TextPings != 1 {
		t.Errorf("TextPings = %d, want 1", st.TextPings)
	}

	// The server pings Web connections only: by the time the Web one has
	// had three, the Windows one, older, has had none.
	pinged := make(chan struct{}, 100)
	dial(t, s, "u", constant.WebPlatformID, userToken(t, s, admin, "u", constant.WebPlatformID), dialOpt{
		onPing: func(string) error { pinged <- struct{}{}; return nil },
	})
	for range 3 {
		select {
		case <-pinged:
		case <-time.After(waitGuard):
			t.Fatal("the Web connection was not pinged")
		}
	}
	select {
	case <-winPinged:
		t.Error("the Windows connection was pinged")
	default:
	}
}

// TestReadTimeout: a client silent for ReadTimeout is dropped; one that
// pings is not.
func TestReadTimeout(t *testing.T) {
	const timeout = time.Second
	s := newServer(t, Options{ReadTimeout: timeout})
	admin := adminToken(t, s)
	register(t, s, admin, "u")
	start := time.Now()
	quiet := dial(t, s, "u", constant.WindowsPlatformID, userToken(t, s, admin, "u", constant.WindowsPlatformID), dialOpt{})
	talker := dial(t, s, "u", constant.AndroidPlatformID, userToken(t, s, admin, "u", constant.AndroidPlatformID), dialOpt{})
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(timeout / 10):
				_ = talker.writeText(`{"type":"ping"}`)
			}
		}
	}()
	quiet.waitEnd()
	if d := time.Since(start); d < timeout {
		t.Errorf("silent connection dropped after %s, before the %s read deadline", d, timeout)
	}
	// The talker outlived the quiet one by its pings: it answers still.
	if r := talker.call(wsGetNewestSeq, &sdkws.GetMaxSeqReq{UserID: "u"}, nil); r.ErrCode != 0 {
		t.Errorf("pinging connection: errCode %d", r.ErrCode)
	}
}

// TestCloseLeavesNoGoroutine runs a little traffic through every part of
// the server, closes it, and waits for the goroutine count to come back.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	httpClient.CloseIdleConnections()
	before := runtime.NumGoroutine()
	s, err := New(Options{Secret: testSecret, PingPeriod: 10 * time.Millisecond, Faults: Faults{PushDelay: time.Millisecond, ReorderPush: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminToken(t, s)
	register(t, s, admin, "a", "b")
	a := dial(t, s, "a", constant.WebPlatformID, userToken(t, s, admin, "a", constant.WebPlatformID), dialOpt{})
	b := dial(t, s, "b", constant.WindowsPlatformID, userToken(t, s, admin, "b", constant.WindowsPlatformID), dialOpt{})
	for i := range 20 {
		a.send(textMsg("a", "b", "c"+string(rune('a'+i)), "x"))
	}
	b.waitPushes("si_a_b", 10)
	s.Close()
	s.Close() // idempotent
	a.waitEnd()
	b.waitEnd()
	httpClient.CloseIdleConnections()
	deadline := time.Now().Add(waitGuard)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}
