package centrifugo

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
)

// Tests of the channel positions: gaps in the server's offsets, what a
// reconnect missed, recovery, resubscribes and token refresh, against the
// scripted server of session_test.go.

// TestServerGaps feeds offsets with a hole and an epoch change: both are
// loss by the server's own numbering.
func TestServerGaps(t *testing.T) {
	url := startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		fc.subscribes(2, positioned("EP", 0))
		pub := func(off int, extra string) string {
			return fmt.Sprintf(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 x"},"info":{"user":"u2"},"offset":%d%s}}}`, off, extra)
		}
		fc.send(pub(1, `,"epoch":"EP"`) + "\n" + pub(2, ""))
		fc.send(pub(5, "") + "\n" + pub(5, "") + "\n" + pub(6, ""))
		fc.send(pub(1, `,"epoch":"NEW"`) + "\n" + pub(2, ""))
		fc.close(websocket.CloseGoingAway, "")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	s, err := d.Connect(context.Background(), "u1", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	serve(t, s, &rec)
	if got, want := d.ServerStats(), (ServerStats{Gaps: 2, Missed: 2}); got != want {
		t.Errorf("ServerStats() = %+v, want %+v (offsets 3-4 skipped, then an epoch change)", got, want)
	}
	var seqs []uint64
	for _, dl := range rec.got() {
		seqs = append(seqs, dl.seq)
	}
	// Every live publication is delivered, the repeated 5 too: a server
	// that pushes one twice is at fault, and the ledger, not the driver,
	// counts the duplicate. (Only what a recovery delivered is not passed
	// on again: see TestRecoveredThenLiveDeliveredOnce.)
	if fmt.Sprint(seqs) != "[1 2 5 5 6 1 2]" {
		t.Errorf("delivered offsets = %v, want [1 2 5 5 6 1 2]", seqs)
	}
}

// TestReconnectCountsMissed: a device's second session learns from the
// subscribe reply's offset what was published while it was away; with
// catch-up it asks for it from the last offset it saw.
func TestReconnectCountsMissed(t *testing.T) {
	for _, recover := range []bool{false, true} {
		t.Run(fmt.Sprintf("recover=%v", recover), func(t *testing.T) {
			var mu sync.Mutex
			var second []command
			url := startFakeNth(t, func(fc *fakeConn, n int) {
				fc.acceptConnect(connectOK)
				if n == 1 {
					fc.subscribes(2, positioned("EP", 10))
					fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 x"},"info":{"user":"u2"},"offset":11}}}`)
					fc.close(websocket.CloseGoingAway, "")
					fc.drain()
					return
				}
				cmds := fc.subscribes(2, func(cmd command) string {
					if cmd.Subscribe.Recover && cmd.Subscribe.Channel == "chat:g1" {
						return `"subscribe":{"recoverable":true,"epoch":"EP","publications":[` +
							`{"data":{"b":"imc1 r1"},"info":{"user":"u2"},"offset":12},` +
							`{"data":{"b":"imc1 r2"},"info":{"user":"u3"},"offset":13}],` +
							`"recovered":true,"offset":11,"positioned":true,"was_recovering":true}`
					}
					return `"subscribe":{"epoch":"EP","offset":15,"positioned":true}`
				})
				mu.Lock()
				second = cmds
				mu.Unlock()
				fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 live"},"info":{"user":"u2"},"offset":16}}}`)
				fc.close(websocket.CloseGoingAway, "")
				fc.drain()
			})
			d := newTestDriver(t, url, nil)
			dev := testDevice(recover)
			for range 2 {
				s, err := d.Connect(context.Background(), "u1", dev)
				if err != nil {
					t.Fatal(err)
				}
				serve(t, s, &recorder{})
			}
			mu.Lock()
			defer mu.Unlock()
			var g1 *command
			for i := range second {
				if second[i].Subscribe.Channel == "chat:g1" {
					g1 = &second[i]
				}
			}
			if g1 == nil {
				t.Fatal("no second subscribe to chat:g1")
			}
			st := d.ServerStats()
			if !recover {
				// chat:g1: saw 11, top is 15; dm: saw 10, top is 15.
				if want := (ServerStats{Gaps: 2, Missed: 4 + 5}); st != want {
					t.Errorf("ServerStats() = %+v, want %+v", st, want)
				}
				if g1.Subscribe.Recover {
					t.Errorf("subscribe %s asks to recover with catch-up off", g1.raw)
				}
				return
			}
			s := g1.Subscribe
			if !s.Recover || !s.Recoverable || s.Offset != 11 || s.Epoch != "EP" {
				t.Errorf("second subscribe = %s, want recover from offset 11 in epoch EP", g1.raw)
			}
			// chat:g1 recovered 12-13, then 16 live skips 14-15; the dm
			// channel (no publications recovered by the fake) skipped
			// 11-15.
			if want := (ServerStats{Gaps: 2, Missed: 2 + 5, Recovered: 2}); st != want {
				t.Errorf("ServerStats() = %+v, want %+v", st, want)
			}
		})
	}
}

// TestRecoveredDeliveredInOrder checks publications recovered during the
// handshake and pushes that came meanwhile reach the handler in order.
func TestRecoveredDeliveredInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// sent[0] is taken before the frame of the first two deliveries is
		// written, sent[1] before the next frame (a ping), sent[2] before the
		// last delivery's frame.
		sent := make(chan int64, 3)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			var cmds []command
			for range 2 {
				cmd, err := fc.read()
				if err != nil {
					t.Error(err)
					return
				}
				cmds = append(cmds, cmd)
			}
			// The first subscription is confirmed, a publication arrives
			// on it, and only then is the second confirmed.
			sent <- time.Now().UnixNano()
			fc.send(fmt.Sprintf(`{"id":%d,"subscribe":{"epoch":"EP","offset":3,"positioned":true,"publications":[`+
				`{"data":{"b":"imc1 recovered"},"info":{"user":"u2"},"offset":3}],"recovered":true}}`, cmds[0].ID) + "\n" +
				`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 between"},"info":{"user":"u3"},"offset":4}}}`)
			// A pause, so that the next frame cannot share the first's read.
			time.Sleep(100 * time.Millisecond)
			sent <- time.Now().UnixNano()
			fc.send(`{}`)
			if cmd, _ := fc.read(); cmd.raw != "{}" {
				t.Errorf("answer to a ping during the handshake = %q, want {}", cmd.raw)
			}
			fc.send(fmt.Sprintf(`{"id":%d,"subscribe":{"epoch":"E2","positioned":true}}`, cmds[1].ID))
			sent <- time.Now().UnixNano()
			fc.send(`{"push":{"channel":"dm:#u1,u2","pub":{"data":{"b":"imc1 after"},"info":{"user":"u2"},"offset":1}}}`)
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		s, err := d.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		var rec recorder
		serve(t, s, &rec)
		var bodies []string
		for _, dl := range rec.got() {
			bodies = append(bodies, dl.body)
		}
		if got := strings.Join(bodies, ","); got != "imc1 recovered,imc1 between,imc1 after" {
			t.Fatalf("delivered %q, want recovered, between, after", got)
		}
		// Those kept from the handshake carry the stamp of their own frame,
		// not of the handshake's last one or of Serve's start.
		ats, first, ping, last := rec.stamps(t), <-sent, <-sent, <-sent
		if ats[0] != ats[1] || ats[0] < first || ats[0] >= ping {
			t.Errorf("handshake deliveries stamped %d and %d, want one stamp of their frame, in [%d, %d)", ats[0], ats[1], first, ping)
		}
		if ats[2] < last {
			t.Errorf("last delivery stamped %d, before the server wrote it at %d", ats[2], last)
		}
	})
}

// TestRecoveredDuringFailedHandshakeRecoveredAgain: publications a
// subscribe reply recovers during a handshake that then fails were never
// delivered, so the position must not have moved past them: the next
// session recovers from the old position, and the offsets count them.
func TestRecoveredDuringFailedHandshakeRecoveredAgain(t *testing.T) {
	var mu sync.Mutex
	var third command
	url := startFakeNth(t, func(fc *fakeConn, n int) {
		fc.acceptConnect(connectOK)
		switch n {
		case 1:
			fc.subscribes(2, positioned("EP", 10))
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		case 2:
			// chat:g1 recovers 11-12, but dm:#u1,u2 is refused: the
			// login fails before anything reaches a handler.
			fc.subscribes(2, func(cmd command) string {
				if cmd.Subscribe.Channel == "chat:g1" {
					return `"subscribe":{"recoverable":true,"epoch":"EP","publications":[` +
						`{"data":{"b":"imc1 r1"},"info":{"user":"u2"},"offset":11},` +
						`{"data":{"b":"imc1 r2"},"info":{"user":"u3"},"offset":12}],` +
						`"recovered":true,"offset":12,"positioned":true,"was_recovering":true}`
				}
				return `"error":{"code":103,"message":"permission denied"}`
			})
			fc.drain()
		case 3:
			cmds := fc.subscribes(2, positioned("EP", 12))
			mu.Lock()
			for _, c := range cmds {
				if c.Subscribe.Channel == "chat:g1" {
					third = c
				}
			}
			mu.Unlock()
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		}
	})
	d := newTestDriver(t, url, nil)
	dev := testDevice(true)
	s, err := d.Connect(context.Background(), "u1", dev)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s, &recorder{})
	if _, err := d.Connect(context.Background(), "u1", dev); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("second Connect() = %v, want the refused subscribe", err)
	}
	s, err = d.Connect(context.Background(), "u1", dev)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s, &recorder{})
	mu.Lock()
	defer mu.Unlock()
	if sc := third.Subscribe; sc == nil || !sc.Recover || sc.Offset != 10 || sc.Epoch != "EP" {
		t.Errorf("third subscribe = %s; want recover from 10 in EP (11-12 were never delivered)", third.raw)
	}
	// The third session gets 12 without 11-12 (the fake recovers
	// nothing): the offsets count them missed, not recovered.
	if got, want := d.ServerStats(), (ServerStats{Gaps: 2, Missed: 2 + 2}); got != want {
		t.Errorf("ServerStats() = %+v, want %+v (chat:g1 11-12 and dm:#u1,u2 11-12 missed)", got, want)
	}
}

// TestRecoveredNotServedRecoveredAgain: a session closed without being
// served never delivered what its handshake recovered; the next session
// asks for it again.
func TestRecoveredNotServedRecoveredAgain(t *testing.T) {
	var mu sync.Mutex
	var third command
	url := startFakeNth(t, func(fc *fakeConn, n int) {
		fc.acceptConnect(connectOK)
		switch n {
		case 1:
			fc.subscribes(2, positioned("EP", 10))
		case 2:
			fc.subscribes(2, func(cmd command) string {
				if cmd.Subscribe.Channel == "chat:g1" {
					return `"subscribe":{"recoverable":true,"epoch":"EP","publications":[` +
						`{"data":{"b":"imc1 r1"},"info":{"user":"u2"},"offset":11}],` +
						`"recovered":true,"offset":11,"positioned":true,"was_recovering":true}`
				}
				return positioned("EP", 10)(cmd)
			})
		case 3:
			cmds := fc.subscribes(2, positioned("EP", 11))
			mu.Lock()
			for _, c := range cmds {
				if c.Subscribe.Channel == "chat:g1" {
					third = c
				}
			}
			mu.Unlock()
		}
		fc.close(websocket.CloseGoingAway, "")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	dev := testDevice(true)
	for i := range 3 {
		s, err := d.Connect(context.Background(), "u1", dev)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// Closed and never served: the recovered 11 is never
			// delivered. (Serve after Close would still deliver
			// it.) The connection is released as Serve would.
			_ = s.Close()
			s.(*session).conn.Close()
			continue
		}
		serve(t, s, &recorder{})
	}
	mu.Lock()
	defer mu.Unlock()
	if sc := third.Subscribe; sc == nil || sc.Offset != 10 {
		t.Errorf("third subscribe = %s; want recover from 10 (11 was never delivered)", third.raw)
	}
}

// TestRecoveredThenLiveBothDelivered: a live push of a publication a
// recovery already brought (same epoch, offset at the position) is
// delivered again, as a push: the ledger, which knows the first copy was
// fetched, counts the overlap as catch-up's, not as a duplicate.
func TestRecoveredThenLiveBothDelivered(t *testing.T) {
	url := startFakeNth(t, func(fc *fakeConn, n int) {
		fc.acceptConnect(connectOK)
		if n == 1 {
			fc.subscribes(2, positioned("EP", 10))
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
			return
		}
		fc.subscribes(2, func(cmd command) string {
			if cmd.Subscribe.Channel == "chat:g1" {
				return `"subscribe":{"recoverable":true,"epoch":"EP","publications":[` +
					`{"data":{"b":"imc1 r1"},"info":{"user":"u2"},"offset":11},` +
					`{"data":{"b":"imc1 r2"},"info":{"user":"u3"},"offset":12}],` +
					`"recovered":true,"offset":12,"positioned":true,"was_recovering":true}`
			}
			return `"subscribe":{"recoverable":true,"epoch":"EP","offset":10,"recovered":true,"positioned":true,"was_recovering":true}`
		})
		fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 r2"},"info":{"user":"u3"},"offset":12}}}` + "\n" +
			`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 live"},"info":{"user":"u2"},"offset":13}}}`)
		fc.close(websocket.CloseGoingAway, "")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	dev := testDevice(true)
	var rec recorder
	for i := range 2 {
		s, err := d.Connect(context.Background(), "u1", dev)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			serve(t, s, &recorder{})
		} else {
			serve(t, s, &rec)
		}
	}
	var seqs []string
	for i, dl := range rec.got() {
		seqs = append(seqs, fmt.Sprintf("%d/%v", dl.seq, rec.fetched()[i]))
	}
	if got := strings.Join(seqs, " "); got != "11/true 12/true 12/false 13/false" {
		t.Errorf("delivered offset/recovered = %v, want 11/true 12/true 12/false 13/false", got)
	}
	if got, want := d.ServerStats(), (ServerStats{Recovered: 2}); got != want {
		t.Errorf("ServerStats() = %+v, want %+v", got, want)
	}
}

// TestInsufficientStateResubscribes: an unsubscribe push with code 2500
// makes the session subscribe again (recovering), not end.
func TestInsufficientStateResubscribes(t *testing.T) {
	resub := make(chan string, 1)
	url := startFake(t, func(fc *fakeConn) {
		fc.acceptConnect(connectOK)
		fc.subscribes(2, positioned("EP", 3))
		fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 4"},"info":{"user":"u2"},"offset":4}}}` + "\n" +
			`{"push":{"channel":"chat:g1","unsubscribe":{"code":2500,"reason":"insufficient state"}}}`)
		cmd, err := fc.read()
		if err != nil || cmd.Subscribe == nil {
			t.Errorf("after unsubscribe 2500: command %q, %v; want subscribe", cmd.raw, err)
			return
		}
		resub <- cmd.raw
		fc.send(fmt.Sprintf(`{"id":%d,"subscribe":{"recoverable":true,"epoch":"EP","publications":[`+
			`{"data":{"b":"imc1 5"},"info":{"user":"u2"},"offset":5},{"data":{"b":"imc1 6"},"info":{"user":"u3"},"offset":6}],`+
			`"recovered":true,"offset":4,"positioned":true,"was_recovering":true}}`, cmd.ID))
		fc.close(websocket.CloseGoingAway, "")
		fc.drain()
	})
	d := newTestDriver(t, url, nil)
	dev := testDevice(true)
	s, err := d.Connect(context.Background(), "u1", dev)
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	disc := serve(t, s, &rec)
	if disc.Code != websocket.CloseGoingAway {
		t.Errorf("Serve() = %v, want it to run on until the server's close", disc)
	}
	var cmd command
	if err := json.Unmarshal([]byte(<-resub), &cmd); err != nil {
		t.Fatal(err)
	}
	if sc := cmd.Subscribe; sc.Channel != "chat:g1" || !sc.Recover || sc.Offset != 4 || sc.Epoch != "EP" {
		t.Errorf("resubscribe = %+v, want chat:g1 recovering from 4 in EP", *sc)
	}
	var seqs []uint64
	for _, dl := range rec.got() {
		seqs = append(seqs, dl.seq)
	}
	if fmt.Sprint(seqs) != "[4 5 6]" {
		t.Errorf("delivered offsets = %v, want [4 5 6]", seqs)
	}
	if st := d.ServerStats(); st.Recovered != 2 || st.Missed != 0 {
		t.Errorf("ServerStats() = %+v, want 2 recovered, none missed", st)
	}
}

// TestTokenRefresh: a connection whose token expires refreshes it in time
// with a new valid token.
func TestTokenRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refreshed := make(chan string, 1)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(`{"client":"c1","expires":true,"ttl":1,"ping":25,"pong":true}`)
			fc.subscribes(2, positioned("EP", 0))
			time.Sleep(600 * time.Millisecond)
			fc.send(`{}`)
			for range 2 {
				cmd, err := fc.read()
				if err != nil {
					t.Error(err)
					return
				}
				if cmd.Refresh != nil {
					refreshed <- cmd.Refresh.Token
					fc.send(fmt.Sprintf(`{"id":%d,"refresh":{"expires":true,"ttl":3600}}`, cmd.ID))
				}
			}
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		s, err := d.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		serve(t, s, &recorder{})
		select {
		case tok := <-refreshed:
			var claims jwt.RegisteredClaims
			if _, err := jwt.ParseWithClaims(tok, &claims, func(*jwt.Token) (any, error) { return testSecret, nil }); err != nil || claims.Subject != "u1" {
				t.Errorf("refresh token: sub %q, %v; want a valid token for u1", claims.Subject, err)
			}
		default:
			t.Error("no refresh command before the token expired")
		}
	})
}
