package reference_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/reference"
)

// FuzzServe runs a logged-in session against a server that sends one
// arbitrary frame, then closes. Whatever the frame, Serve returns a
// *probe.Disconnect within five seconds and never panics; a frame the
// parser refuses ends the session as an error that says so, and the
// server is told with close code 1003.
func FuzzServe(f *testing.F) {
	for _, s := range []string{
		`{"type":"msg","from":"u2","to":"u1","conv":"d:u1:u2","msg_id":"1","seq":1,"body":"imc1 r u2 d.u1 1 2 0-0"}`,
		`{"type":"msg","from":"u2","group":"g1","seq":18446744073709551615,"body":"\u00e9\ud83d\ude00"}`,
		`{"type":"ack","id":"18446744073709551615","msg_id":"7","seq":3}`,
		`{"type":"ack","id":"99999999999999999999999","seq":3}`,
		`{"type":"error","id":"5","code":"not_member","message":"no"}`,
		`{"type":"pong","id":"x"}`,
		`{"type":"msg",`,
		`{"type":"msg","body":"` + "\xff" + `"}`,
		`{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		closed := make(chan int, 1)
		url := fakeServer(t, func(c *websocket.Conn) {
			_ = c.WriteMessage(websocket.TextMessage, frame)
			_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "end of fuzz input"), time.Now().Add(time.Second))
			code := 0
			for {
				_, _, err := c.ReadMessage()
				if ce, ok := errors.AsType[*websocket.CloseError](err); ok {
					code = ce.Code
				}
				if err != nil {
					break
				}
			}
			closed <- code
		})
		drv := newDriver(t, reference.Options{URL: url, Heartbeat: time.Second})
		s, err := drv.Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(nopHandler{}) }()
		var got error
		select {
		case got = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("frame %q: Serve did not return", frame)
		}
		var d *probe.Disconnect
		if !errors.As(got, &d) {
			t.Fatalf("frame %q: Serve() = %v, want a *probe.Disconnect", frame, got)
		}
		if reference.ParseFrame(frame) == nil {
			return
		}
		if d.Reason != metrics.ReasonError || !strings.Contains(d.Error(), "malformed frame") {
			t.Fatalf("frame %q: Serve() = %v (reason %s), want an error naming the malformed frame", frame, d, d.Reason)
		}
		select {
		case code := <-closed:
			if code != websocket.CloseUnsupportedData {
				t.Fatalf("frame %q: the server saw close code %d, want %d", frame, code, websocket.CloseUnsupportedData)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("frame %q: the server's connection did not end", frame)
		}
	})
}
