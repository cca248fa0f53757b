package matrix

import (
	"context"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
)

// recorder is a Handler that keeps what it is given.
type recorder struct {
	acks, rejects []uint64
	deliveries    []probe.Delivery
}

func (r *recorder) OnAck(ref uint64, _ probe.Ack) { r.acks = append(r.acks, ref) }
func (r *recorder) OnReject(ref uint64, _ string) { r.rejects = append(r.rejects, ref) }
func (r *recorder) OnDelivery(d *probe.Delivery) {
	c := *d
	c.From = append([]byte(nil), d.From...)
	c.Body = append([]byte(nil), d.Body...)
	r.deliveries = append(r.deliveries, c)
}

// newTestSession returns a session of user "imc-a" that knows two rooms,
// the group !g:localhost (g1) and the direct room !d:localhost, on a
// server nobody listens at.
func newTestSession(tb testing.TB) *session {
	tb.Helper()
	d, err := New(DefaultConfig(), Options{URL: "http://127.0.0.1:9", Secret: []byte("s")})
	if err != nil {
		tb.Fatal(err)
	}
	d.groups["g1"] = "!g:localhost"
	d.directs[pairKey("imc-a", "imc-b")] = "!d:localhost"
	d.rooms["!g:localhost"] = room{group: true, name: "g1"}
	d.rooms["!d:localhost"] = room{}
	s := &session{d: d, user: "imc-a", since: "s0"}
	s.conn = d.pool.NewConn(context.Background(), probe.Link{})
	tb.Cleanup(func() { _ = s.conn.Close() })
	return s
}

func TestAnswer(t *testing.T) {
	const body = "imc1 run imc-b g.g1 1 100 0-0"
	for _, tc := range []struct {
		name, answer string
		want         []probe.Delivery
		unmatched    uint64
		err          string
		since        string
	}{{
		name:   "group and direct",
		answer: `{"next_batch":"s1","rooms":{"join":{"!g:localhost":{"timeline":{"events":[{"type":"m.room.message","event_id":"$1","sender":"@imc-b:localhost","content":{"msgtype":"m.text","body":"` + body + `"}}]}}}}}`,
		want:   []probe.Delivery{{From: []byte("imc-b"), Group: true, Body: []byte(body), At: 7}},
		since:  "s1",
	}, {
		name:   "direct",
		answer: `{"next_batch":"s2","rooms":{"join":{"!d:localhost":{"timeline":{"events":[{"type":"m.room.message","event_id":"$2","sender":"@imc-b:localhost","content":{"msgtype":"m.text","body":"x"}}]}}}}}`,
		want:   []probe.Delivery{{From: []byte("imc-b"), Body: []byte("x"), At: 7}},
		since:  "s2",
	}, {
		name:      "room nobody made",
		answer:    `{"next_batch":"s3","rooms":{"join":{"!other:localhost":{"timeline":{"events":[{"type":"m.room.message","content":{"body":"x"}}]}}}}}`,
		unmatched: 1, since: "s3",
	}, {
		name:      "not a text message",
		answer:    `{"next_batch":"s4","rooms":{"join":{"!g:localhost":{"timeline":{"events":[{"type":"m.room.message","content":{"msgtype":"m.image"}}]}}}}}`,
		unmatched: 1, since: "s4",
	}, {
		name: "nothing new", answer: `{"next_batch":"s5"}`, since: "s5",
	}, {
		name: "no next_batch", answer: `{"rooms":{}}`, err: "no next_batch", since: "s0",
	}, {
		name: "not JSON", answer: `<html>`, err: "malformed /sync", since: "s0",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t)
			r := &recorder{}
			s.answers.Serve(r)
			err := s.Answer(&longpoll.Response{Status: 200, Body: []byte(tc.answer), At: 7})
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one saying %q", err, tc.err)
			}
			if len(r.deliveries) != len(tc.want) {
				t.Fatalf("deliveries %+v, want %+v", r.deliveries, tc.want)
			}
			for i, d := range r.deliveries {
				w := tc.want[i]
				if string(d.From) != string(w.From) || d.Group != w.Group || string(d.Body) != string(w.Body) || d.At != w.At || d.Recovered {
					t.Errorf("delivery %+v, want %+v", d, w)
				}
			}
			if got := s.d.FramesUnmatched(); got != tc.unmatched {
				t.Errorf("unmatched %d, want %d", got, tc.unmatched)
			}
			if s.since != tc.since {
				t.Errorf("next poll since %q, want %q", s.since, tc.since)
			}
		})
	}
}

// TestAnswerStatus: a refused token ends the session for a new login; a
// server error ends it as an error.
func TestAnswerStatus(t *testing.T) {
	s := newTestSession(t)
	s.answers.Serve(&recorder{})
	s.d.setToken("imc-a", 0, "tok")
	err := s.Answer(&longpoll.Response{Status: 401, Body: []byte(`{"errcode":"M_UNKNOWN_TOKEN","error":"Unknown token"}`)})
	if probe.ReasonOf(err) != "server_close" || !strings.Contains(err.Error(), "M_UNKNOWN_TOKEN") {
		t.Errorf("401: %v", err)
	}
	if s.d.token("imc-a", 0) != "" {
		t.Error("a refused token kept for the next session")
	}
	err = s.Answer(&longpoll.Response{Status: 502, Body: []byte(`bad gateway`)})
	if probe.ReasonOf(err) != "error" || !strings.Contains(err.Error(), "502") {
		t.Errorf("502: %v", err)
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		key string
		mod func(*Config)
	}{
		{"server_name", func(c *Config) { c.ServerName = "" }},
		{"alias_prefix", func(c *Config) { c.AliasPrefix = "Imc" }},
		{"poll_timeout", func(c *Config) { c.PollTimeout = -1 }},
		{"timeline_limit", func(c *Config) { c.TimelineLimit = 0 }},
		{"catchup_pages", func(c *Config) { c.CatchupPages = 0 }},
		{"max_sends", func(c *Config) { c.MaxSends = 0 }},
		{"send_retries", func(c *Config) { c.SendRetries = 11 }},
		{"max_connections", func(c *Config) { c.MaxConnections = 0 }},
		{"max_body", func(c *Config) { c.MaxBody = 10 }},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		errs := c.Validate()
		if len(errs) != 1 || errs[0].Key != tc.key {
			t.Errorf("%s: %v", tc.key, errs)
		}
	}
	if errs := DefaultConfig().Validate(); len(errs) != 0 {
		t.Errorf("default: %v", errs)
	}
}
