package xmpp_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Tests of what goes over the wire: hostile frames from the server, and
// stanzas never split across frames, against the scripted server of
// session_test.go.

// TestHostileFrames: whatever a server sends, the session ends with an
// error, never a panic, and never a delivery made of it.
func TestHostileFrames(t *testing.T) {
	frames := map[string]string{
		"deep nesting":         strings.Repeat("<a>", 100000) + strings.Repeat("</a>", 100000),
		"wide":                 "<message xmlns='jabber:client'>" + strings.Repeat("<x/>", 5000) + "</message>",
		"huge":                 "<message xmlns='jabber:client' type='chat'><body>" + strings.Repeat("x", 1<<20) + "</body></message>",
		"invalid utf-8":        "<message xmlns='jabber:client' type='chat' from='a@b'><body>imc1 \xff\xfe</body></message>",
		"billion laughs":       `<!DOCTYPE l [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><message xmlns='jabber:client' type='chat' from='a@b'><body>&c;</body></message>`,
		"external entity":      `<!DOCTYPE m [<!ENTITY x SYSTEM "file:///etc/passwd">]><message xmlns='jabber:client' type='chat' from='a@b'><body>&x;</body></message>`,
		"undefined entity":     `<message xmlns='jabber:client' type='chat' from='a@b'><body>&x;</body></message>`,
		"truncated":            `<message xmlns='jabber:client' type='chat' from='a@b'><body>imc1`,
		"text between stanzas": `<r xmlns='urn:xmpp:sm:3'/>junk`,
	}
	for name, frame := range frames {
		t.Run(name, func(t *testing.T) {
			url, _ := fakeServer(t, func(p *peer) {
				p.login("alice")
				p.send(frame)
				p.drain()
			})
			drv := newDriver(t, url)
			s, err := drv.Connect(context.Background(), "alice", probe.Device{})
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			r := &recorder{}
			err = wait(t, serve(s, r))
			if reason := probe.ReasonOf(err); reason != metrics.ReasonError {
				t.Errorf("Serve() = %v (reason %s), want reason error", err, reason)
			}
			if _, _, d := r.snapshot(); len(d) != 0 {
				t.Errorf("deliveries %q from a hostile frame", d)
			}
		})
	}
}

// rawListener records every byte the server reads, so that a test can see
// the client's WebSocket frames as they were on the wire.
type rawListener struct {
	net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &rawConn{Conn: c, l: l}, nil
}

type rawConn struct {
	net.Conn
	l *rawListener
}

func (c *rawConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.l.mu.Lock()
	c.l.buf.Write(b[:n])
	c.l.mu.Unlock()
	return n, err
}

// wireFrame is the header of one WebSocket frame.
type wireFrame struct {
	fin    bool
	opcode byte
	length int
}

// parseWire walks client frames (masked) after the HTTP handshake.
func parseWire(b []byte) ([]wireFrame, error) {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return nil, errors.New("no handshake")
	}
	b = b[i+4:]
	var out []wireFrame
	for len(b) >= 2 {
		f := wireFrame{fin: b[0]&0x80 != 0, opcode: b[0] & 0x0f}
		n, hdr := int(b[1]&0x7f), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return out, nil
			}
			n, hdr = int(b[2])<<8|int(b[3]), 4
		case 127:
			if len(b) < 10 {
				return out, nil
			}
			n = 0
			for _, c := range b[2:10] {
				n = n<<8 | int(c)
			}
			hdr = 10
		}
		if b[1]&0x80 == 0 {
			return nil, errors.New("unmasked client frame")
		}
		hdr += 4
		if len(b) < hdr+n {
			return out, nil
		}
		f.length = n
		out = append(out, f)
		b = b[hdr+n:]
	}
	return out, nil
}

// TestSendNeverFragments: Prosody refuses continuation frames, so a message
// must go out as one frame however large, and one too large for that must
// be refused rather than split.
func TestSendNeverFragments(t *testing.T) {
	got := make(chan int, 1)
	up := websocket.Upgrader{Subprotocols: []string{"xmpp"}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		p := &peer{t: t, c: c}
		p.login("alice")
		got <- len(p.expect(`id="1"`))
		p.drain()
	}))
	rl := &rawListener{Listener: srv.Listener}
	srv.Listener = rl
	srv.Start()
	defer srv.Close()
	drv := newDriver(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/xmpp-websocket")
	s, err := drv.Connect(context.Background(), "alice", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	done := serve(s, &recorder{})
	big := bytes.Repeat([]byte("x"), 60<<10)
	if err := s.Send(&probe.Message{Ref: 1, To: "bob", Body: big}); err != nil {
		t.Fatalf("Send(60 KiB) = %v", err)
	}
	if n := <-got; n < len(big) {
		t.Errorf("server got a %d-byte message, want over %d", n, len(big))
	}
	if err := s.Send(&probe.Message{Ref: 2, To: "bob", Body: bytes.Repeat([]byte("x"), 70<<10)}); err == nil {
		t.Error("Send(70 KiB) = nil, want an error: it cannot go out as one frame")
	}
	_ = s.Close()
	wait(t, done)
	rl.mu.Lock()
	frames, err := parseWire(rl.buf.Bytes())
	rl.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	bigFrames := 0
	for i, f := range frames {
		if !f.fin || f.opcode == 0 {
			t.Errorf("client frame %d: fin %v, opcode %d, %d bytes: a fragment", i, f.fin, f.opcode, f.length)
		}
		if f.length > len(big) {
			bigFrames++
		}
	}
	if len(frames) < 8 || bigFrames != 1 {
		t.Errorf("saw %d client frames, %d of them over %d bytes; want the whole login and the message in one frame", len(frames), bigFrames, len(big))
	}
}
