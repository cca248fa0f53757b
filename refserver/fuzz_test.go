package refserver

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// fuzzMaxFrame is the server's read limit in FuzzClientFrame: small, so
// that the fuzzer reaches it.
const fuzzMaxFrame = 2048

// FuzzClientFrame sends one arbitrary frame to a real server, before or
// after logging in, and a ping after it. The server must then either
// answer the ping, the session alive, or close the connection with a close
// frame whose code is 1008 or 4001 and whose reason says why (doc.go's
// contract for a refused frame); never go silent, drop the connection
// without a close frame, or crash. Every frame it sends on the way is a
// JSON object with a type, in valid UTF-8.
func FuzzClientFrame(f *testing.F) {
	f.Add(false, []byte(`{"type":"login","id":"1","user":"fz","token":"t"}`))
	f.Add(false, []byte(`{"type":"login","id":"1","user":"","token":"t"}`))
	f.Add(false, []byte(`{"type":"send","id":"1","to":"x","body":"b"}`))
	f.Add(false, []byte(`{"type":"history","id":"1","conv":"d:a:b"}`))
	f.Add(false, []byte(`{"type":"seqs","id":"1"}`))
	f.Add(true, []byte(`{"type":"send","id":"1","to":"fz-other","body":"imc1 r s d.x 1 2 0-0"}`))
	f.Add(true, []byte(`{"type":"send","id":"1","to":"x","group":"g","body":"b"}`))
	f.Add(true, []byte(`{"type":"send","id":"1","to":"x","body":{"a":1}}`))
	f.Add(true, []byte("{\"type\":\"send\",\"id\":\"1\",\"to\":\"x\",\"body\":\"\xff\"}"))
	f.Add(true, []byte(`{"type":"group","id":"2","group":"g","members":["a","b",""]}`))
	f.Add(true, []byte(`{"type":"group","id":"2","group":"g","members":["a","a","b"]}`))
	f.Add(true, []byte(`{"type":"send","id":"3","group":"g","body":"\u2028\ud800"}`))
	f.Add(true, []byte(`{"type":"ping","id":"\u0000\"\\"}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"g:g","after":12,"limit":100}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"d:fz-1:x","after":18446744073709551615,"limit":0}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"d:a:b","limit":1000000000}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"","limit":-1}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"g:g","after":-1}`))
	f.Add(true, []byte(`{"type":"history","id":"7","conv":"x","limit":null}`))
	f.Add(true, []byte(`{"type":"seqs","id":"8"}`))
	f.Add(true, []byte(`{"type":"seqs","id":"8","conv":"g:g","after":3}`))
	f.Add(true, []byte(`{"type":"login","id":"1","user":"fz","token":"t"}`))
	f.Add(true, []byte(`{"type":"nope"}`))
	f.Add(true, []byte(`{"id":"x"}`))
	f.Add(true, []byte(`{"type":1}`))
	f.Add(true, []byte(`[]`))
	f.Add(true, []byte(``))
	f.Add(true, []byte(`{"type":"ping","x":`+strings.Repeat("[", 1000)+strings.Repeat("]", 1000)+`}`))
	f.Add(true, []byte(`{"type":"ping","id":"`+strings.Repeat("x", fuzzMaxFrame)+`"}`))

	_, url := startServer(f, Options{MaxFrame: fuzzMaxFrame, OfflineQueue: 4, SendQueue: 64})
	var users atomic.Int64
	f.Fuzz(func(t *testing.T, login bool, frame []byte) {
		ws, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatalf("Dial(%q) = %v", url, err)
		}
		defer ws.Close()
		write := func(b []byte) {
			t.Helper()
			ws.SetWriteDeadline(time.Now().Add(ioTimeout))
			if err := ws.WriteMessage(websocket.TextMessage, b); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
		if login {
			user := "fz-" + strconv.FormatInt(users.Add(1), 10)
			write([]byte(`{"type":"login","id":"fuzz-login","user":"` + user + `","token":"t"}`))
			if f, err := readFrame(ws, ioTimeout); err != nil || f.Type != "login_ok" {
				t.Fatalf("login: %s, %v, want login_ok", f.raw, err)
			}
		}
		write(frame)
		// The server may have closed by now; a failed write is then
		// what the close frame read next explains.
		ws.SetWriteDeadline(time.Now().Add(ioTimeout))
		_ = ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping","id":"fuzz-ping"}`))

		ws.SetReadDeadline(time.Now().Add(ioTimeout))
		for {
			mt, b, err := ws.ReadMessage()
			if err != nil {
				var ce *websocket.CloseError
				if !errors.As(err, &ce) {
					t.Fatalf("after frame %q: %v, want a pong or a close frame", frame, err)
				}
				if ce.Code != websocket.ClosePolicyViolation && ce.Code != CloseUnauthorized {
					t.Fatalf("frame %q: close %d %q, want 1008 or 4001", frame, ce.Code, ce.Text)
				}
				if ce.Text == "" || len(ce.Text) > 123 || !utf8.ValidString(ce.Text) {
					t.Fatalf("frame %q: close %d with reason %q, want a short UTF-8 reason", frame, ce.Code, ce.Text)
				}
				return
			}
			var out struct {
				Type string `json:"type"`
				ID   string `json:"id"`
			}
			if mt != websocket.TextMessage || !utf8.Valid(b) || json.Unmarshal(b, &out) != nil || out.Type == "" {
				t.Fatalf("frame %q: server sent %q (type %d), want a JSON object with a type", frame, b, mt)
			}
			if out.Type == "pong" && out.ID == "fuzz-ping" {
				return
			}
		}
	})
}
