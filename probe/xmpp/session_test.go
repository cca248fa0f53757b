package xmpp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/memnet"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/xmpp"
)

// These tests script a server frame by frame, with frames shaped like the
// ones Prosody 0.12 sends (see stanza_test.go for the captured originals).

const (
	srvOpen     = `<open version='1.0' from='localhost' id='s1' xml:lang='en' xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>`
	srvFeatures = `<stream:features xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><register xmlns='http://jabber.org/features/iq-register'/><mechanisms xmlns='urn:ietf:params:xml:ns:xmpp-sasl'><mechanism>PLAIN</mechanism></mechanisms></stream:features>`
	srvBound    = `<stream:features xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><sm xmlns='urn:xmpp:sm:3'><optional/></sm><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><required/></bind></stream:features>`
	srvSuccess  = `<success xmlns='urn:ietf:params:xml:ns:xmpp-sasl'/>`
	srvEnabled  = `<enabled xmlns='urn:xmpp:sm:3'/>`
	srvClose    = `<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>`
	srvR        = `<r xmlns='urn:xmpp:sm:3'/>`
	srvCarbons  = `<iq type='result' id='carbons' xmlns='jabber:client'/>`
	// cliCarbons is the client's request for message carbons.
	cliCarbons = `<iq xmlns="jabber:client" type="set" id="carbons"><enable xmlns="urn:xmpp:carbons:2"/></iq>`
)

func srvBindResult(user string) string {
	return `<iq type='result' xmlns='jabber:client' id='bind'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><jid>` + user + `@localhost/imcanary</jid></bind></iq>`
}

func srvSelf(room, nick string, created bool) string {
	status := ""
	if created {
		status = `<status code='201'/>`
	}
	return `<presence from='` + room + `@conference.localhost/` + nick + `' xmlns='jabber:client'><x xmlns='http://jabber.org/protocol/muc#user'>` + status + `<item affiliation='owner' role='moderator'/><status code='110'/></x></presence>`
}

func streamError(cond, text string) string {
	s := `<stream:error xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client'><` + cond + ` xmlns='urn:ietf:params:xml:ns:xmpp-streams'/>`
	if text != "" {
		s += `<text xmlns='urn:ietf:params:xml:ns:xmpp-streams'>` + text + `</text>`
	}
	return s + `</stream:error>`
}

// peer is the server's end of one connection.
type peer struct {
	t *testing.T
	c *websocket.Conn
	// log holds every frame the client sent, in order.
	mu  sync.Mutex
	log []string
}

// read returns the client's next frame, or "" once the connection ends.
func (p *peer) read() string {
	_ = p.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, b, err := p.c.ReadMessage()
	if err != nil {
		return ""
	}
	if typ != websocket.TextMessage {
		p.t.Errorf("client sent a frame of type %d, want text", typ)
	}
	p.mu.Lock()
	p.log = append(p.log, string(b))
	p.mu.Unlock()
	return string(b)
}

// expect reads the client's next frame other than an SM ack and checks it
// contains want.
func (p *peer) expect(want string) string {
	for {
		f := p.read()
		if strings.HasPrefix(f, `<a xmlns="urn:xmpp:sm:3"`) {
			continue
		}
		if !strings.Contains(f, want) {
			p.t.Errorf("client sent %q, want a frame containing %q", f, want)
		}
		return f
	}
}

// send writes each argument as one frame.
func (p *peer) send(frames ...string) {
	for _, f := range frames {
		_ = p.c.WriteMessage(websocket.TextMessage, []byte(f))
	}
}

// frames returns the frames the client sent so far.
func (p *peer) frames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// login plays the server's side of a PLAIN login of user, then of each
// room join: a room named "new…" is created by the join.
func (p *peer) login(user string, rooms ...string) {
	p.expect(`<open xmlns="urn:ietf:params:xml:ns:xmpp-framing" to="localhost" version="1.0"/>`)
	// Two elements in one frame, as Prosody may send them.
	p.send(srvOpen + srvFeatures)
	auth := p.expect(`<auth xmlns="urn:ietf:params:xml:ns:xmpp-sasl" mechanism="PLAIN">`)
	payload := strings.TrimSuffix(strings.TrimPrefix(auth, `<auth xmlns="urn:ietf:params:xml:ns:xmpp-sasl" mechanism="PLAIN">`), `</auth>`)
	if raw, _ := base64.StdEncoding.DecodeString(payload); string(raw) != "\x00"+user+"\x00pw-"+user {
		p.t.Errorf("PLAIN payload = %q, want \\0%s\\0pw-%s", raw, user, user)
	}
	p.send(srvSuccess)
	p.expect(`<open xmlns="urn:ietf:params:xml:ns:xmpp-framing"`)
	p.send(srvOpen + srvBound)
	p.expect(`<iq xmlns="jabber:client" type="set" id="bind"><bind xmlns="urn:ietf:params:xml:ns:xmpp-bind"><resource>imcanary</resource></bind></iq>`)
	p.send(srvBindResult(user))
	p.expect(`<enable xmlns="urn:xmpp:sm:3"/>`)
	p.send(srvEnabled)
	p.expect(cliCarbons)
	p.send(srvCarbons)
	p.expect(`<presence xmlns="jabber:client"/>`)
	for _, r := range rooms {
		p.expect(`<presence xmlns="jabber:client" to="` + r + `@conference.localhost/` + user + `"><x xmlns="http://jabber.org/protocol/muc"><history maxstanzas="0"/></x></presence>`)
	}
	for _, r := range rooms {
		created := strings.HasPrefix(r, "new")
		p.send(srvSelf(r, user, created))
		if created {
			iq := p.expect(`<query xmlns="http://jabber.org/protocol/muc#owner"><x xmlns="jabber:x:data" type="submit"/></query></iq>`)
			id := between(iq, `id="`, `"`)
			p.send(`<iq type='result' id='` + id + `' from='` + r + `@conference.localhost' xmlns='jabber:client'/>`)
		}
	}
}

func between(s, a, b string) string {
	_, rest, _ := strings.Cut(s, a)
	v, _, _ := strings.Cut(rest, b)
	return v
}

// drain reads until the client goes away, and answers its <close/> the way
// Prosody does: a last ack, <close/>, then the WebSocket close.
func (p *peer) drain() {
	for {
		f := p.read()
		switch {
		case f == "":
			return
		case strings.HasPrefix(f, `<close xmlns="urn:ietf:params:xml:ns:xmpp-framing"`):
			p.send(srvClose)
			p.closeWith(websocket.CloseNormalClosure, "Stream closed")
			return
		}
	}
}

// closeWith sends a WebSocket close frame and waits for the client's.
func (p *peer) closeWith(code int, text string) {
	_ = p.c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
	for p.read() != "" {
	}
}

// fakeServer serves every connection with script; it returns the server's
// URL and a channel that yields each connection's peer once its script
// has returned.
func fakeServer(t *testing.T, script func(p *peer)) (string, chan *peer) {
	t.Helper()
	done := make(chan *peer, 16)
	up := websocket.Upgrader{Subprotocols: []string{"xmpp"}}
	url := fakes.Start(t, "ws", "/xmpp-websocket", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		p := &peer{t: t, c: c}
		script(p)
		done <- p
	}))
	return url, done
}

// fakes are the running fake servers, for dialFake to reach in memory in
// place of TCP: a test that runs in a synctest bubble then has the
// script's pauses and the driver's timers on the bubble's clock.
var fakes memnet.Fakes

// dialFake makes drv dial the fake server at url in memory.
func dialFake(t *testing.T, drv *xmpp.Driver, url string) {
	t.Helper()
	dial, ok := fakes.Dial(url)
	if !ok {
		t.Fatalf("no fake server at %s", url)
	}
	xmpp.SetDial(drv, dial)
}

func newDriver(t *testing.T, url string, groups ...probe.Group) *xmpp.Driver {
	t.Helper()
	drv, err := xmpp.New(xmpp.Config{Domain: "localhost"}, xmpp.Options{
		URL:          url,
		Password:     func(u string) string { return "pw-" + u },
		Heartbeat:    time.Second,
		DialTimeout:  3 * time.Second,
		WriteTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fakes.Dial(url); ok {
		dialFake(t, drv, url)
	}
	if err := drv.Provision(context.Background(), probe.Plan{Groups: groups}); err != nil {
		t.Fatal(err)
	}
	return drv
}

// recorder records what a session reports.
type recorder struct {
	mu         sync.Mutex
	acks       []uint64
	rejects    []string
	deliveries []string
	// ats holds each delivery's At, and badAt the deliveries whose At
	// was unset or later than their OnDelivery.
	ats   []int64
	badAt []string
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acks = append(r.acks, ref)
}

func (r *recorder) OnReject(ref uint64, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejects = append(r.rejects, fmt.Sprintf("%d %s", ref, reason))
}

func (r *recorder) OnDelivery(d *probe.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kind := "direct"
	if d.Group {
		kind = "group"
	}
	if d.Recovered {
		kind = "recovered " + kind
	}
	r.deliveries = append(r.deliveries, fmt.Sprintf("%s %s %s", kind, d.From, d.Body))
	r.ats = append(r.ats, d.At)
	if now := time.Now().UnixNano(); d.At == 0 || d.At > now {
		r.badAt = append(r.badAt, fmt.Sprintf("%s %s: At %d, OnDelivery at %d", kind, d.Body, d.At, now))
	}
}

// checkAt checks that every delivery so far had its At set, no later than
// its OnDelivery and not before notBefore[i] (Unix ns), the time before
// the server wrote delivery i.
func (r *recorder) checkAt(t *testing.T, notBefore ...int64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.badAt {
		t.Errorf("delivery %s: want At set and at most the time of OnDelivery", b)
	}
	if len(notBefore) != len(r.ats) {
		t.Fatalf("%d deliveries, want %d", len(r.ats), len(notBefore))
	}
	for i, at := range r.ats {
		if at < notBefore[i] {
			t.Errorf("delivery %d (%s): At %d is %v before the server wrote it", i, r.deliveries[i], at, time.Duration(notBefore[i]-at))
		}
	}
}

func (r *recorder) snapshot() (acks []uint64, rejects, deliveries []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.acks), slices.Clone(r.rejects), slices.Clone(r.deliveries)
}

// serve runs s.Serve(h) and returns its result on a channel.
func serve(s probe.Session, h probe.Handler) chan error {
	done := make(chan error, 1)
	go func() { done <- s.Serve(h) }()
	return done
}

func wait(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	return nil
}

// checkStanzas checks every stanza the client sent carries the client
// namespace: Prosody ends the stream on one that does not.
func checkStanzas(t *testing.T, frames []string) {
	t.Helper()
	for _, f := range frames {
		for _, name := range []string{"<message", "<presence", "<iq"} {
			if strings.HasPrefix(f, name) && !strings.HasPrefix(f, name+` xmlns="jabber:client"`) {
				t.Errorf("client sent %q without xmlns=\"jabber:client\"", f)
			}
		}
	}
}

// TestLogin plays a whole login: several elements per frame, SASL PLAIN,
// bind, stream management, presence, a room that the join creates (and
// that the client unlocks) and one that exists. Connect must return only
// once the client is in both rooms.
func TestLogin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hold = 300 * time.Millisecond
		url, peers := fakeServer(t, func(p *peer) {
			p.login("alice")
			p.expect(`<presence xmlns="jabber:client" to="newroom@conference.localhost/alice"><x xmlns="http://jabber.org/protocol/muc"><history maxstanzas="0"/></x></presence>`)
			p.expect(`<presence xmlns="jabber:client" to="oldroom@conference.localhost/alice">`)
			p.send(srvSelf("newroom", "alice", true))
			iq := p.expect(`to="newroom@conference.localhost"><query xmlns="http://jabber.org/protocol/muc#owner"><x xmlns="jabber:x:data" type="submit"/></query></iq>`)
			p.send(`<iq type='result' id='` + between(iq, `id="`, `"`) + `' from='newroom@conference.localhost' xmlns='jabber:client'/>`)
			// The second room answers late, after another occupant.
			time.Sleep(hold)
			p.send(`<presence from='oldroom@conference.localhost/bob' xmlns='jabber:client'><x xmlns='http://jabber.org/protocol/muc#user'><item affiliation='none' role='participant'/></x></presence>`,
				srvSelf("oldroom", "alice", false))
			p.drain()
		})
		drv := newDriver(t, url,
			probe.Group{Name: "newroom", Members: []string{"alice", "bob"}},
			probe.Group{Name: "oldroom", Members: []string{"alice", "carol"}})
		t0 := time.Now()
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		if took := time.Since(t0); took < hold {
			t.Errorf("Connect returned after %v, before the second room answered (%v)", took, hold)
		}
		done := serve(s, &recorder{})
		_ = s.Close()
		if r := probe.ReasonOf(wait(t, done)); r != metrics.ReasonShutdown {
			t.Errorf("Serve after Close: reason %s, want shutdown", r)
		}
		p := <-peers
		frames := p.frames()
		checkStanzas(t, frames)
		if last := frames[len(frames)-1]; last != `<close xmlns="urn:ietf:params:xml:ns:xmpp-framing"/>` {
			t.Errorf("last frame = %q, want the framing <close/>", last)
		}
	})
}

// TestStreamManagement checks both directions of XEP-0198 counting: the
// client answers <r/> with the number of stanzas it handled (several per
// frame, stanzas only), and maps the server's <a h/> back to the refs of
// its direct messages, in order; group messages are acked by reflection.
func TestStreamManagement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sentAt := make(chan int64, 1)
		url, peers := fakeServer(t, func(p *peer) {
			p.login("alice")
			// Three stanzas and a request in one frame, after the answer to
			// the carbons request: h must be 4.
			sentAt <- time.Now().UnixNano()
			p.send(`<message from='bob@localhost/imcanary' type='chat' id='m1' xmlns='jabber:client'><body>hi</body></message>` +
				`<presence from='bob@localhost/imcanary' xmlns='jabber:client'/>` +
				`<iq type='result' id='x' xmlns='jabber:client'/>` + srvR)
			for a := p.read(); a != `<a xmlns="urn:xmpp:sm:3" h="4"/>`; a = p.read() {
				// An ack sent unasked, for the carbons answer, may come
				// first.
				if a != `<a xmlns="urn:xmpp:sm:3" h="1"/>` {
					t.Errorf("answer to <r/> = %q, want h=4", a)
					break
				}
			}
			// The client's stanzas: the carbons request (1), initial
			// presence (2), then 101 (3), 104 to the room (4), 102 (5),
			// 103 (6). Each direct message is followed by a request.
			p.expect(`id="101"`)
			p.expect(`<r xmlns="urn:xmpp:sm:3"/>`)
			p.expect(`type="groupchat" to="room@conference.localhost" id="104"`)
			p.expect(`id="102"`)
			p.expect(`<r xmlns="urn:xmpp:sm:3"/>`)
			p.expect(`id="103"`)
			p.expect(`<r xmlns="urn:xmpp:sm:3"/>`)
			p.send(`<a xmlns='urn:xmpp:sm:3' h='5'/>`)
			p.send(`<message from='room@conference.localhost/alice' id='104' type='groupchat' xmlns='jabber:client'><body>g</body></message>`)
			p.send(`<a xmlns='urn:xmpp:sm:3' h='6'/>`)
			p.drain()
		})
		drv := newDriver(t, url)
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		done := serve(s, r)
		// Pings run concurrently with sends: both must be safe.
		stop := make(chan struct{})
		var pings sync.WaitGroup
		pings.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = s.Ping()
					time.Sleep(time.Millisecond)
				}
			}
		})
		testwait.For(t, 3*time.Second, "the delivery", func() bool { _, _, d := r.snapshot(); return len(d) == 1 })
		for _, m := range []*probe.Message{
			{Ref: 101, To: "bob", Body: []byte("a")},
			{Ref: 104, Group: "room", Body: []byte("g")},
			{Ref: 102, To: "bob", Body: []byte("b")},
			{Ref: 103, To: "carol", Body: []byte("c")},
		} {
			if err := s.Send(m); err != nil {
				t.Fatalf("Send(%d) = %v", m.Ref, err)
			}
		}
		testwait.For(t, 3*time.Second, "four acks", func() bool { a, _, _ := r.snapshot(); return len(a) == 4 })
		close(stop)
		pings.Wait()
		acks, _, deliveries := r.snapshot()
		if want := []uint64{101, 102, 104, 103}; !slices.Equal(acks, want) {
			t.Errorf("acks = %v, want %v", acks, want)
		}
		if want := []string{"direct bob hi"}; !slices.Equal(deliveries, want) {
			t.Errorf("deliveries = %q, want %q", deliveries, want)
		}
		r.checkAt(t, <-sentAt)
		_ = s.Close()
		if r := probe.ReasonOf(wait(t, done)); r != metrics.ReasonShutdown {
			t.Errorf("reason %s, want shutdown", r)
		}
		p := <-peers
		checkStanzas(t, p.frames())
	})
}

// TestDeliveries checks which messages are deliveries: others' group and
// direct messages, including late ones from offline storage; not our own
// reflections (acks), the room's history replay, subjects or bodiless
// messages; errors are rejections.
func TestDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sentAt := make(chan int64, 1)
		url, _ := fakeServer(t, func(p *peer) {
			p.login("alice", "room")
			sentAt <- time.Now().UnixNano()
			p.send(
				`<message from='room@conference.localhost/bob' id='b1' type='groupchat' xmlns='jabber:client'><body>imc1 group</body></message>`,
				`<message from='room@conference.localhost/alice' id='7' type='groupchat' xmlns='jabber:client'><body>mine</body></message>`,
				`<message from='room@conference.localhost/bob' type='groupchat' xmlns='jabber:client'><body>history</body><delay xmlns='urn:xmpp:delay' from='room@conference.localhost' stamp='2025-01-01T00:00:00Z'/></message>`,
				`<message from='room@conference.localhost' type='groupchat' xmlns='jabber:client'><subject/></message>`+
					`<message from='carol@localhost/imcanary' type='chat' xmlns='jabber:client'><body>imc1 offline</body><delay xmlns='urn:xmpp:delay' from='localhost' stamp='2025-01-01T00:00:00Z'/></message>`,
				`<message from='nobody@localhost' id='9' type='error' xmlns='jabber:client'><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></message>`,
				`<message from='bob@localhost/imcanary' type='chat' xmlns='jabber:client'><active xmlns='http://jabber.org/protocol/chatstates'/></message>`,
				`<message from='bob@localhost/imcanary' type='chat' xmlns='jabber:client'><body>imc1 &lt;direct&gt;</body></message>`,
				// Another occupant leaving (Prosody's words for a closed
				// stream) is no reason to end our session.
				`<presence type='unavailable' xmlns='jabber:client' from='room@conference.localhost/bob'><status>Kicked: recipient unavailable</status><x xmlns='http://jabber.org/protocol/muc#user'><status code='333'/><item affiliation='none' role='none'/></x></presence>`,
				srvR)
			// The carbons answer, the room's self-presence, eight messages
			// and a presence.
			for f := p.read(); f != `<a xmlns="urn:xmpp:sm:3" h="11"/>`; f = p.read() {
				if f == "" {
					t.Error("no <a h=\"11\"/> for the carbons answer, the self-presence, eight messages and a presence")
					return
				}
			}
			p.drain()
		})
		drv := newDriver(t, url, probe.Group{Name: "room", Members: []string{"alice", "bob"}})
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		done := serve(s, r)
		testwait.For(t, 3*time.Second, "three deliveries", func() bool { _, _, d := r.snapshot(); return len(d) == 3 })
		time.Sleep(50 * time.Millisecond)
		_ = s.Close()
		if reason := probe.ReasonOf(wait(t, done)); reason != metrics.ReasonShutdown {
			t.Errorf("Serve() ended with reason %s, want shutdown by our Close", reason)
		}
		acks, rejects, deliveries := r.snapshot()
		if want := []string{"group bob imc1 group", "direct carol imc1 offline", "direct bob imc1 <direct>"}; !slices.Equal(deliveries, want) {
			t.Errorf("deliveries = %q, want %q", deliveries, want)
		}
		if want := []uint64{7}; !slices.Equal(acks, want) {
			t.Errorf("acks = %v, want %v", acks, want)
		}
		if want := []string{"9 service-unavailable"}; !slices.Equal(rejects, want) {
			t.Errorf("rejects = %q, want %q", rejects, want)
		}
		sent := <-sentAt
		r.checkAt(t, sent, sent, sent)
	})
}

// TestDeliveryAtDuringLogin: a message that arrives while Connect is still
// logging in (offline storage, flushed in the frame that enables stream
// management, before the room join completes in a later frame) is handled
// only when Serve starts, but its At is when its own frame was read, not
// the login's last frame or Serve's start; one that arrives later is
// stamped later.
func TestDeliveryAtDuringLogin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const gap = 100 * time.Millisecond
		sentAt := make(chan int64, 2)
		joinedAt := make(chan int64, 1)
		url, _ := fakeServer(t, func(p *peer) {
			p.expect(`<open xmlns="urn:ietf:params:xml:ns:xmpp-framing"`)
			p.send(srvOpen + srvFeatures)
			p.expect(`<auth xmlns="urn:ietf:params:xml:ns:xmpp-sasl" mechanism="PLAIN">`)
			p.send(srvSuccess)
			p.expect(`<open xmlns="urn:ietf:params:xml:ns:xmpp-framing"`)
			p.send(srvOpen + srvBound)
			p.expect(`id="bind"`)
			p.send(srvBindResult("alice"))
			p.expect(`<enable xmlns="urn:xmpp:sm:3"/>`)
			p.expect(cliCarbons)
			p.expect(`<presence xmlns="jabber:client"/>`)
			p.expect(`to="room@conference.localhost/alice"`)
			sentAt <- time.Now().UnixNano()
			p.send(srvEnabled + `<message from='carol@localhost/imcanary' type='chat' xmlns='jabber:client'><body>imc1 early</body></message>`)
			time.Sleep(gap)
			joinedAt <- time.Now().UnixNano()
			p.send(srvCarbons + srvSelf("room", "alice", false))
			time.Sleep(2 * gap)
			sentAt <- time.Now().UnixNano()
			p.send(`<message from='bob@localhost/imcanary' type='chat' xmlns='jabber:client'><body>imc1 late</body></message>`)
			p.drain()
		})
		drv := newDriver(t, url, probe.Group{Name: "room", Members: []string{"alice", "bob"}})
		s, err := drv.Connect(context.Background(), "alice", probe.Device{})
		if err != nil {
			t.Fatal(err)
		}
		connected := time.Now().UnixNano()
		time.Sleep(gap)
		r := &recorder{}
		done := serve(s, r)
		testwait.For(t, 3*time.Second, "two deliveries", func() bool { _, _, d := r.snapshot(); return len(d) == 2 })
		_ = s.Close()
		wait(t, done)
		if _, _, d := r.snapshot(); !slices.Equal(d, []string{"direct carol imc1 early", "direct bob imc1 late"}) {
			t.Fatalf("deliveries = %q, want the early one, then the late one", d)
		}
		r.checkAt(t, <-sentAt, <-sentAt)
		r.mu.Lock()
		defer r.mu.Unlock()
		if joined := <-joinedAt; r.ats[0] >= joined || r.ats[0] > connected {
			t.Errorf("delivery read during login: At %d, want the time its frame was read: before the join's frame was written (%d) and Connect returned (%d)",
				r.ats[0], joined, connected)
		}
	})
}

// TestDisconnectReasons checks each way a session can end is classified:
// imcanary_session_disconnects_total{reason="slow_consumer"} must mean the
// server's slow-reader close and nothing else.
func TestDisconnectReasons(t *testing.T) {
	endWith := func(frames ...string) func(p *peer) {
		return func(p *peer) {
			p.send(frames...)
			p.closeWith(websocket.CloseNormalClosure, "Stream closed")
		}
	}
	tests := []struct {
		name     string
		server   func(p *peer)
		ourClose bool
		reason   string
		code     int
		text     string
	}{
		{name: "policy violation", server: endWith(streamError("policy-violation", ""), srvClose),
			reason: metrics.ReasonSlowConsumer, code: 1000, text: "policy-violation"},
		{name: "too many unacked stanzas",
			server: endWith(streamError("resource-constraint", "Too many unacked stanzas remaining, session can't be resumed"), srvClose),
			reason: metrics.ReasonSlowConsumer, code: 1000, text: "resource-constraint: Too many unacked stanzas"},
		{name: "conflict", server: endWith(streamError("conflict", "Replaced by new connection"), srvClose),
			reason: metrics.ReasonConflict, code: 1000, text: "conflict: Replaced by new connection"},
		{name: "system shutdown", server: endWith(streamError("system-shutdown", "Server is shutting down"), srvClose),
			reason: metrics.ReasonServerClose, code: 1000, text: "system-shutdown"},
		{name: "stream error without a close frame", server: func(p *peer) {
			p.send(streamError("connection-timeout", ""))
			p.c.NetConn().Close()
		}, reason: metrics.ReasonServerClose, text: "connection-timeout"},
		{name: "stream closed", server: endWith(srvClose), reason: metrics.ReasonServerClose, code: 1000, text: "stream closed"},
		{name: "going away", server: func(p *peer) { p.closeWith(websocket.CloseGoingAway, "bye") },
			reason: metrics.ReasonServerClose, code: 1001, text: "bye"},
		{name: "kicked from room", server: func(p *peer) {
			p.send(`<presence type='unavailable' from='room@conference.localhost/alice' xmlns='jabber:client'><x xmlns='http://jabber.org/protocol/muc#user'><status code='307'/><status code='110'/></x></presence>`)
			p.drain()
		}, reason: metrics.ReasonServerClose, text: "removed from room room@conference.localhost"},
		{name: "connection dropped", server: func(p *peer) { p.c.NetConn().Close() }, reason: metrics.ReasonError},
		{name: "malformed frame", server: func(p *peer) {
			p.send(`<message xmlns='jabber:client'><body>`)
			p.drain()
		}, reason: metrics.ReasonError, text: "malformed frame"},
		{name: "our shutdown", server: func(p *peer) { p.drain() }, ourClose: true, reason: metrics.ReasonShutdown},
		{name: "our shutdown, server silent", server: func(p *peer) {
			for p.read() != "" {
			}
		}, ourClose: true, reason: metrics.ReasonShutdown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				url, _ := fakeServer(t, func(p *peer) {
					p.login("alice")
					tt.server(p)
				})
				drv := newDriver(t, url)
				s, err := drv.Connect(context.Background(), "alice", probe.Device{})
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				if tt.ourClose {
					go func() { time.Sleep(50 * time.Millisecond); _ = s.Close() }()
				}
				got := wait(t, serve(s, &recorder{}))
				var d *probe.Disconnect
				if !errors.As(got, &d) {
					t.Fatalf("Serve() = %v, want a *probe.Disconnect", got)
				}
				if d.Reason != tt.reason || d.Code != tt.code || !strings.Contains(d.Text+" "+d.Error(), tt.text) {
					t.Errorf("Serve() = %v (reason %q, code %d), want reason %q, code %d, text containing %q",
						d, d.Reason, d.Code, tt.reason, tt.code, tt.text)
				}
			})
		})
	}
}

// TestWriteTimeoutEndsSession: a server that stops reading makes a write
// time out. The session must end (so the user reconnects) rather than stay
// online, reading, with a connection that can never send again.
func TestWriteTimeoutEndsSession(t *testing.T) {
	// The server holds the connection, never reading, until the test is
	// over (cleanups run last first: before the server's close).
	release := make(chan struct{})
	url, _ := fakeServer(t, func(p *peer) {
		p.login("alice")
		<-release
	})
	t.Cleanup(func() { close(release) })
	drv := newDriver(t, url)
	s, err := drv.Connect(context.Background(), "alice", probe.Device{})
	if err != nil {
		t.Fatal(err)
	}
	done := serve(s, &recorder{})
	big := bytes.Repeat([]byte("x"), 60<<10)
	var sendErr error
	for i := 0; i < 2000 && sendErr == nil; i++ {
		sendErr = s.Send(&probe.Message{Ref: uint64(i), To: "bob", Body: big})
	}
	if sendErr == nil {
		t.Fatal("no write timed out against a server that never reads")
	}
	if r := probe.ReasonOf(wait(t, done)); r != metrics.ReasonError {
		t.Errorf("reason %s, want error", r)
	}
	// Close must not wait for the stuck writer.
	t0 := time.Now()
	_ = s.Close()
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Errorf("Close took %v", d)
	}
}
