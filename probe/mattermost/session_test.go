package mattermost

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// recorder is a Handler that keeps what it is given.
type recorder struct {
	deliveries []probe.Delivery
}

func (r *recorder) OnAck(uint64, probe.Ack) {}
func (r *recorder) OnReject(uint64, string) {}
func (r *recorder) OnDelivery(d *probe.Delivery) {
	c := *d
	c.From = append([]byte(nil), d.From...)
	c.Body = append([]byte(nil), d.Body...)
	r.deliveries = append(r.deliveries, c)
}

// newTestSession returns a session of user "imc-a", who is in the group
// channel gch (group g1, with imc-b) and the direct channel dch, against
// the server at url.
func newTestSession(tb testing.TB, url string) *session {
	tb.Helper()
	d, err := New(DefaultConfig(), Options{URL: url, Secret: []byte("s")})
	if err != nil {
		tb.Fatal(err)
	}
	d.ids = map[string]string{"imc-a": "uida", "imc-b": "uidb"}
	d.names = map[string]string{"uida": "imc-a", "uidb": "imc-b"}
	d.groups["g1"] = "gch"
	d.directs[pairKey("imc-a", "imc-b")] = "dch"
	d.channels["gch"] = room{group: true, name: "g1"}
	d.channels["dch"] = room{}
	d.of.Replace([]string{"imc-a"}, map[string][]string{"imc-a": {"gch", "dch"}})
	return &session{d: d, user: "imc-a", token: "tok", pos: d.position("imc-a", 0), catchUp: true, loginAt: 5e15}
}

// posted is a posted event of seq, as Mattermost sends it: the post is a
// JSON string inside the event.
func posted(seq int64, channel, userID, message string, createAt int64) string {
	p, _ := json.Marshal(post{ID: "p" + message, CreateAt: createAt, UserID: userID, ChannelID: channel, Message: message})
	data, _ := json.Marshal(map[string]string{"post": string(p), "channel_type": "G", "sender_name": "@x"})
	f, _ := json.Marshal(map[string]any{"event": "posted", "seq": seq, "data": json.RawMessage(data), "broadcast": map[string]string{"channel_id": channel}})
	return string(f)
}

const hello = `{"event":"hello","data":{"connection_id":"c1","server_version":"6.7.2"},"broadcast":{},"seq":0}`

func TestRead(t *testing.T) {
	const body = "imc1 run imc-b g.g1 1 100 0-0"
	for _, tc := range []struct {
		name         string
		frames       []string
		want         []probe.Delivery
		gaps, missed uint64
		unmatched    uint64
		err          string
	}{{
		name:   "group and direct",
		frames: []string{hello, posted(1, "gch", "uidb", body, 10), posted(2, "dch", "uidb", body, 11)},
		want:   []probe.Delivery{{From: []byte("imc-b"), Group: true, Body: []byte(body), At: 7}, {From: []byte("imc-b"), Body: []byte(body), At: 7}},
	}, {
		name:   "reply and other events",
		frames: []string{hello, `{"status":"OK","seq_reply":1}`, `{"event":"typing","data":{},"broadcast":{},"seq":1}`, posted(2, "gch", "uidb", body, 10)},
		want:   []probe.Delivery{{From: []byte("imc-b"), Group: true, Body: []byte(body), At: 7}},
	}, {
		name:   "seq gap",
		frames: []string{hello, posted(1, "gch", "uidb", body, 10), posted(5, "gch", "uidb", body, 11)},
		want:   []probe.Delivery{{From: []byte("imc-b"), Group: true, Body: []byte(body), At: 7}, {From: []byte("imc-b"), Group: true, Body: []byte(body), At: 7}},
		gaps:   1, missed: 3,
	}, {
		name:      "foreign channel, unknown user, system post",
		frames:    []string{hello, posted(1, "other", "uidb", body, 10), posted(2, "gch", "uidz", body, 10), posted(3, "gch", "uidb", "", 10)},
		unmatched: 3,
	}, {
		name:   "event without seq",
		frames: []string{hello, `{"event":"posted","data":{}}`},
		err:    "without seq",
	}, {
		name:   "post not a string",
		frames: []string{hello, `{"event":"posted","seq":1,"data":{"post":{"id":"x"}}}`},
		err:    "data.post",
	}, {
		name:   "post not JSON",
		frames: []string{hello, `{"event":"posted","seq":1,"data":{"post":"{\"id\":"}}`},
		err:    "its post",
	}, {
		name:   "not JSON",
		frames: []string{hello, `{"event":`},
		err:    "unexpected end",
	}, {
		name:   "hello without connection id",
		frames: []string{`{"event":"hello","seq":0,"data":{}}`},
		err:    "connection_id",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t, "http://127.0.0.1:9")
			s.catchUp = false
			r := &recorder{}
			var err error
			for _, f := range tc.frames {
				if err = s.read([]byte(f), 7, r); err != nil {
					break
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(r.deliveries) != len(tc.want) {
				t.Fatalf("%d deliveries, want %d: %+v", len(r.deliveries), len(tc.want), r.deliveries)
			}
			for i, w := range tc.want {
				g := r.deliveries[i]
				if string(g.From) != string(w.From) || g.Group != w.Group || string(g.Body) != string(w.Body) || g.At != w.At || g.Recovered != w.Recovered {
					t.Errorf("delivery %d: %+v, want %+v", i, g, w)
				}
			}
			if g, m := s.d.ServerGaps(); g != tc.gaps || m != tc.missed {
				t.Errorf("gaps %d (%d missed), want %d (%d)", g, m, tc.gaps, tc.missed)
			}
			if n := s.d.FramesUnmatched(); n != tc.unmatched {
				t.Errorf("unmatched %d, want %d", n, tc.unmatched)
			}
		})
	}
}

// TestResume: a resumed connection's replayed events intended before the
// login count recovered; a new hello on a resume means the server lost the
// queue, and the session fetches its channels' posts since just before
// the newest it had, as recovered.
func TestResume(t *testing.T) {
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		queries = append(queries, r.URL.Path+"?"+r.URL.RawQuery)
		ch := strings.Split(r.URL.Path, "/")[4]
		p1 := post{ID: "a", CreateAt: 20, UserID: "uidb", ChannelID: ch, Message: "imc1 run imc-b x 2 100 0-0"}
		p0 := post{ID: "b", CreateAt: 19, UserID: "uidb", ChannelID: ch, Message: "imc1 run imc-b x 1 100 0-0"}
		_ = json.NewEncoder(w).Encode(postList{Order: []string{"a", "b"}, Posts: map[string]*post{"a": &p1, "b": &p0}})
	}))
	defer srv.Close()

	s := newTestSession(t, srv.URL)
	s.resuming, s.connID, s.next = true, "c0", 41
	s.pos.since = 50000
	r := &recorder{}
	// Replayed: intended (100 ns) before the login.
	if err := s.read([]byte(posted(41, "gch", "uidb", "imc1 run imc-b g.g1 9 100 0-0", 60000)), 7, r); err != nil {
		t.Fatal(err)
	}
	if len(r.deliveries) != 1 || !r.deliveries[0].Recovered {
		t.Fatalf("replayed event: %+v, want one recovered delivery", r.deliveries)
	}
	if _, next, since := s.pos.get(); next != 42 || since != 60000 {
		t.Errorf("position next %d since %d, want 42 and 60000", next, since)
	}
	// The server starts over: a new hello.
	r.deliveries = nil
	if err := s.read([]byte(strings.Replace(hello, "c1", "c2", 1)), 7, r); err != nil {
		t.Fatal(err)
	}
	if len(queries) != 2 || queries[0] != "/api/v4/channels/gch/posts?since=30000" || queries[1] != "/api/v4/channels/dch/posts?since=30000" {
		t.Errorf("fetched %q, want both channels since 60000 less the slack", queries)
	}
	if len(r.deliveries) != 4 {
		t.Fatalf("%d deliveries after the new hello, want 4 (2 per channel)", len(r.deliveries))
	}
	for i, d := range r.deliveries {
		if !d.Recovered {
			t.Errorf("fetched delivery %d not recovered", i)
		}
	}
	if !strings.Contains(string(r.deliveries[0].Body), " 1 ") {
		t.Errorf("first fetched %q: want the oldest first", r.deliveries[0].Body)
	}
	if id, next, _ := s.pos.get(); id != "c2" || next != 1 {
		t.Errorf("position %s/%d after the new hello, want c2/1", id, next)
	}

	// A fetch the server refuses ends the session: what it would have
	// brought cannot be skipped silently.
	s.token = "bad"
	err := s.read([]byte(strings.Replace(hello, "c1", "c3", 1)), 7, r)
	if d, ok := errors.AsType[*probe.Disconnect](err); !ok || d.Reason != metrics.ReasonError {
		t.Errorf("refused fetch: %v, want an error disconnect", err)
	}
}

func TestEnded(t *testing.T) {
	r := &reader{}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&websocket.CloseError{Code: websocket.CloseNoStatusReceived}, metrics.ReasonSlowConsumer},
		{&websocket.CloseError{Code: websocket.CloseGoingAway}, metrics.ReasonServerClose},
		{&websocket.CloseError{Code: websocket.CloseAbnormalClosure}, metrics.ReasonError},
		{errors.New("reset"), metrics.ReasonError},
	} {
		if got := r.Ended(tc.err); got.Reason != tc.want {
			t.Errorf("%v: %s, want %s", tc.err, got.Reason, tc.want)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	if errs := DefaultConfig().Validate(); len(errs) != 0 {
		t.Fatalf("default config: %v", errs[0])
	}
	for _, tc := range []struct {
		key string
		set func(*Config)
	}{
		{"email_domain", func(c *Config) { c.EmailDomain = "no spaces" }},
		{"email_domain", func(c *Config) { c.EmailDomain = "localhost" }},
		{"max_sends", func(c *Config) { c.MaxSends = 0 }},
		{"send_retries", func(c *Config) { c.SendRetries = 11 }},
		{"max_connections", func(c *Config) { c.MaxConnections = 0 }},
		{"max_body", func(c *Config) { c.MaxBody = 10 }},
		{"max_frame", func(c *Config) { c.MaxFrame = 10 }},
		{"catchup_posts", func(c *Config) { c.CatchupPosts = 0 }},
	} {
		c := DefaultConfig()
		tc.set(&c)
		errs := c.Validate()
		if len(errs) != 1 || errs[0].Key != tc.key {
			t.Errorf("%s: %v, want one error for it", tc.key, errs)
		}
	}
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		url, secret, err string
	}{
		{"", "s", "no url"},
		{"ws://127.0.0.1:8065", "s", "site URL"},
		{"http://127.0.0.1:8065", "", "no secret"},
	} {
		_, err := New(DefaultConfig(), Options{URL: tc.url, Secret: []byte(tc.secret)})
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %v, want %q", tc.url, err, tc.err)
		}
	}
	d, err := New(DefaultConfig(), Options{URL: "https://chat.example:8443/mm/", Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	if d.ws.URL != "wss://chat.example:8443/mm/api/v4/websocket" || d.base != "https://chat.example:8443/mm" {
		t.Errorf("ws %s, base %s", d.ws.URL, d.base)
	}
}
