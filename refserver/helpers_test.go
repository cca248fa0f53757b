package refserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// ioTimeout bounds every read and write of a test client, so a broken
// server fails a test instead of hanging it.
const ioTimeout = 10 * time.Second

// startServer runs a server on a real loopback listener through Serve and
// stops it when the test ends. It returns the server and its /ws URL.
func startServer(tb testing.TB, opts Options) (*Server, string) {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatalf("New(%+v) = %v", opts, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			tb.Errorf("Serve = %v, want nil", err)
		}
	})
	return s, "ws://" + ln.Addr().String() + "/ws"
}

// bothModes runs test with connections read by the Poller (the default)
// and by a goroutine each (Options.NoReactor).
func bothModes(t *testing.T, test func(t *testing.T, noReactor bool)) {
	t.Run("reactor", func(t *testing.T) { test(t, false) })
	t.Run("goroutines", func(t *testing.T) { test(t, true) })
}

// frame is what a test client reads: the union of the server's frames.
type frame struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	From    string `json:"from"`
	To      string `json:"to"`
	Group   string `json:"group"`
	Conv    string `json:"conv"`
	MsgID   string `json:"msg_id"`
	Seq     uint64 `json:"seq"`
	Body    string `json:"body"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Last, First and More end a history answer; Convs is a seqs answer.
	Last  uint64            `json:"last"`
	First uint64            `json:"first"`
	More  bool              `json:"more"`
	Convs map[string]uint64 `json:"convs"`

	raw []byte
}

type client struct {
	tb   testing.TB
	ws   *websocket.Conn
	user string
	n    int // frame ids
}

// dialWS opens a WebSocket to url; the client is closed when the test ends.
func dialWS(tb testing.TB, url string) *client {
	tb.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		tb.Fatalf("Dial(%q) = %v", url, err)
	}
	tb.Cleanup(func() { ws.Close() })
	return &client{tb: tb, ws: ws}
}

// login dials url and logs user in with token, failing the test unless the
// server answers login_ok.
func login(tb testing.TB, url, user, token string) *client {
	tb.Helper()
	c := dialWS(tb, url)
	c.user = user
	id := c.write(map[string]any{"type": "login", "user": user, "token": token})
	if f := c.read(); f.Type != "login_ok" || f.ID != id {
		tb.Fatalf("login %q: got %s, want login_ok with id %q", user, f.raw, id)
	}
	return c
}

// write sends v as a frame with a fresh "id" and returns the id.
func (c *client) write(v map[string]any) string {
	c.tb.Helper()
	c.n++
	id := strconv.Itoa(c.n)
	v["id"] = id
	b, err := json.Marshal(v)
	if err != nil {
		c.tb.Fatal(err)
	}
	c.writeRaw(websocket.TextMessage, b)
	return id
}

func (c *client) writeRaw(mt int, b []byte) {
	c.tb.Helper()
	c.ws.SetWriteDeadline(time.Now().Add(ioTimeout))
	if err := c.ws.WriteMessage(mt, b); err != nil {
		c.tb.Fatalf("%s: write: %v", c.user, err)
	}
}

func (c *client) sendTo(to, body string) string {
	c.tb.Helper()
	return c.write(map[string]any{"type": "send", "to": to, "body": body})
}

func (c *client) sendGroup(group, body string) string {
	c.tb.Helper()
	return c.write(map[string]any{"type": "send", "group": group, "body": body})
}

func (c *client) read() frame {
	c.tb.Helper()
	f, err := readFrame(c.ws, ioTimeout)
	if err != nil {
		c.tb.Fatalf("%s: read: %v", c.user, err)
	}
	return f
}

// readType reads one frame and fails unless it is of type typ.
func (c *client) readType(typ string) frame {
	c.tb.Helper()
	f := c.read()
	if f.Type != typ {
		c.tb.Fatalf("%s: got %s, want a %q frame", c.user, f.raw, typ)
	}
	return f
}

// roundTrip sends a ping frame and reads up to its pong, failing on anything
// else in between: it proves nothing else was queued for the client.
func (c *client) roundTrip() {
	c.tb.Helper()
	id := c.write(map[string]any{"type": "ping"})
	if f := c.readType("pong"); f.ID != id {
		c.tb.Fatalf("%s: pong id = %q, want %q", c.user, f.ID, id)
	}
}

// readClose reads until the server's close frame and returns its code and
// text; any other end of the connection fails the test.
func (c *client) readClose() (int, string) {
	c.tb.Helper()
	code, text, err := readClose(c.ws, ioTimeout)
	if err != nil {
		c.tb.Fatalf("%s: %v", c.user, err)
	}
	return code, text
}

func readFrame(ws *websocket.Conn, timeout time.Duration) (frame, error) {
	ws.SetReadDeadline(time.Now().Add(timeout))
	mt, b, err := ws.ReadMessage()
	if err != nil {
		return frame{}, err
	}
	if mt != websocket.TextMessage {
		return frame{}, fmt.Errorf("message type %d, want text", mt)
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return frame{}, fmt.Errorf("frame %s: %w", b, err)
	}
	f.raw = b
	return f, nil
}

func readClose(ws *websocket.Conn, timeout time.Duration) (int, string, error) {
	ws.SetReadDeadline(time.Now().Add(timeout))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, ce.Text, nil
			}
			return 0, "", fmt.Errorf("read: %w, want a close frame", err)
		}
	}
}
