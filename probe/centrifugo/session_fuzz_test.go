package centrifugo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/fuzzcorpus"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// FuzzServe runs a connected session against a fake server that sends one
// arbitrary frame, then closes the connection. Whatever the frame, Serve
// returns a *probe.Disconnect within serve's bound and never panics; a
// frame the parser refuses ends the session as an error that says so.
// Seeds are the frames captured from Centrifugo (FuzzParseFrame's corpus)
// and some a hostile server might send.
func FuzzServe(f *testing.F) {
	for _, s := range fuzzcorpus.Bytes(f, "testdata/fuzz/FuzzParseFrame") {
		f.Add(s)
	}
	for _, s := range []string{
		`{}`,
		`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 r u2 g.g1 1 2 0-0"},"info":{"user":"u2"},"offset":1,"epoch":"EP"}}}`,
		`{"push":{"channel":"chat:g1","pub":{"data":{"b":"x"},"offset":18446744073709551615,"epoch":"EP"}}}` + "\n" +
			`{"push":{"channel":"chat:g1","pub":{"data":{"b":"y"},"offset":1,"epoch":"other"}}}`,
		`{"push":{"channel":"dm:#u1,u2","unsubscribe":{"code":2500,"reason":"insufficient state"}}}`,
		`{"push":{"channel":"nope","unsubscribe":{"code":0}}}`,
		`{"push":{"disconnect":{"code":3008,"reason":"slow"}}}`,
		`{"id":4294967295,"publish":{}}`,
		`{"id":4294967296,"error":{"code":103,"message":"permission denied"}}`,
		`{"id":3,"subscribe":{"recovered":true,"epoch":"EP","offset":5,"publications":[{"data":{"b":"z"},"offset":4},{"offset":2}]}}`,
		`{"id":9,"refresh":{"expires":true,"ttl":0}}`,
		`{"push":{"channel":"chat:g1","pub":{"data":{"b":"\ud800"}}}}` + "\n" + `{"push":nope}`,
		`{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			fc.subscribes(2, positioned("EP", 0))
			fc.send(string(frame))
			fc.close(3000, "end of fuzz input")
			fc.drain()
		})
		s, err := newTestDriver(t, url, nil).Connect(context.Background(), "u1", probe.Device{})
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		d := serve(t, s, &recorder{})
		if parses(frame) {
			return
		}
		if d.Reason != metrics.ReasonError || !strings.Contains(d.Error(), "malformed frame") {
			t.Fatalf("frame %q: Serve() = %v (reason %s), want an error naming the malformed frame", frame, d, d.Reason)
		}
	})
}

// parses reports whether every message of frame parses.
func parses(frame []byte) bool {
	var m msg
	p := parser{jsonscan.Scanner{B: bytes.Clone(frame)}}
	for p.More() {
		if p.message(&m) != nil {
			return false
		}
	}
	return true
}
