package refserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// parallel runs f(i) for i in [0, n) on a few workers and returns the
// first error. Workers rather than a goroutine each keep the test's own
// goroutines (and the race detector's load) small next to the server's.
func parallel(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// dialLogin is login for worker goroutines, which must not call t.Fatal.
func dialLogin(url, user string) (*websocket.Conn, error) {
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: dial: %w", user, err)
	}
	ws.SetWriteDeadline(time.Now().Add(ioTimeout))
	if err := ws.WriteJSON(map[string]string{"type": "login", "id": "1", "user": user, "token": "t"}); err != nil {
		ws.Close()
		return nil, fmt.Errorf("%s: login: %w", user, err)
	}
	if f, err := readFrame(ws, ioTimeout); err != nil || f.Type != "login_ok" {
		ws.Close()
		return nil, fmt.Errorf("%s: login: got %s, %v; want login_ok", user, f.raw, err)
	}
	return ws, nil
}

// loginMany logs users u0 to u(n-1) in to url, 32 at a time; the
// connections are closed when the test ends.
func loginMany(tb testing.TB, url string, n int) []*websocket.Conn {
	tb.Helper()
	clients := make([]*websocket.Conn, n)
	tb.Cleanup(func() {
		for _, ws := range clients {
			if ws != nil {
				ws.Close()
			}
		}
	})
	if err := parallel(n, 32, func(i int) (err error) {
		clients[i], err = dialLogin(url, "u"+strconv.Itoa(i))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return clients
}

func TestCloseManyClients(t *testing.T) { bothModes(t, testCloseManyClients) }

func testCloseManyClients(t *testing.T, noReactor bool) {
	const n = 500
	before := runtime.NumGoroutine()

	s, err := New(Options{NoReactor: noReactor})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(context.Background(), ln) }()
	url := "ws://" + ln.Addr().String() + "/ws"

	clients := loginMany(t, url, n)
	if got := s.Stats().Connections; got != n {
		t.Fatalf("Stats().Connections = %d, want %d", got, n)
	}

	start := time.Now()
	s.Close()
	took := time.Since(start)
	// closeGrace is the bound; the clients here do not read, so the
	// server waits it out for their close echoes.
	if took > 2*time.Second {
		t.Errorf("Close() with %d clients took %v, want at most 2s", n, took)
	}
	if err := <-errc; err != nil {
		t.Errorf("Serve = %v, want nil after Close", err)
	}
	s.Close() // idempotent
	if got := s.Stats().Connections; got != 0 {
		t.Errorf("Stats().Connections = %d after Close, want 0", got)
	}
	if err := parallel(n, 32, func(i int) error {
		code, _, err := readClose(clients[i], ioTimeout)
		if err == nil && code != websocket.CloseGoingAway {
			err = fmt.Errorf("close code %d, want %d", code, websocket.CloseGoingAway)
		}
		return err
	}); err != nil {
		t.Errorf("client after Close: %v", err)
	}
	t.Logf("Close() with %d clients took %v", n, took)

	// The server's goroutines are gone; the test's own may take a moment
	// to be reaped after their last statement.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, want at most %d:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeStopsOnContext(t *testing.T) { bothModes(t, testServeStopsOnContext) }

func testServeStopsOnContext(t *testing.T, noReactor bool) {
	s, err := New(Options{NoReactor: noReactor})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	c := login(t, "ws://"+ln.Addr().String()+"/ws", "u1", "t")
	// A client that reads echoes the close at once, so shutdown is fast.
	closed := make(chan int, 1)
	go func() {
		code, _, _ := readClose(c.ws, ioTimeout)
		closed <- code
	}()
	start := time.Now()
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if took := time.Since(start); took > closeGrace {
		t.Errorf("Serve returned %v after cancel, want within %v with a reading client", took, closeGrace)
	}
	if code := <-closed; code != websocket.CloseGoingAway {
		t.Errorf("client closed with %d, want %d", code, websocket.CloseGoingAway)
	}
	if _, _, err := websocket.DefaultDialer.Dial("ws://"+ln.Addr().String()+"/ws", nil); err == nil {
		t.Errorf("Dial after shutdown succeeded, want the listener closed")
	}
}

// TestManyConnections holds 2,000 logged-in connections at once (4,000
// sockets in this process, well under its 20,000 files) and has every user
// exchange a message with a partner.
func TestManyConnections(t *testing.T) { bothModes(t, testManyConnections) }

func testManyConnections(t *testing.T, noReactor bool) {
	if testing.Short() {
		t.Skip("2,000 connections: skipped in -short")
	}
	const n = 2000
	s, url := startServer(t, Options{NoReactor: noReactor})
	clients := loginMany(t, url, n)
	user := func(i int) string { return "u" + strconv.Itoa(i) }
	if got := s.Stats().Connections; got != n {
		t.Fatalf("Stats().Connections = %d, want %d", got, n)
	}
	// Everyone sends first and reads afterwards: two frames each fit in
	// any buffer, and all 2,000 sessions are live at the same time.
	if err := parallel(n, 64, func(i int) error {
		ws := clients[i]
		ws.SetWriteDeadline(time.Now().Add(ioTimeout))
		return ws.WriteJSON(map[string]string{"type": "send", "id": "2", "to": user(i ^ 1), "body": "hi " + user(i)})
	}); err != nil {
		t.Fatal(err)
	}
	if err := parallel(n, 64, func(i int) error {
		var gotAck, gotMsg bool
		for !gotAck || !gotMsg {
			f, err := readFrame(clients[i], ioTimeout)
			if err != nil {
				return fmt.Errorf("%s: %w", user(i), err)
			}
			switch {
			case f.Type == "ack" && f.ID == "2" && f.Seq >= 1:
				gotAck = true
			case f.Type == "msg" && f.From == user(i^1) && f.Body == "hi "+user(i^1):
				gotMsg = true
			default:
				return fmt.Errorf("%s: unexpected %s", user(i), f.raw)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Logins != n || st.Sent != n || st.Deliveries != n {
		t.Errorf("Stats() = %+v, want Logins, Sent and Deliveries %d", st, n)
	}
}

// BenchmarkGroupFanout measures one sender's messages fanned out to a group
// of 50 connected readers, with the reactor and with a goroutine per
// connection.
func BenchmarkGroupFanout(b *testing.B) {
	b.Run("reactor", func(b *testing.B) { benchmarkGroupFanout(b, false) })
	b.Run("goroutines", func(b *testing.B) { benchmarkGroupFanout(b, true) })
}

func benchmarkGroupFanout(b *testing.B, noReactor bool) {
	const readers = 50
	// Enough queue for the window below, so readers are never kicked.
	const window = 64
	s, url := startServer(b, Options{SendQueue: 4 * window, NoReactor: noReactor})
	sender := login(b, url, "sender", "t")
	members := []string{"sender"}
	for i := range readers {
		members = append(members, "r"+strconv.Itoa(i))
	}
	sender.write(map[string]any{"type": "group", "group": "g", "members": members})
	sender.readType("ok")

	var delivered, acked atomic.Int64
	var wg sync.WaitGroup
	conns := []*websocket.Conn{sender.ws}
	b.Cleanup(func() {
		for _, ws := range conns {
			ws.Close()
		}
		wg.Wait()
	})
	for _, m := range members[1:] {
		ws, err := dialLogin(url, m)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, ws)
		wg.Go(func() { // exits when the server or Cleanup closes ws
			ws.SetReadDeadline(time.Time{})
			for {
				if _, _, err := ws.NextReader(); err != nil {
					return
				}
				delivered.Add(1)
			}
		})
	}
	wg.Go(func() {
		sender.ws.SetReadDeadline(time.Time{})
		for {
			if _, _, err := sender.ws.NextReader(); err != nil {
				return
			}
			acked.Add(1)
		}
	})

	msg, _ := json.Marshal(map[string]string{"type": "send", "id": "x", "group": "g", "body": "benchmark body of a typical probe size, 64 bytes or so........"})
	// The login's write deadline would end a long run.
	sender.ws.SetWriteDeadline(time.Time{})
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		// At most window messages in flight to any reader.
		for int64(i-window)*readers > delivered.Load() {
			runtime.Gosched()
		}
		if err := sender.ws.WriteMessage(websocket.TextMessage, msg); err != nil {
			b.Fatal(err)
		}
	}
	want := int64(b.N) * readers
	deadline := time.Now().Add(ioTimeout)
	for delivered.Load() < want {
		if time.Now().After(deadline) {
			b.Fatalf("delivered %d of %d: %+v", delivered.Load(), want, s.Stats())
		}
		runtime.Gosched()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(want)/elapsed.Seconds(), "deliveries/s")
	if st := s.Stats(); st.SlowConsumerKicks != 0 {
		b.Errorf("Stats().SlowConsumerKicks = %d, want 0", st.SlowConsumerKicks)
	}
}

// TestIdleConnectionsHoldNoGoroutine: with the reactor, logged-in idle
// connections hold no goroutine (the Poller's loop and a few workers are
// the server's, whatever the count); read by a goroutine each, they hold
// two each, which shows the count measures what it should.
func TestIdleConnectionsHoldNoGoroutine(t *testing.T) {
	const n = 300
	for _, tt := range []struct {
		name      string
		noReactor bool
		atLeast   int
		below     int
	}{
		{"reactor", false, 0, n / 10},
		{"goroutines", true, 2 * n, 3 * n},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, Options{NoReactor: tt.noReactor})
			before := runtime.NumGoroutine()
			clients := loginMany(t, url, n)
			// A ping each, answered: every connection has read and
			// written since its login.
			if err := parallel(n, 32, func(i int) error {
				ws := clients[i]
				ws.SetWriteDeadline(time.Now().Add(ioTimeout))
				if err := ws.WriteJSON(map[string]string{"type": "ping", "id": "p"}); err != nil {
					return err
				}
				f, err := readFrame(ws, ioTimeout)
				if err == nil && f.Type != "pong" {
					err = fmt.Errorf("got %s, want a pong", f.raw)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got := s.Stats().Connections; got != n {
				t.Fatalf("Stats().Connections = %d, want %d", got, n)
			}
			// Writers and idle workers end on their own: wait for the
			// count to settle below the bound, or report where it stays.
			var grown int
			for end := time.Now().Add(ioTimeout); ; time.Sleep(20 * time.Millisecond) {
				grown = runtime.NumGoroutine() - before
				if (grown >= tt.atLeast && grown < tt.below) || time.Now().After(end) {
					break
				}
			}
			t.Logf("%d idle connections: %d more goroutines", n, grown)
			if grown < tt.atLeast || grown >= tt.below {
				t.Errorf("%d idle connections added %d goroutines, want %d to %d", n, grown, tt.atLeast, tt.below-1)
			}
		})
	}
}
