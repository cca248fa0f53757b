package xmpp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/xmpp"
)

// Tests of the driver: connect errors, options and names, and in-band
// registration, against the scripted server of session_test.go.

// TestConnectErrors checks a failed login names what failed.
func TestConnectErrors(t *testing.T) {
	tests := []struct {
		name   string
		server func(p *peer)
		want   string
	}{
		{"bad password", func(p *peer) {
			p.expect(`<open`)
			p.send(srvOpen, srvFeatures)
			p.expect(`<auth`)
			p.send(`<failure xmlns='urn:ietf:params:xml:ns:xmpp-sasl'><not-authorized/><text>Unable to authorize you with the authentication credentials you've sent.</text></failure>`)
			p.drain()
		}, "authentication failed: not-authorized"},
		{"no stream management", func(p *peer) {
			p.expect(`<open`)
			p.send(srvOpen + srvFeatures)
			p.expect(`<auth`)
			p.send(srvSuccess)
			p.expect(`<open`)
			p.send(srvOpen + `<stream:features xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></stream:features>`)
			p.drain()
		}, "no stream management"},
		{"no mechanism", func(p *peer) {
			p.expect(`<open`)
			p.send(srvOpen + `<stream:features xmlns:stream='http://etherx.jabber.org/streams'><mechanisms xmlns='urn:ietf:params:xml:ns:xmpp-sasl'><mechanism>X-OAUTH2</mechanism></mechanisms></stream:features>`)
			p.drain()
		}, "neither SCRAM-SHA-1 nor PLAIN"},
		{"room refuses", func(p *peer) {
			p.login("alice")
			p.expect(`to="room@conference.localhost/alice"`)
			p.send(`<presence from='room@conference.localhost/alice' type='error' xmlns='jabber:client'><error type='cancel'><conflict xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></presence>`)
			p.drain()
		}, "join room@conference.localhost: conflict"},
		{"stream error", func(p *peer) {
			p.expect(`<open`)
			p.send(srvOpen+streamError("host-unknown", ""), srvClose)
			p.drain()
		}, "stream error: host-unknown"},
		{"silence", func(p *peer) {
			p.expect(`<open`)
			// Silent until the client gives up and hangs up.
			p.drain()
		}, "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := fakeServer(t, tt.server)
			drv, err := xmpp.New(xmpp.Config{Domain: "localhost"}, xmpp.Options{URL: url, Password: func(u string) string { return "pw-" + u }, DialTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			dialFake(t, drv, url)
			if err := drv.Provision(context.Background(), probe.Plan{Groups: []probe.Group{{Name: "room", Members: []string{"alice"}}}}); err != nil {
				t.Fatal(err)
			}
			_, err = drv.Connect(context.Background(), "alice", probe.Device{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Connect() = %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "pw-alice") {
				t.Errorf("Connect() = %v: the error shows the password", err)
			}
		})
	}
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	noProto := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{}
		if c, err := up.Upgrade(w, r, nil); err == nil {
			c.Close()
		}
	}))
	defer noProto.Close()
	for _, tt := range []struct{ name, url, want string }{
		{"nothing listening", "ws://127.0.0.1:1/xmpp-websocket", "dial ws://127.0.0.1:1/xmpp-websocket"},
		{"not a websocket endpoint", "ws" + strings.TrimPrefix(notFound.URL, "http"), "HTTP 404"},
		{"no xmpp subprotocol", "ws" + strings.TrimPrefix(noProto.URL, "http"), `subprotocol ""`},
	} {
		drv, err := xmpp.New(xmpp.Config{Domain: "localhost"}, xmpp.Options{URL: tt.url, Password: func(string) string { return "x" }, DialTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := drv.Connect(context.Background(), "alice", probe.Device{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Connect() = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestNewAndNames(t *testing.T) {
	pw := func(string) string { return "" }
	for _, tt := range []struct {
		c xmpp.Config
		o xmpp.Options
	}{
		{xmpp.Config{Domain: "localhost"}, xmpp.Options{Password: pw}},
		{xmpp.Config{}, xmpp.Options{URL: "ws://x", Password: pw}},
		{xmpp.Config{Domain: "localhost"}, xmpp.Options{URL: "ws://x"}},
		{xmpp.Config{Domain: "local host"}, xmpp.Options{URL: "ws://x", Password: pw}},
	} {
		if _, err := xmpp.New(tt.c, tt.o); err == nil {
			t.Errorf("New(%+v, %+v) = nil error, want one", tt.c, tt.o)
		}
	}
	drv, err := xmpp.New(xmpp.Config{Domain: "localhost"}, xmpp.Options{URL: "ws://127.0.0.1:1/", Password: pw})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "a b", "a@b", "a/b", "a<b", "é"} {
		if err := drv.Provision(context.Background(), probe.Plan{Users: []string{name}}); err == nil {
			t.Errorf("Provision(user %q) = nil, want an error", name)
		}
		if _, err := drv.Connect(context.Background(), name, probe.Device{}); err == nil || !strings.Contains(err.Error(), "login") {
			t.Errorf("Connect(%q) = %v, want a name error", name, err)
		}
	}
}

// TestProvisionRegisters plays in-band registration: requests are
// pipelined on one socket, an existing user is success, any other refusal
// fails provisioning and names the user.
func TestProvisionRegisters(t *testing.T) {
	var users []string
	for i := range 40 {
		users = append(users, fmt.Sprintf("u%d", i))
	}
	var (
		mu       sync.Mutex
		maxAhead int
		// batch is the number of users of the Provision under way.
		batch atomic.Int64
	)
	url, _ := fakeServer(t, func(p *peer) {
		n := int(batch.Load())
		p.expect(`<open`)
		p.send(srvOpen + srvFeatures)
		var queued []string
		for answered := 0; answered < n; {
			f := p.read()
			if f == "" {
				return
			}
			if strings.HasPrefix(f, "<close") {
				continue
			}
			queued = append(queued, f)
			mu.Lock()
			maxAhead = max(maxAhead, len(queued))
			mu.Unlock()
			// Answer in bursts, so that the client must keep several
			// requests in flight to finish.
			if len(queued) < 8 && answered+len(queued) < n {
				continue
			}
			for _, q := range queued {
				id, user := between(q, `id="`, `"`), between(q, "<username>", "</username>")
				if between(q, "<password>", "</password>") != "pw-"+user {
					t.Errorf("registration %q: wrong password", q)
				}
				reply := `<iq type='result' id='` + id + `' xmlns='jabber:client'/>`
				switch user {
				case "u3":
					reply = `<iq type='error' id='` + id + `' xmlns='jabber:client'><error type='cancel'><conflict xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/><text xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'>The requested username already exists.</text></error></iq>`
				case "bad":
					reply = `<iq type='error' id='` + id + `' xmlns='jabber:client'><error type='modify'><not-acceptable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>`
				}
				p.send(reply)
				answered++
			}
			queued = queued[:0]
		}
		p.drain()
	})
	drv, err := xmpp.New(xmpp.Config{Domain: "localhost", Register: true}, xmpp.Options{URL: url, Password: func(u string) string { return "pw-" + u }, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dialFake(t, drv, url)
	batch.Store(int64(len(users)))
	if err := drv.Provision(context.Background(), probe.Plan{Users: users}); err != nil {
		t.Fatalf("Provision = %v, want nil (a conflict is an existing user)", err)
	}
	mu.Lock()
	if maxAhead < 8 {
		t.Errorf("at most %d registrations in flight, want pipelining", maxAhead)
	}
	mu.Unlock()
	refused := append(users[:5:5], "bad")
	batch.Store(int64(len(refused)))
	if err := drv.Provision(context.Background(), probe.Plan{Users: refused}); err == nil || !strings.Contains(err.Error(), "register bad: not-acceptable") {
		t.Errorf("Provision with a refused user = %v, want it named", err)
	}
}
