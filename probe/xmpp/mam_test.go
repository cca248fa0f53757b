package xmpp_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/probe"
)

// Tests of catch-up by message archive (XEP-0313) and of message carbons
// (XEP-0280), against the scripted server of session_test.go, with frames
// shaped like Prosody 0.12's.

// mamResult is an archive result of query qid, from (the archive's JID,
// "" for the user's own), forwarding a message of typ from msgFrom.
func mamResult(from, qid, id, typ, msgFrom, body string) string {
	f := ""
	if from != "" {
		f = ` from='` + from + `'`
	}
	return `<message xmlns='jabber:client' to='alice@localhost/imcanary'` + f + `><result xmlns='urn:xmpp:mam:2' queryid='` + qid + `' id='` + id + `'>` +
		`<forwarded xmlns='urn:xmpp:forward:0'><delay xmlns='urn:xmpp:delay' stamp='2025-01-01T00:00:00Z'/>` +
		`<message xmlns='jabber:client' type='` + typ + `' from='` + msgFrom + `' id='x` + id + `'><body>` + body + `</body></message></forwarded></result></message>`
}

// mamFin ends query qid; last "" is a page with nothing in it.
func mamFin(from, qid, last string, complete bool) string {
	f, c, set := "", "", ""
	if from != "" {
		f = ` from='` + from + `'`
	}
	if complete {
		c = ` complete='true'`
	}
	if last != "" {
		set = `<set xmlns='http://jabber.org/protocol/rsm'><first index='0'>f</first><last>` + last + `</last></set>`
	}
	return `<iq type='result' xmlns='jabber:client' id='` + qid + `'` + f + `><fin xmlns='urn:xmpp:mam:2'` + c + `>` + set + `</fin></iq>`
}

// TestCarbons: carbons from the user's own account are delivered as the
// message they forward (a <sent/> one as the user's own); a carbon from
// anyone else is forged and ignored, and groupchat is never carbon-copied.
func TestCarbons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		url, _ := fakeServer(t, func(p *peer) {
			p.login("alice")
			carbon := func(from, dir, inner string) string {
				return `<message xmlns='jabber:client' from='` + from + `' to='alice@localhost/imcanary' type='chat'><` + dir + ` xmlns='urn:xmpp:carbons:2'><forwarded xmlns='urn:xmpp:forward:0'>` + inner + `</forwarded></` + dir + `></message>`
			}
			p.send(
				carbon("alice@localhost", "sent", `<message xmlns='jabber:client' type='chat' from='alice@localhost/imcanary-1' to='bob@localhost'><body>imc1 sent</body></message>`),
				carbon("alice@localhost", "received", `<message xmlns='jabber:client' type='chat' from='bob@localhost/imcanary' to='alice@localhost/imcanary-1'><body>imc1 received</body></message>`),
				carbon("mallory@localhost", "received", `<message xmlns='jabber:client' type='chat' from='bob@localhost/imcanary' to='alice@localhost'><body>imc1 forged</body></message>`),
				carbon("alice@localhost", "received", `<message xmlns='jabber:client' type='groupchat' from='room@conference.localhost/bob'><body>imc1 group</body></message>`),
				`<message xmlns='jabber:client' type='chat' from='bob@localhost/imcanary'><body>imc1 direct</body></message>`)
			p.drain()
		})
		drv := newDriver(t, url)
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		done := serve(s, r)
		testwait.For(t, 3*time.Second, "the direct message", func() bool { _, _, d := r.snapshot(); return len(d) == 3 })
		time.Sleep(50 * time.Millisecond)
		_ = s.Close()
		wait(t, done)
		if _, _, d := r.snapshot(); !slices.Equal(d, []string{"direct alice imc1 sent", "direct bob imc1 received", "direct bob imc1 direct"}) {
			t.Errorf("deliveries = %q, want the two carbons and the direct message", d)
		}
		if m, ok := probe.Driver(drv).(probe.Mirror); !ok || !m.MirrorsOwn() {
			t.Error("the driver does not say it mirrors a user's messages to its other devices")
		}
	})
}

// TestCatchup plays a device's catch-up: at login the user's own archive
// is asked after the device's mark, a page at a time until the archive
// says complete, and a room the device has no place in yet is asked for
// its newest id only. Results are delivered as recovered, but for the
// device's own messages; results of no query or from another JID are not.
// Once synced, pushes move the marks; Sync asks after them; an archive
// that no longer has the mark's id is asked by time.
func TestCatchup(t *testing.T) {
	const room = "room@conference.localhost"
	marks := make(chan string, 1)
	syncQueries := make(chan []string, 1)
	cu := probe.NewCatchup(time.Second)
	cu.SetMark("alice@localhost", "m0 1700000000")
	url, _ := fakeServer(t, func(p *peer) {
		p.login("alice", "room")
		own := p.expect(`<query xmlns="urn:xmpp:mam:2"`)
		tail := p.expect(`to="` + room + `"`)
		if !strings.Contains(own, `<after>m0</after>`) || strings.Contains(own, ` to=`) {
			t.Errorf("own archive query %q, want one to the account after m0", own)
		}
		if !strings.Contains(tail, `<max>1</max><before/>`) {
			t.Errorf("room query %q, want the newest id only", tail)
		}
		q1, qt := between(own, `id="`, `"`), between(tail, `id="`, `"`)
		p.send(
			mamResult("", q1, "m1", "chat", "bob@localhost/imcanary", "imc1 one"),
			mamResult("", q1, "m2", "chat", "alice@localhost/imcanary", "imc1 mine"),
			mamResult("", q1, "m3", "chat", "alice@localhost/imcanary-1", "imc1 sibling"),
			mamResult("", "other", "m9", "chat", "bob@localhost/imcanary", "imc1 no query"),
			mamResult("mallory@localhost", q1, "m9", "chat", "bob@localhost/imcanary", "imc1 wrong archive"),
			mamFin("", q1, "m3", false),
			mamResult(room, qt, "r9", "groupchat", room+"/bob", "imc1 newest"),
			mamFin(room, qt, "r9", true))
		next := p.expect(`<after>m3</after>`)
		q2 := between(next, `id="`, `"`)
		p.send(mamResult("", q2, "m4", "chat", "bob@localhost/imcanary", "imc1 two"), mamFin("", q2, "m4", true),
			// Pushes, now that both archives are synced.
			`<message xmlns='jabber:client' type='groupchat' from='`+room+`/bob' id='g1'><body>imc1 push group</body><stanza-id xmlns='urn:xmpp:sid:0' by='`+room+`' id='r10'/></message>`,
			`<message xmlns='jabber:client' type='chat' from='bob@localhost/imcanary' id='d1'><body>imc1 push direct</body><stanza-id xmlns='urn:xmpp:sid:0' by='alice@localhost' id='m5'/></message>`,
			`<iq type='get' id='done' xmlns='jabber:client' from='localhost'><ping xmlns='urn:xmpp:ping'/></iq>`)
		p.expect(`id="done"`)
		_, own2 := cu.Position("alice@localhost")
		_, room2 := cu.Position(room)
		marks <- own2 + "|" + room2
		// Sync: after the marks; the room has lost r10.
		s1, s2 := p.expect(`<after>m5</after>`), p.expect(`<after>r10</after>`)
		p.send(mamFin("", between(s1, `id="`, `"`), "", true),
			`<iq type='error' xmlns='jabber:client' from='`+room+`' id='`+between(s2, `id="`, `"`)+`'><error type='modify'><item-not-found xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>`)
		syncQueries <- []string{s1, s2, p.expect(`<field var="start">`)}
		p.drain()
	})
	drv := newDriver(t, url, probe.Group{Name: "room", Members: []string{"alice", "bob"}})
	s, err := drv.Connect(context.Background(), "alice", probe.Device{Catchup: cu})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	done := serve(s, r)
	got := <-marks
	if own, rm, _ := strings.Cut(got, "|"); !strings.HasPrefix(own, "m5 ") || !strings.HasPrefix(rm, "r10 ") {
		t.Errorf("marks %q, want the own archive at m5 and the room at r10, the last pushes", got)
	}
	if err := s.(probe.Syncer).Sync(); err != nil {
		t.Fatal(err)
	}
	qs := <-syncQueries
	if q := qs[2]; !strings.Contains(q, `to="`+room+`"`) || strings.Contains(q, "<after>") {
		t.Errorf("after item-not-found: %q, want the room asked by time", q)
	}
	_ = s.Close()
	wait(t, done)
	_, _, d := r.snapshot()
	want := []string{"recovered direct bob imc1 one", "recovered direct alice imc1 sibling", "recovered direct bob imc1 two", "group bob imc1 push group", "direct bob imc1 push direct"}
	if !slices.Equal(d, want) {
		t.Errorf("deliveries = %q, want %q", d, want)
	}
}

// TestCatchupBounded: a user in many rooms has at most four archive
// queries in flight; each answer lets the next one out.
func TestCatchupBounded(t *testing.T) {
	const rooms = 9
	var groups []probe.Group
	var names []string
	for i := range rooms {
		names = append(names, "r"+strconv.Itoa(i))
		groups = append(groups, probe.Group{Name: names[i], Members: []string{"alice", "bob"}})
	}
	asked := make(chan int, 1)
	url, _ := fakeServer(t, func(p *peer) {
		p.login("alice", names...)
		var open []string
		seen := 0
		for seen < rooms+1 {
			for len(open) < 4 && seen+len(open) < rooms+1 {
				open = append(open, p.expect(`<query xmlns="urn:xmpp:mam:2"`))
			}
			// Nothing more may come while four are open.
			_ = p.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, b, err := p.c.ReadMessage(); err == nil && strings.Contains(string(b), "urn:xmpp:mam:2") {
				t.Errorf("a fifth query in flight: %s", b)
			}
			q := open[0]
			open = open[1:]
			from := between(q, `to="`, `"`)
			p.send(mamFin(from, between(q, `id="`, `"`), "", true))
			seen++
		}
		asked <- seen
		p.drain()
	})
	drv := newDriver(t, url, groups...)
	s, err := drv.Connect(context.Background(), "alice", probe.Device{Catchup: probe.NewCatchup(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	done := serve(s, &recorder{})
	if n := <-asked; n != rooms+1 {
		t.Errorf("%d archives asked, want %d", n, rooms+1)
	}
	_ = s.Close()
	wait(t, done)
}

// TestSecondDevice: a user's second device binds a resource and takes a
// nick of its own, and fails its login on a server that refuses carbons,
// without which it would miss what its sibling sends.
func TestSecondDevice(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		url, _ := fakeServer(t, func(p *peer) {
			p.expect(`<open`)
			p.send(srvOpen + srvFeatures)
			p.expect(`<auth`)
			p.send(srvSuccess)
			p.expect(`<open`)
			p.send(srvOpen + srvBound)
			p.expect(`<resource>imcanary-1</resource>`)
			p.send(`<iq type='result' xmlns='jabber:client' id='bind'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><jid>alice@localhost/imcanary-1</jid></bind></iq>`)
			p.expect(`<enable xmlns="urn:xmpp:sm:3"/>`)
			p.send(srvEnabled)
			p.expect(cliCarbons)
			if refuse {
				// The client gives up on the login here: it sends
				// nothing more.
				p.send(`<iq type='error' id='carbons' xmlns='jabber:client'><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>`)
				p.drain()
				return
			}
			p.send(srvCarbons)
			p.expect(`<presence xmlns="jabber:client"/>`)
			p.expect(`to="room@conference.localhost/alice#1"`)
			p.send(srvSelf("room", "alice#1", false))
			p.drain()
		})
		drv := newDriver(t, url, probe.Group{Name: "room", Members: []string{"alice", "bob"}})
		s, err := drv.Connect(context.Background(), "alice", probe.Device{Index: 1})
		switch {
		case refuse && (err == nil || !strings.Contains(err.Error(), "carbons")):
			t.Errorf("Connect with carbons refused = %v, want an error naming carbons", err)
		case !refuse && err != nil:
			t.Errorf("Connect = %v", err)
		case err == nil:
			_ = s.Close()
			wait(t, serve(s, &recorder{}))
		}
	}
}
