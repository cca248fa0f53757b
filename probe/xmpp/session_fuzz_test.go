package xmpp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/xmpp"
)

// FuzzServe runs a logged-in session against a server that sends one
// arbitrary frame and then closes the stream. Whatever the frame, Serve
// returns a *probe.Disconnect within wait's bound and never panics; a
// frame the parser refuses ends the session as an error that says so.
func FuzzServe(f *testing.F) {
	for _, s := range []string{
		srvR,
		`<a xmlns='urn:xmpp:sm:3' h='4294967295'/>`,
		`<message xmlns='jabber:client' type='chat' from='bob@localhost/imcanary' id='9'><body>imc1 r bob d.alice 1 2 0-0</body></message>`,
		`<message xmlns='jabber:client' type='groupchat' from='room@conference.localhost/bob' id='9'><body>imc1 r bob g.room 1 2 0-0</body><delay xmlns='urn:xmpp:delay' from='room@conference.localhost' stamp='2002-09-10T23:08:25Z'/></message>`,
		`<message xmlns='jabber:client' type='error' id='7'><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/><text xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'>gone</text></error></message>`,
		`<presence xmlns='jabber:client' from='room@conference.localhost/alice' type='unavailable'><x xmlns='http://jabber.org/protocol/muc#user'><status code='110'/><status code='307'/></x></presence>`,
		`<iq xmlns='jabber:client' type='get' id='p1' from='localhost'><ping xmlns='urn:xmpp:ping'/></iq>`,
		`<iq xmlns='jabber:client' type='set' id='x"&amp;'/>`,
		streamError("system-shutdown", "bye"),
		srvClose,
		`<failed xmlns='urn:xmpp:sm:3' h='3'><unexpected-request xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></failed>`,
		`<message xmlns='jabber:client'><body>` + strings.Repeat("<x>", 40) + `</body></message>`,
		"<message xmlns='jabber:client'><body>\xff</body></message>",
		`<!DOCTYPE x [<!ENTITY a "b">]><message xmlns='jabber:client'><body>&a;</body></message>`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		url, _ := fakeServer(t, func(p *peer) {
			p.login("alice")
			p.send(string(frame))
			p.closeWith(websocket.CloseNormalClosure, "end of fuzz input")
		})
		s, err := newDriver(t, url).Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		got := wait(t, serve(s, &recorder{}))
		var d *probe.Disconnect
		if !errors.As(got, &d) {
			t.Fatalf("frame %q: Serve() = %v, want a *probe.Disconnect", frame, got)
		}
		if xmpp.ParseFrame(frame) == nil {
			return
		}
		if d.Reason != metrics.ReasonError || !strings.Contains(d.Error(), "malformed frame") {
			t.Fatalf("frame %q: Serve() = %v (reason %s), want an error naming the malformed frame", frame, d, d.Reason)
		}
	})
}
