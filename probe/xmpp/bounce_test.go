package xmpp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/probe"
)

// A bounced direct message must not also be acked by the <a h> that covers it.
func TestBouncedMessageIsNotAcked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		url, _ := fakeServer(t, func(p *peer) {
			p.login("alice")
			p.expect(`id="7"`)
			p.expect(`<r xmlns="urn:xmpp:sm:3"/>`)
			// Prosody bounces, then answers the <r/>: h covers the carbons
			// request (1), presence (2) and message (3).
			p.send(`<message from='nobody@localhost' to='alice@localhost/imcanary' type='error' id='7' xmlns='jabber:client'><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></message>`)
			p.send(`<a xmlns='urn:xmpp:sm:3' h='3'/>`)
			p.drain()
		})
		drv := newDriver(t, url)
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		done := serve(s, r)
		if err := s.Send(&probe.Message{Ref: 7, To: "nobody", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 3*time.Second, "reject", func() bool { _, rj, _ := r.snapshot(); return len(rj) == 1 })
		time.Sleep(200 * time.Millisecond)
		if acks, _, _ := r.snapshot(); len(acks) != 0 {
			t.Errorf("ref 7 was rejected and then acked: acks=%v", acks)
		}
		_ = s.Close()
		wait(t, done)
	})
}

// TestAckBeyondSentEndsSession: an <a h> larger than what was sent would
// have every pending message reported as accepted; the session ends with
// an error instead.
func TestAckBeyondSentEndsSession(t *testing.T) {
	url, _ := fakeServer(t, func(p *peer) {
		p.login("alice")
		p.expect(`id="7"`)
		p.expect(`<r xmlns="urn:xmpp:sm:3"/>`)
		p.send(`<a xmlns='urn:xmpp:sm:3' h='99'/>`)
		p.drain()
	})
	drv := newDriver(t, url)
	s, err := drv.Connect(context.Background(), "alice", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	done := serve(s, r)
	if err := s.Send(&probe.Message{Ref: 7, To: "bob", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	err = wait(t, done)
	if probe.ReasonOf(err) != "error" || !strings.Contains(fmt.Sprint(err), "more than the") {
		t.Errorf("Serve() = %v, want an error disconnect for the impossible count", err)
	}
	if acks, _, _ := r.snapshot(); len(acks) != 0 {
		t.Errorf("acks = %v after an impossible <a h>, want none", acks)
	}
}
