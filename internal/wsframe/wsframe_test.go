//go:build linux

package wsframe_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/internal/wsframe"
)

// rawServer accepts one connection on loopback, reads the upgrade request
// and hands the connection and the 101 response it must send (not sent)
// to script.
func rawServer(t *testing.T, script func(c net.Conn, upgrade []byte)) string {
	t.Helper()
	return serve(t, nil, script)
}

// serve is rawServer, over TLS of cfg if it is not nil.
func serve(t *testing.T, cfg *tls.Config, script func(c net.Conn, upgrade []byte)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if cfg != nil {
			c = tls.Server(c, cfg)
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			t.Errorf("server: %v", err)
			return
		}
		h := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		script(c, []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+
			base64.StdEncoding.EncodeToString(h[:])+"\r\n\r\n"))
	}()
	if cfg != nil {
		return "wss://" + ln.Addr().String() + "/"
	}
	return "ws://" + ln.Addr().String() + "/"
}

// selfSigned returns a server TLS config with a certificate for
// 127.0.0.1 made now, and a client config that trusts it.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "wsframe test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

// frame is a server frame (unmasked) of opcode op; fin marks a message's
// last frame.
func frame(op byte, fin bool, payload []byte) []byte {
	b := []byte{op, 0}
	if fin {
		b[0] |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b[1] = byte(n)
	case n < 1<<16:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}

func text(s string) []byte { return frame(1, true, []byte(s)) }

// dial connects to url through a wsframe.Conn of the given limit.
func dial(t *testing.T, url string, limit int64) (*websocket.Conn, *wsframe.Conn) {
	t.Helper()
	return dialTLS(t, url, limit, nil)
}

// dialTLS is dial, with TLS of cfg inside the wsframe.Conn if cfg is not
// nil (a wss:// url).
func dialTLS(t *testing.T, url string, limit int64, cfg *tls.Config) (*websocket.Conn, *wsframe.Conn) {
	t.Helper()
	var fc *wsframe.Conn
	d := websocket.Dialer{
		ReadBufferSize: 128,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			fc, err = wsframe.New(c, limit)
			return fc, err
		},
		NetDialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if fc, err = wsframe.NewTLS(c, cfg, limit); err != nil {
				return nil, err
			}
			return fc, fc.TLS().HandshakeContext(ctx)
		},
	}
	ws, _, err := d.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(limit)
	t.Cleanup(func() { ws.Close() })
	return ws, fc
}

// readNow reads one message that Ready said was whole: it must not wait
// for the network, so a short deadline is a failure, not a timeout.
func readNow(t *testing.T, ws *websocket.Conn) (string, error) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, p, err := ws.ReadMessage()
	return string(p), err
}

// untilBuffered calls Ready until at least n bytes are buffered, and
// returns its last answer.
func untilBuffered(t *testing.T, fc *wsframe.Conn, n int) bool {
	t.Helper()
	var ready bool
	testwait.For(t, 5*time.Second, fmt.Sprintf("%d bytes buffered", n), func() bool {
		ready = fc.Ready()
		return fc.Buffered() >= n
	})
	return ready
}

// Frames that come with the 101 response, in the same write, are kept for
// Ready rather than stranded in gorilla's reader, where no readiness
// event would ever show them.
func TestFramesWithTheUpgrade(t *testing.T) {
	release := make(chan struct{})
	url := rawServer(t, func(c net.Conn, upgrade []byte) {
		c.Write(append(append(append(upgrade, text("one")...), text("two")...), text("three")...))
		<-release
	})
	defer close(release)
	ws, fc := dial(t, url, 1<<10)
	for _, want := range []string{"one", "two", "three"} {
		if !fc.Ready() {
			t.Fatalf("Ready = false with %q buffered (%d bytes)", want, fc.Buffered())
		}
		if got, err := readNow(t, ws); got != want || err != nil {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
	if fc.Ready() {
		t.Error("Ready = true with nothing left")
	}
	if n := fc.Buffered(); n != 0 {
		t.Errorf("%d bytes buffered after every message was read", n)
	}
}

// stepServer dials a server that answers the upgrade, then writes each
// byte slice sent on steps as it comes.
func stepServer(t *testing.T) (chan<- []byte, *websocket.Conn, *wsframe.Conn) {
	t.Helper()
	steps := make(chan []byte)
	url := rawServer(t, func(c net.Conn, upgrade []byte) {
		c.Write(upgrade)
		for b := range steps {
			c.Write(b)
		}
	})
	t.Cleanup(func() { close(steps) })
	ws, fc := dial(t, url, 1<<10)
	return steps, ws, fc
}

// A message is ready only once its last byte is in, across a split
// header, a split payload and fragments; pings at the front go to
// OnControl, pings between fragments stay with gorilla.
func TestReadyOnlyWhenWhole(t *testing.T) {
	msg := []byte("a message in several pieces")
	steps, ws, fc := stepServer(t)
	var pings []string
	fc.OnControl = wsframe.ControlFunc(func(op int, payload []byte) {
		if op == wsframe.OpPing {
			pings = append(pings, string(payload))
		}
	})
	whole := text(string(msg))
	sent := 0
	send := func(b []byte, wantReady bool) {
		t.Helper()
		steps <- b
		sent += len(b)
		if got := untilBuffered(t, fc, sent); got != wantReady {
			t.Fatalf("after %d bytes: Ready = %v, want %v", sent, got, wantReady)
		}
	}
	steps <- frame(wsframe.OpPing, true, []byte("p1"))
	testwait.For(t, 5*time.Second, "the ping", func() bool { return !fc.Ready() && len(pings) > 0 })
	if len(pings) != 1 || pings[0] != "p1" || fc.Buffered() != 0 {
		t.Fatalf("pings given to OnControl: %q, %d bytes left; want [p1] taken out", pings, fc.Buffered())
	}
	send(whole[:1], false)
	send(whole[1:5], false)
	send(whole[5:], true)
	if got, err := readNow(t, ws); got != string(msg) || err != nil {
		t.Fatalf("read %q, %v", got, err)
	}
	sent = 0
	send(frame(1, false, msg[:5]), false)
	send(frame(wsframe.OpPing, true, []byte("p2")), false)
	send(frame(0, false, msg[5:10]), false)
	send(frame(0, true, msg[10:]), true)
	if got, err := readNow(t, ws); got != string(msg) || err != nil {
		t.Fatalf("fragmented: read %q, %v", got, err)
	}
	if len(pings) != 1 {
		t.Errorf("a ping between fragments went to OnControl: %q", pings)
	}
}

// A reader that stops calling Ready while it still says true (a slow
// reader's hold) may have seen its last read empty the socket; what came
// since is announced by the next readiness event, and after Woken the
// first Ready must read it: edge-triggered readiness does not announce it
// again, and a peer whose window is full has nothing more to send.
func TestWokenReadsWhatCameMeanwhile(t *testing.T) {
	steps, ws, fc := stepServer(t)
	steps <- text("first")
	if !untilBuffered(t, fc, len(text("first"))) {
		t.Fatal("first message buffered whole and not ready")
	}
	if got, err := readNow(t, ws); got != "first" || err != nil {
		t.Fatalf("read %q, %v", got, err)
	}
	// The reader stops here, Ready's last answer true. The second
	// message comes while it does not look.
	steps <- text("second")
	testwait.For(t, 5*time.Second, "the second message in the socket's receive queue", func() bool {
		return inQueue(t, fc) >= len(text("second"))
	})
	fc.Woken()
	if !fc.Ready() {
		t.Fatal("after Woken, Ready = false with a whole message in the socket")
	}
	if got, err := readNow(t, ws); got != "second" || err != nil {
		t.Fatalf("read %q, %v", got, err)
	}
}

// inQueue is how many bytes the kernel holds for fc's socket, unread.
func inQueue(t *testing.T, fc *wsframe.Conn) int {
	t.Helper()
	rc, err := fc.Socket().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if cerr := rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A close frame, a hangup and a message over the limit are each ready:
// gorilla's read returns what each is.
func TestEndsAreReady(t *testing.T) {
	tests := []struct {
		name  string
		bytes []byte
		hang  bool
		check func(error) bool
	}{
		{"close frame", frame(wsframe.OpClose, true, []byte{0x03, 0xe8, 'b', 'y', 'e'}), false,
			func(err error) bool { return websocket.IsCloseError(err, websocket.CloseNormalClosure) }},
		{"hangup mid-frame", text("cut short")[:4], true,
			func(err error) bool { return err != nil && !errors.Is(err, context.DeadlineExceeded) }},
		{"over the limit", text(string(make([]byte, 300))), false,
			func(err error) bool { return errors.Is(err, websocket.ErrReadLimit) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			url := rawServer(t, func(c net.Conn, upgrade []byte) {
				c.Write(append(upgrade, tt.bytes...))
				if !tt.hang {
					<-release
				}
			})
			defer close(release)
			ws, fc := dial(t, url, 200)
			testwait.For(t, 5*time.Second, "Ready", fc.Ready)
			if _, err := readNow(t, ws); !tt.check(err) {
				t.Errorf("read: %v", err)
			}
		})
	}
}

// TestTorture sends messages of every size and shape, fragmented or not,
// with pings and pongs between them, in random chunks, and reads them the
// way a polled session does: on each readiness event, every whole
// message Ready says is there. Every message must come, in order, and no
// read may wait for the network. Over TLS, each chunk is a record or
// several, which TCP splits where it likes: a record read in part must
// be kept for the next event, not lost or waited for.
func TestTorture(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { torture(t, nil, nil) })
	server, client := selfSigned(t)
	t.Run("tls", func(t *testing.T) { torture(t, server, client) })
}

func torture(t *testing.T, server, client *tls.Config) {
	r := rand.New(rand.NewPCG(1, 2))
	const msgs = 400
	sizes := []int{0, 1, 125, 126, 127, 4000, 4097, 65535, 65536, 70000}
	var stream []byte
	var want []int
	for i := range msgs {
		size := sizes[r.IntN(len(sizes))]
		// Its last two bytes are its number.
		p := append(make([]byte, size), byte(i), byte(i>>8))
		want = append(want, len(p))
		if r.IntN(5) == 0 {
			stream = append(stream, frame(wsframe.OpPing, true, []byte("k"))...)
		}
		if r.IntN(7) == 0 {
			stream = append(stream, frame(wsframe.OpPong, true, nil)...)
		}
		if r.IntN(3) == 0 && len(p) > 3 {
			cut := len(p) / 3
			stream = append(stream, frame(2, false, p[:cut])...)
			stream = append(stream, frame(wsframe.OpPing, true, nil)...)
			stream = append(stream, frame(0, false, p[cut:2*cut])...)
			stream = append(stream, frame(0, true, p[2*cut:])...)
			continue
		}
		stream = append(stream, frame(2, true, p)...)
	}
	release := make(chan struct{})
	defer close(release)
	url := serve(t, server, func(c net.Conn, upgrade []byte) {
		// What the client writes (pongs, its close) is read and let go:
		// unread, it would make the server's close a reset.
		go io.Copy(io.Discard, c)
		c.Write(upgrade)
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+r.IntN(9000))
			if _, err := c.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
		c.Write(frame(wsframe.OpClose, true, []byte{0x03, 0xe8}))
		<-release
	})
	ws, fc := dialTLS(t, url, 1<<20, client)
	p, err := netpoll.New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var (
		mu     sync.Mutex
		got    []int
		ended  = make(chan error, 1)
		closed bool
	)
	h, err := p.Add(fc.Socket(), netpoll.ReadyFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		for !closed && fc.Ready() {
			ws.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, m, err := ws.ReadMessage()
			if err != nil {
				closed = true
				ended <- err
				return
			}
			got = append(got, len(m))
			if i := len(got) - 1; len(m) >= 2 && (m[len(m)-2] != byte(i) || m[len(m)-1] != byte(i>>8)) {
				t.Errorf("message %d is message %d", i, int(m[len(m)-2])|int(m[len(m)-1])<<8)
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	h.Wake() // what came with the upgrade
	select {
	case err := <-ended:
		if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Errorf("ended with %v, want the server's close", err)
		}
	case <-time.After(30 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d messages after 30 s", len(got), msgs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != msgs {
		t.Fatalf("%d messages, want %d", len(got), msgs)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("message %d: %d bytes, want %d", i, got[i], want[i])
		}
	}
}
