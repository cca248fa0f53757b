package wsconn_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// serverFrame encodes one unmasked text frame, as a server sends it.
func serverFrame(payload string) []byte {
	if len(payload) > 125 {
		panic("serverFrame: payload too long for a one-byte length")
	}
	return append([]byte{0x81, byte(len(payload))}, payload...)
}

// rawServer upgrades every request and hands script the server's raw
// socket, so that a test decides how the bytes of each frame are split
// between writes and spaced in time. It returns the endpoint's ws URL.
func rawServer(t *testing.T, tlsOn bool, script func(nc net.Conn)) string {
	t.Helper()
	up := websocket.Upgrader{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		script(c.NetConn())
		// Hold the connection until the client is done with it.
		_, _, _ = c.ReadMessage()
	})
	var srv *httptest.Server
	if tlsOn {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func dial(t *testing.T, d *websocket.Dialer, url string) *websocket.Conn {
	t.Helper()
	c, _, err := d.DialContext(context.Background(), url, nil)
	if err != nil {
		t.Fatalf("Dial(%q) = %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readStamped reads one message whole and returns it with its stamp.
func readStamped(t *testing.T, c *websocket.Conn) (string, int64) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	bp, err := wsconn.Read(c)
	if err != nil {
		t.Fatalf("Read() = %v", err)
	}
	at := wsconn.StampOf(c).Last()
	s := string(*bp)
	wsconn.Release(bp)
	return s, at
}

// TestStampConn checks that the stamp taken after a message is read is
// when the bytes that completed it arrived: after the last of the writes
// a message is split into, and, for a message that came in one read with
// the end of the previous one, the time of that read.
func TestStampConn(t *testing.T) {
	// gap spaces writes so that a stamp that belongs to one write cannot
	// be mistaken for the next one's, even on a loaded machine.
	const gap = 100 * time.Millisecond
	// Each write is stamped by the server just before it writes it.
	type write struct {
		bytes []byte
		pause bool // sleep gap before this write
	}
	a, b := serverFrame("first message"), serverFrame("second")
	tests := []struct {
		name   string
		writes []write
		// after[i] is the index of the write message i must be stamped
		// at or after, and before[i] the one it must be stamped before
		// (-1: none).
		after, before []int
	}{
		{
			name:   "one write per message",
			writes: []write{{bytes: a}, {bytes: b, pause: true}},
			after:  []int{0, 1}, before: []int{1, -1},
		},
		{
			name: "header and payload split, the end late",
			writes: []write{
				{bytes: a[:2]}, {bytes: a[2:6], pause: true}, {bytes: a[6:], pause: true},
				{bytes: b, pause: true},
			},
			after: []int{2, 3}, before: []int{3, -1},
		},
		{
			// The second message arrived with the first: its stamp is
			// that read's, not some later one.
			name:   "two messages in one write",
			writes: []write{{bytes: append(append([]byte(nil), a...), b...)}, {bytes: serverFrame("third"), pause: true}},
			after:  []int{0, 0}, before: []int{1, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			times := make(chan []int64, 1)
			url := rawServer(t, false, func(nc net.Conn) {
				var ts []int64
				for _, w := range tt.writes {
					if w.pause {
						time.Sleep(gap)
					}
					ts = append(ts, time.Now().UnixNano())
					if _, err := nc.Write(w.bytes); err != nil {
						t.Errorf("server write: %v", err)
					}
				}
				times <- ts
			})
			c := dial(t, &websocket.Dialer{NetDialContext: wsconn.NetDialer(probe.Link{})}, url)
			if wsconn.StampOf(c) == nil {
				t.Fatal("StampOf(conn dialled through NetDialer) = nil")
			}
			var ats []int64
			for range tt.after {
				_, at := readStamped(t, c)
				if now := time.Now().UnixNano(); at == 0 || at > now {
					t.Errorf("stamp %d, want non-zero and at most now (%d)", at, now)
				}
				ats = append(ats, at)
			}
			ts := <-times
			for i, at := range ats {
				if w := tt.after[i]; at < ts[w] {
					t.Errorf("message %d stamped %v before write %d", i, time.Duration(ts[w]-at), w)
				}
				if w := tt.before[i]; w >= 0 && at >= ts[w] {
					t.Errorf("message %d stamped %v after write %d, which came later", i, time.Duration(at-ts[w]), w)
				}
			}
		})
	}
}

// TestStampConnHandoff reads the handshake and a first message on one
// goroutine and the next on another, as Connect and Serve do, while a
// third writes and pings: under -race this proves the plain field is
// enough for gorilla's use.
func TestStampConnHandoff(t *testing.T) {
	url := rawServer(t, false, func(nc net.Conn) {
		_, _ = nc.Write(serverFrame("login_ok"))
		time.Sleep(20 * time.Millisecond)
		_, _ = nc.Write(serverFrame("delivery"))
	})
	c := dial(t, &websocket.Dialer{NetDialContext: wsconn.NetDialer(probe.Link{})}, url)
	_, first := readStamped(t, c)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
			time.Sleep(time.Millisecond)
		}
	}()
	got := make(chan int64, 1)
	go func() {
		// Not readStamped: Fatal belongs to the test's goroutine.
		bp, err := wsconn.Read(c)
		if err != nil {
			t.Errorf("Read() on the second goroutine = %v", err)
			got <- 0
			return
		}
		wsconn.Release(bp)
		got <- wsconn.StampOf(c).Last()
	}()
	second := <-got
	close(stop)
	<-wrote
	if second == 0 || second < first {
		t.Errorf("second message stamped %d, want at or after the first's %d", second, first)
	}
}

// TestStampOf checks StampOf finds the stamp under TLS and reports none
// for a connection dialled without NetDialContext.
func TestStampOf(t *testing.T) {
	t.Run("wss", func(t *testing.T) {
		url := rawServer(t, true, func(nc net.Conn) {
			// nc is the server's TLS conn: this is one record.
			_, _ = nc.Write(serverFrame("over tls"))
		})
		before := time.Now().UnixNano()
		d := &websocket.Dialer{
			NetDialContext:  wsconn.NetDialer(probe.Link{}),
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // httptest's own certificate
		}
		c := dial(t, d, url)
		if wsconn.StampOf(c) == nil {
			t.Fatal("StampOf(wss conn) = nil, want the StampConn under TLS")
		}
		if msg, at := readStamped(t, c); msg != "over tls" || at < before {
			t.Errorf("read %q stamped %d, want %q stamped at or after %d", msg, at, "over tls", before)
		}
	})
	t.Run("other dialer", func(t *testing.T) {
		url := rawServer(t, false, func(nc net.Conn) { _, _ = nc.Write(serverFrame("x")) })
		c := dial(t, &websocket.Dialer{}, url)
		if sc, ok := wsconn.StampOf(c).(*wsconn.StampConn); !ok || sc != nil {
			t.Fatalf("StampOf(conn of a plain Dialer) = %v, want a nil *StampConn", wsconn.StampOf(c))
		}
		if _, at := readStamped(t, c); at != 0 {
			t.Errorf("stamp without a StampConn = %d, want 0 (unknown)", at)
		}
	})
}

// BenchmarkRead measures reading a stream of small messages off loopback
// with and without the stamp: the wrapper must add no allocation.
func BenchmarkRead(b *testing.B) {
	for _, tc := range []struct {
		name string
		d    *websocket.Dialer
	}{
		{"plain", &websocket.Dialer{ReadBufferSize: 512}},
		{"stamped", &websocket.Dialer{ReadBufferSize: 512, NetDialContext: wsconn.NetDialer(probe.Link{})}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// 64 messages of 100 bytes per write, written until the
			// client hangs up.
			var burst []byte
			for range 64 {
				burst = append(burst, serverFrame(strings.Repeat("m", 100))...)
			}
			up := websocket.Upgrader{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err := up.Upgrade(w, r, nil)
				if err != nil {
					return
				}
				defer c.Close()
				for {
					if _, err := c.NetConn().Write(burst); err != nil {
						return
					}
				}
			}))
			defer srv.Close()
			c, _, err := tc.d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			sc := wsconn.StampOf(c)
			var sink int64
			b.ReportAllocs()
			for b.Loop() {
				bp, err := wsconn.Read(c)
				if err != nil {
					b.Fatal(err)
				}
				sink += sc.Last()
				wsconn.Release(bp)
			}
			_ = sink
		})
	}
}
