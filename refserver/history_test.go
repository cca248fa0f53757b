package refserver

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// history asks for conv's messages after after, with no "limit" if limit
// is negative, and returns the seqs of the page and the ok that ends it.
// Anything else in between, or a message without the request's id or of
// another conversation, fails the test.
func (c *client) history(conv string, after uint64, limit int) ([]uint64, frame) {
	c.tb.Helper()
	req := map[string]any{"type": "history", "conv": conv, "after": after}
	if limit >= 0 {
		req["limit"] = limit
	}
	id := c.write(req)
	var seqs []uint64
	for {
		f := c.read()
		switch {
		case f.Type == "msg" && f.ID == id && f.Conv == conv:
			seqs = append(seqs, f.Seq)
		case f.Type == "ok" && f.ID == id:
			if f.Conv != conv {
				c.tb.Fatalf("%s: history %s answered for %q", c.user, f.raw, conv)
			}
			return seqs, f
		default:
			c.tb.Fatalf("%s: history of %s: got %s, want its messages and ok with id %q", c.user, conv, f.raw, id)
		}
	}
}

// historyErr asks for conv's history and returns the error that answers
// it, failing the test on anything else.
func (c *client) historyErr(conv string) frame {
	c.tb.Helper()
	id := c.write(map[string]any{"type": "history", "conv": conv})
	f := c.readType("error")
	if f.ID != id {
		c.tb.Fatalf("%s: error %s, want id %q", c.user, f.raw, id)
	}
	return f
}

// seqs asks for the user's conversations and their newest seqs.
func (c *client) seqs() frame {
	c.tb.Helper()
	id := c.write(map[string]any{"type": "seqs"})
	f := c.readType("seqs")
	if f.ID != id || f.Convs == nil {
		c.tb.Fatalf("%s: got %s, want seqs with id %q and convs", c.user, f.raw, id)
	}
	return f
}

func seqRange(lo, hi uint64) []uint64 {
	var s []uint64
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}

// TestHistory pages through a direct conversation's history, within the
// bounds that keep it: HistoryLimit, HistoryBytes, the page limit and
// the room in the send queue.
func TestHistory(t *testing.T) {
	// big bodies make each message count about 1.5 KB against
	// HistoryBytes, whatever the few bytes of its ids.
	big := strings.Repeat("b", 1000)
	tests := []struct {
		name      string
		opts      Options
		body      string
		sent      int
		after     uint64
		limit     int // -1: none
		wantSeqs  []uint64
		wantFirst uint64
		wantMore  bool
		evicted   uint64
	}{
		{name: "everything", sent: 5, limit: -1, wantSeqs: seqRange(1, 5), wantFirst: 1},
		{name: "after a seq", sent: 5, after: 2, limit: -1, wantSeqs: seqRange(3, 5), wantFirst: 1},
		{name: "cut at limit", sent: 5, limit: 2, wantSeqs: seqRange(1, 2), wantFirst: 1, wantMore: true},
		{name: "next page", sent: 5, after: 2, limit: 2, wantSeqs: seqRange(3, 4), wantFirst: 1, wantMore: true},
		{name: "last page exactly", sent: 5, after: 3, limit: 2, wantSeqs: seqRange(4, 5), wantFirst: 1},
		{name: "limit 0 only reports", sent: 5, limit: 0, wantFirst: 1, wantMore: true},
		{name: "after the last", sent: 5, after: 5, limit: -1, wantFirst: 1},
		{name: "after beyond the last", sent: 5, after: 99, limit: -1, wantFirst: 1},
		{
			name: "limit above the maximum is the maximum", opts: Options{SendQueue: 1024}, sent: MaxHistoryPage + 10, limit: 1000,
			wantSeqs: seqRange(1, MaxHistoryPage), wantFirst: 1, wantMore: true,
		},
		{
			name: "no limit is the maximum", opts: Options{SendQueue: 1024}, sent: MaxHistoryPage + 10, after: 5, limit: -1,
			wantSeqs: seqRange(6, MaxHistoryPage+5), wantFirst: 1, wantMore: true,
		},
		{
			// The sender has read every ack, so its queue is empty:
			// room for 7 messages and the ok.
			name: "cut to the room in the send queue", opts: Options{SendQueue: 8}, sent: 20, limit: -1,
			wantSeqs: seqRange(1, 7), wantFirst: 1, wantMore: true,
		},
		{
			name: "HistoryLimit keeps the newest", opts: Options{HistoryLimit: 3}, sent: 5, limit: -1,
			wantSeqs: seqRange(3, 5), wantFirst: 3, evicted: 2,
		},
		{
			name: "asking for what fell out", opts: Options{HistoryLimit: 3}, sent: 5, after: 1, limit: -1,
			wantSeqs: seqRange(3, 5), wantFirst: 3, evicted: 2,
		},
		{name: "history off", opts: Options{HistoryLimit: -1}, sent: 5, limit: -1, wantFirst: 6},
		{
			name: "HistoryBytes keeps the newest", opts: Options{HistoryBytes: 3*(1100+histOverhead) + 100}, body: big, sent: 5, limit: -1,
			wantSeqs: seqRange(3, 5), wantFirst: 3, evicted: 2,
		},
		{
			name: "HistoryBytes below one message keeps none", opts: Options{HistoryBytes: 100}, sent: 2, limit: -1,
			wantFirst: 3, evicted: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, tt.opts)
			u1 := login(t, url, "u1", "t")
			body := tt.body
			if body == "" {
				body = "m"
			}
			// u2 is offline: u1 reads nothing but its acks.
			for range tt.sent {
				u1.sendTo("u2", body)
				u1.readType("ack")
			}
			seqs, ok := u1.history("d:u1:u2", tt.after, tt.limit)
			if !slices.Equal(seqs, tt.wantSeqs) {
				t.Errorf("history after %d limit %d = seqs %v, want %v", tt.after, tt.limit, seqs, tt.wantSeqs)
			}
			if ok.Last != uint64(tt.sent) || ok.First != tt.wantFirst || ok.More != tt.wantMore {
				t.Errorf("history ended with %s, want last %d, first %d, more %v", ok.raw, tt.sent, tt.wantFirst, tt.wantMore)
			}
			u1.roundTrip()
			st := s.Stats()
			if st.HistoryServed != uint64(len(tt.wantSeqs)) || st.HistoryEvicted != tt.evicted {
				t.Errorf("Stats() = %+v, want HistoryServed %d, HistoryEvicted %d", st, len(tt.wantSeqs), tt.evicted)
			}
		})
	}
}

// TestHistoryFrames: a message in a history answer is the pushed frame
// with the request's id added, nothing else changed.
func TestHistoryFrames(t *testing.T) {
	_, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	u1.sendTo("u2", "body \"quoted\" ü")
	u1.readType("ack")
	push := u2.readType("msg")
	id := u2.write(map[string]any{"type": "history", "conv": "d:u1:u2"})
	got := u2.readType("msg")
	want := `{"type":"msg","id":"` + id + `",` + strings.TrimPrefix(string(push.raw), `{"type":"msg",`)
	if string(got.raw) != want {
		t.Errorf("history message = %s, want %s", got.raw, want)
	}
	if ok := u2.readType("ok"); ok.ID != id || ok.Last != 1 || ok.First != 1 || ok.More {
		t.Errorf("history ended with %s, want ok %q with last 1, first 1, more false", ok.raw, id)
	}
}

// TestHistoryByteCapAcrossConversations: HistoryBytes evicts the oldest
// messages of all conversations together.
func TestHistoryByteCapAcrossConversations(t *testing.T) {
	big := strings.Repeat("b", 1000)
	_, url := startServer(t, Options{HistoryBytes: 3*(1100+histOverhead) + 100})
	u1 := login(t, url, "u1", "t")
	for _, to := range []string{"u2", "u2", "u3", "u3"} {
		u1.sendTo(to, big)
		u1.readType("ack")
	}
	for _, tt := range []struct {
		conv      string
		wantSeqs  []uint64
		wantFirst uint64
	}{
		{"d:u1:u2", []uint64{2}, 2},
		{"d:u1:u3", []uint64{1, 2}, 1},
	} {
		seqs, ok := u1.history(tt.conv, 0, -1)
		if !slices.Equal(seqs, tt.wantSeqs) || ok.First != tt.wantFirst || ok.Last != 2 {
			t.Errorf("history %s = %v, %s; want %v with first %d, last 2", tt.conv, seqs, ok.raw, tt.wantSeqs, tt.wantFirst)
		}
	}
}

// TestHistoryMembership: only a member of a conversation may read it: a
// current member of a group, one of the two users of a direct one.
func TestHistoryMembership(t *testing.T) {
	_, url := startServer(t, Options{})
	cs := map[string]*client{}
	for _, u := range []string{"u1", "u2", "u3"} {
		cs[u] = login(t, url, u, "t")
	}
	u1 := cs["u1"]
	u1.write(map[string]any{"type": "group", "group": "g", "members": []string{"u1", "u2"}})
	u1.readType("ok")
	u1.sendTo("u2", "direct")
	u1.readType("ack")
	u1.sendGroup("g", "group")
	u1.readType("ack")
	cs["u2"].readType("msg")
	cs["u2"].readType("msg")

	tests := []struct {
		user, conv string
		wantLast   int64 // -1: not_member
	}{
		{"u1", "d:u1:u2", 1},
		{"u2", "d:u1:u2", 1},
		{"u3", "d:u1:u2", -1},
		{"u1", "g:g", 1},
		{"u2", "g:g", 1},
		{"u3", "g:g", -1},
		{"u1", "g:nosuch", -1},
		// A direct conversation of the user with no message yet.
		{"u1", "d:u1:u9", 0},
		{"u3", "d:u0:u3", 0},
		{"u3", "d:u3:u3", 0},
		// Not a conversation anyone could be in: unsorted, or no pair.
		{"u3", "d:u3:u0", -1},
		{"u1", "d:u1", -1},
		{"u1", "u1:u2", -1},
		{"u1", "x", -1},
	}
	for _, tt := range tests {
		c := cs[tt.user]
		if tt.wantLast < 0 {
			if f := c.historyErr(tt.conv); f.Code != "not_member" {
				t.Errorf("%s: history %q = %s, want not_member", tt.user, tt.conv, f.raw)
			}
		} else {
			seqs, ok := c.history(tt.conv, 0, -1)
			if ok.Last != uint64(tt.wantLast) || ok.First != 1 || len(seqs) != int(tt.wantLast) {
				t.Errorf("%s: history %q = %v, %s; want %d messages and last %d", tt.user, tt.conv, seqs, ok.raw, tt.wantLast, tt.wantLast)
			}
		}
		c.roundTrip() // the connection stays open
	}
}

// TestDirectConversationCollision: "d:a:b:c" is the conversation of a:b
// with c and of a with b:c; the first pair to write owns it, and the other
// can neither write to it nor read it.
func TestDirectConversationCollision(t *testing.T) {
	_, url := startServer(t, Options{})
	ab := login(t, url, "a:b", "t")
	a := login(t, url, "a", "t")
	ab.sendTo("c", "mine")
	if f := ab.readType("ack"); f.Conv != "d:a:b:c" {
		t.Fatalf("ack %s, want conv d:a:b:c", f.raw)
	}
	id := a.sendTo("b:c", "theirs")
	if f := a.readType("error"); f.Code != "conflict" || f.ID != id {
		t.Errorf("send by another pair to d:a:b:c = %s, want a conflict error with id %q", f.raw, id)
	}
	if f := a.historyErr("d:a:b:c"); f.Code != "not_member" {
		t.Errorf("history of d:a:b:c by a = %s, want not_member", f.raw)
	}
	if seqs, ok := ab.history("d:a:b:c", 0, -1); !slices.Equal(seqs, []uint64{1}) || ok.Last != 1 {
		t.Errorf("history of d:a:b:c by a:b = %v, %s; want [1], last 1", seqs, ok.raw)
	}
}

// TestSeqs: the newest seq of every conversation of the user: direct ones
// with a message, groups the user is a member of (0 without a message).
func TestSeqs(t *testing.T) {
	_, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	u3 := login(t, url, "u3", "t")
	for _, g := range []struct {
		name    string
		members []string
	}{{"g", []string{"u1", "u3"}}, {"quiet", []string{"u1"}}, {"other", []string{"u3"}}} {
		u3.write(map[string]any{"type": "group", "group": g.name, "members": g.members})
		u3.readType("ok")
	}
	for range 2 {
		u1.sendTo("u2", "m")
		u1.readType("ack")
	}
	u3.sendTo("u1", "m")
	u3.readType("ack")
	u1.readType("msg")
	for range 3 {
		u3.sendGroup("g", "m")
		u3.readType("ack")
		u1.readType("msg")
	}
	u3.sendGroup("other", "m")
	u3.readType("ack")

	for _, tt := range []struct {
		c    *client
		want map[string]uint64
	}{
		{u1, map[string]uint64{"d:u1:u2": 2, "d:u1:u3": 1, "g:g": 3, "g:quiet": 0}},
		{u3, map[string]uint64{"d:u1:u3": 1, "g:g": 3, "g:other": 1}},
		{login(t, url, "u4", "t"), map[string]uint64{}},
	} {
		if f := tt.c.seqs(); !maps.Equal(f.Convs, tt.want) || f.More {
			t.Errorf("%s: seqs = %s, want convs %v", tt.c.user, f.raw, tt.want)
		}
	}
}

// TestGroupMembershipChange: a member removed from a group gets no more
// of its pushes, may not read its history and no longer has it in seqs;
// added back, it has all three again, and the group's seq went on.
func TestGroupMembershipChange(t *testing.T) {
	_, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	setGroup := func(members ...string) {
		t.Helper()
		u1.write(map[string]any{"type": "group", "group": "g", "members": members})
		u1.readType("ok")
	}
	send := func() {
		t.Helper()
		u1.sendGroup("g", "m")
		u1.readType("ack")
	}
	setGroup("u1", "u2")
	send()
	u2.readType("msg")
	if f := u2.seqs(); !maps.Equal(f.Convs, map[string]uint64{"g:g": 1}) {
		t.Errorf("seqs as a member = %s, want g:g 1", f.raw)
	}

	setGroup("u1", "u3")
	send()
	u2.roundTrip() // no push
	if f := u2.historyErr("g:g"); f.Code != "not_member" {
		t.Errorf("history as a removed member = %s, want not_member", f.raw)
	}
	if f := u2.seqs(); len(f.Convs) != 0 {
		t.Errorf("seqs as a removed member = %s, want no conversations", f.raw)
	}

	setGroup("u2", "u1")
	send()
	if f := u2.readType("msg"); f.Seq != 3 {
		t.Errorf("push after being added back = %s, want seq 3", f.raw)
	}
	if seqs, ok := u2.history("g:g", 0, -1); !slices.Equal(seqs, []uint64{1, 2, 3}) || ok.Last != 3 {
		t.Errorf("history after being added back = %v, %s; want [1 2 3], last 3", seqs, ok.raw)
	}
	if f := u2.seqs(); !maps.Equal(f.Convs, map[string]uint64{"g:g": 3}) {
		t.Errorf("seqs after being added back = %s, want g:g 3", f.raw)
	}
}

// script returns the draws in order, then 0.999 (no fault below 1
// fires).
func script(draws ...float64) func() float64 {
	return func() float64 {
		if len(draws) == 0 {
			return 0.999
		}
		d := draws[0]
		draws = draws[1:]
		return d
	}
}

// TestPushFaults checks the faults that concern history and devices, on
// pushes to the recipient's sessions and the sender's other ones: which
// sessions get the push, and what each one's history answer holds.
func TestPushFaults(t *testing.T) {
	tests := []struct {
		name     string
		faults   Faults
		rand     func() float64
		stall    []string
		sessions map[string]int
		group    bool // u1 sends to the group of every user, else to u2
		// push lists the sessions that get the push, hist the seqs
		// each session's history answer holds (every session's: nil
		// if absent).
		push      []string
		hist      map[string][]uint64
		wantStats Stats
	}{
		{
			name: "drop push: history still has it", faults: Faults{DropPush: 1}, rand: script(0),
			sessions:  map[string]int{"u1": 1, "u2": 1},
			hist:      map[string][]uint64{"u1#0": {1}, "u2#0": {1}},
			wantStats: Stats{DroppedPush: 1},
		},
		{
			name: "drop: hidden from the recipient's history too", faults: Faults{Drop: 1}, rand: script(0),
			sessions:  map[string]int{"u1": 1, "u2": 1},
			hist:      map[string][]uint64{"u1#0": {1}},
			wantStats: Stats{Dropped: 1},
		},
		{
			name: "drop in a group: hidden from that member only", faults: Faults{Drop: 0.5}, rand: script(0, 0.9),
			sessions: map[string]int{"u1": 1, "u2": 1, "u3": 1}, group: true,
			push:      []string{"u3#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u3#0": {1}},
			wantStats: Stats{Dropped: 1, Deliveries: 1},
		},
		{
			name: "drop push in a group: one member", faults: Faults{DropPush: 0.5}, rand: script(0.9, 0),
			sessions: map[string]int{"u1": 1, "u2": 1, "u3": 1}, group: true,
			push:      []string{"u2#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u2#0": {1}, "u3#0": {1}},
			wantStats: Stats{DroppedPush: 1, Deliveries: 1},
		},
		{
			name: "skip device: the first of two", faults: Faults{SkipDevice: 1}, rand: script(0, 0),
			sessions:  map[string]int{"u1": 1, "u2": 2},
			push:      []string{"u2#1"},
			hist:      map[string][]uint64{"u1#0": {1}, "u2#0": {1}, "u2#1": {1}},
			wantStats: Stats{SkippedDevice: 1, Deliveries: 1},
		},
		{
			name: "skip device: the second of two", faults: Faults{SkipDevice: 1}, rand: script(0, 0.75),
			sessions:  map[string]int{"u1": 1, "u2": 2},
			push:      []string{"u2#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u2#0": {1}, "u2#1": {1}},
			wantStats: Stats{SkippedDevice: 1, Deliveries: 1},
		},
		{
			name: "skip device: a lone session is not skipped", faults: Faults{SkipDevice: 1}, rand: script(0, 0),
			sessions:  map[string]int{"u1": 1, "u2": 1},
			push:      []string{"u2#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u2#0": {1}},
			wantStats: Stats{Deliveries: 1},
		},
		{
			name: "self-sync under drop push", faults: Faults{DropPush: 0.5}, rand: script(0.9, 0),
			sessions:  map[string]int{"u1": 2, "u2": 1},
			push:      []string{"u2#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u1#1": {1}, "u2#0": {1}},
			wantStats: Stats{DroppedPush: 1, Deliveries: 1},
		},
		{
			name: "self-sync under drop: hidden from the sender's history", faults: Faults{Drop: 0.5}, rand: script(0.9, 0),
			sessions:  map[string]int{"u1": 2, "u2": 1},
			push:      []string{"u2#0"},
			hist:      map[string][]uint64{"u2#0": {1}},
			wantStats: Stats{Dropped: 1, Deliveries: 1},
		},
		{
			// u2's delivery draws the fault too, but has one session.
			name: "self-sync under skip device", faults: Faults{SkipDevice: 1}, rand: script(0, 0, 0, 0),
			sessions:  map[string]int{"u1": 3, "u2": 1},
			push:      []string{"u1#2", "u2#0"},
			hist:      map[string][]uint64{"u1#0": {1}, "u1#1": {1}, "u1#2": {1}, "u2#0": {1}},
			wantStats: Stats{SkippedDevice: 1, Deliveries: 2},
		},
		{
			name: "stall: every session of the user, history unaffected", stall: []string{"u2"},
			sessions:  map[string]int{"u1": 2, "u2": 2},
			push:      []string{"u1#1"},
			hist:      map[string][]uint64{"u1#0": {1}, "u1#1": {1}, "u2#0": {1}, "u2#1": {1}},
			wantStats: Stats{Stalled: 2, Deliveries: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startServer(t, Options{Faults: tt.faults, Rand: tt.rand, Stall: tt.stall})
			cs := sessions(t, url, tt.sessions)
			from := cs["u1#0"]
			conv := "d:u1:u2"
			if tt.group {
				conv = "g:g"
				from.write(map[string]any{"type": "group", "group": "g", "members": slices.Sorted(maps.Keys(tt.sessions))})
				from.readType("ok")
				from.sendGroup("g", "m")
			} else {
				from.sendTo("u2", "m")
			}
			from.readType("ack")
			names := slices.Sorted(maps.Keys(cs))
			for _, name := range names {
				c := cs[name]
				if slices.Contains(tt.push, name) {
					if f := c.readType("msg"); f.Seq != 1 {
						t.Errorf("%s got %s, want the push of seq 1", name, f.raw)
					}
				}
				c.roundTrip() // no other push
			}
			for _, name := range names {
				seqs, ok := cs[name].history(conv, 0, -1)
				if !slices.Equal(seqs, tt.hist[name]) || ok.Last != 1 || ok.First != 1 {
					t.Errorf("%s: history = %v, %s; want %v with last 1, first 1", name, seqs, ok.raw, tt.hist[name])
				}
			}
			if f := cs["u1#0"].seqs(); f.Convs[conv] != 1 {
				t.Errorf("seqs = %s, want %s at 1 whatever was dropped", f.raw, conv)
			}
			st := s.Stats()
			got := Stats{Dropped: st.Dropped, DroppedPush: st.DroppedPush, SkippedDevice: st.SkippedDevice, Stalled: st.Stalled, Deliveries: st.Deliveries}
			if got != tt.wantStats {
				t.Errorf("Stats() = %+v, want %+v", got, tt.wantStats)
			}
		})
	}
}

// TestHistoryIgnoresFaults: a history answer is neither delayed nor
// duplicated by the delivery faults, while the pushes are.
func TestHistoryIgnoresFaults(t *testing.T) {
	const delay = 2 * time.Second
	s, url := startServer(t, Options{Faults: Faults{Duplicate: 1, Delay: delay}})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	start := time.Now()
	for range 2 {
		u1.sendTo("u2", "m")
		u1.readType("ack")
	}
	seqs, ok := u2.history("d:u1:u2", 0, -1)
	if took := time.Since(start); took >= delay {
		t.Fatalf("history answered after %v, want before the pushes' %v delay", took, delay)
	}
	if !slices.Equal(seqs, []uint64{1, 2}) || ok.Last != 2 {
		t.Errorf("history = %v, %s; want [1 2] once each, last 2", seqs, ok.raw)
	}
	var pushed []uint64
	for range 4 {
		pushed = append(pushed, u2.readType("msg").Seq)
	}
	if want := []uint64{1, 1, 2, 2}; !slices.Equal(pushed, want) {
		t.Errorf("pushes = %v, want %v", pushed, want)
	}
	if st := s.Stats(); st.Duplicated != 2 || st.HistoryServed != 2 {
		t.Errorf("Stats() = %+v, want Duplicated 2, HistoryServed 2", st)
	}
}

// TestHistorySlowConsumer: history answers go through the send queue, so
// a reader that does not read them is disconnected like any other.
func TestHistorySlowConsumer(t *testing.T) {
	s, url := startServer(t, Options{SendQueue: 8})
	u1 := login(t, url, "u1", "t")
	body := strings.Repeat("x", 32<<10)
	for range 20 {
		u1.sendTo("u2", body)
		u1.readType("ack")
	}
	// Ask again and again without reading: each answer fits the room
	// left, until there is none and the ok overflows.
	for i := 0; s.Stats().SlowConsumerKicks == 0; i++ {
		if i == 10000 {
			t.Fatalf("no slow-consumer kick after %d history requests: %+v", i, s.Stats())
		}
		u1.ws.SetWriteDeadline(time.Now().Add(ioTimeout))
		if err := u1.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"history","id":"h","conv":"d:u1:u2"}`)); err != nil {
			break // closed: the kick is being counted
		}
	}
	code, _, err := readClose(u1.ws, ioTimeout)
	if err != nil || code != CloseSlowConsumer {
		t.Errorf("reader of unread history: close %d (err %v), want %d", code, err, CloseSlowConsumer)
	}
}

// checkHistory fails unless h and convs agree on what is kept and every
// bound holds.
func checkHistory(t *testing.T, h *history, convs []*conversation) {
	t.Helper()
	var total int64
	live := 0
	for _, c := range convs {
		n := c.hist.len()
		if n > h.limit {
			t.Fatalf("%s keeps %d messages, limit %d", c.name, n, h.limit)
		}
		if n > 0 && c.hist.at(n-1).seq != c.seq {
			t.Fatalf("%s: newest kept seq %d, conversation at %d", c.name, c.hist.at(n-1).seq, c.seq)
		}
		for i := range n {
			e := c.hist.at(i)
			if e.seq != c.firstKept()+uint64(i) {
				t.Fatalf("%s: entry %d has seq %d, want %d: a hole", c.name, i, e.seq, c.firstKept()+uint64(i))
			}
			want := int64(len(e.frame)) + histOverhead
			for _, u := range e.hidden {
				want += int64(len(u)) + hiddenOverhead
			}
			if e.size != want {
				t.Fatalf("%s seq %d: size %d, want %d", c.name, e.seq, e.size, want)
			}
			total += e.size
		}
		live += n
		if q := &c.hist; cap(q.buf) > 4*q.len()+8 {
			t.Fatalf("%s: backing array of %d for %d messages", c.name, cap(q.buf), q.len())
		}
	}
	if total != h.bytes || live != h.live {
		t.Fatalf("history counts %d bytes in %d messages, holds %d in %d", h.bytes, h.live, total, live)
	}
	if h.bytes > h.maxBytes {
		t.Fatalf("history holds %d bytes, cap %d", h.bytes, h.maxBytes)
	}
	if h.order.len() > 2*h.live+1024 {
		t.Fatalf("eviction order holds %d references for %d messages", h.order.len(), h.live)
	}
}

// TestHistoryBounds checks the history store's eviction: per conversation
// past the limit, across conversations oldest first past the byte cap,
// hidden names counting against it.
func TestHistoryBounds(t *testing.T) {
	frame := make([]byte, 100)
	size := int64(len(frame)) + histOverhead
	tests := []struct {
		name     string
		limit    int
		maxBytes int64
		ops      string // a/b: a message in conversation a/b; h: hide b's newest from "uu"
		want     map[string][]uint64
	}{
		{"within bounds", 10, 100 * size, "aabab", map[string][]uint64{"a": {1, 2, 3}, "b": {1, 2}}},
		{"per-conversation limit", 2, 100 * size, "aaaab", map[string][]uint64{"a": {3, 4}, "b": {1}}},
		{"byte cap: oldest of all first", 10, 3 * size, "aabbb", map[string][]uint64{"a": nil, "b": {1, 2, 3}}},
		{"byte cap: interleaved", 10, 3 * size, "ababa", map[string][]uint64{"a": {2, 3}, "b": {2}}},
		{"hidden names count", 10, 3*size + 10, "abbh", map[string][]uint64{"a": nil, "b": {1, 2}}},
		{"off", 0, 100 * size, "aab", map[string][]uint64{"a": nil, "b": nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &history{limit: tt.limit, maxBytes: tt.maxBytes}
			convs := map[string]*conversation{"a": {name: "a"}, "b": {name: "b"}}
			for _, op := range tt.ops {
				if op == 'h' {
					h.hide(convs["b"], convs["b"].seq, "uu")
					h.trim()
					continue
				}
				c := convs[string(op)]
				c.seq++
				h.add(c, c.seq, frame)
			}
			checkHistory(t, h, slices.Collect(maps.Values(convs)))
			for name, want := range tt.want {
				frames, _ := convs[name].page("x", 0, MaxHistoryPage)
				if len(frames) != len(want) {
					t.Errorf("%s keeps %d messages, want %v", name, len(frames), want)
				}
				if got := convs[name].firstKept(); len(want) > 0 && got != want[0] {
					t.Errorf("%s: first kept %d, want %d", name, got, want[0])
				}
			}
		})
	}
}

// FuzzHistory runs arbitrary sequences of messages, hides and pages on
// three conversations under small bounds, and checks after each step that
// the bounds hold, that what is kept is contiguous and counted, and that
// every page is what a scan of the kept messages gives.
func FuzzHistory(f *testing.F) {
	f.Add(uint8(3), uint8(10), []byte{0, 1, 4, 5, 2, 3, 7, 11, 0xff})
	f.Add(uint8(1), uint8(1), []byte{0, 0, 0, 2, 3})
	f.Add(uint8(8), uint8(200), []byte("a long run of messages and pages and hides"))
	f.Fuzz(func(t *testing.T, limit, kb uint8, ops []byte) {
		h := &history{limit: int(limit % 9), maxBytes: int64(kb) * 100}
		convs := []*conversation{{name: "a"}, {name: "b"}, {name: "c"}}
		users := []string{"u0", "u1", "u2"}
		for i, op := range ops {
			c := convs[int(op>>2)%3]
			switch op % 4 {
			case 0, 1:
				c.seq++
				// The frame names its message, for the pages to show.
				frame := fmt.Appendf(nil, "%s %d ", c.name, c.seq)
				h.add(c, c.seq, append(frame, make([]byte, int(op>>4)*37)...))
			case 2:
				h.hide(c, c.seq, users[int(op>>4)%3])
				h.trim()
			case 3:
				user := users[int(op>>4)%3]
				after := uint64(i) % (c.seq + 2)
				lim := int(op>>5) % 4
				frames, more := c.page(user, after, lim)
				var want [][]byte
				for j := range c.hist.len() {
					if e := c.hist.at(j); e.seq > after && !slices.Contains(e.hidden, user) {
						want = append(want, e.frame)
					}
				}
				wantMore := len(want) > lim
				if wantMore {
					want = want[:lim]
				}
				if len(frames) != len(want) || more != wantMore {
					t.Fatalf("page(%s, after %d, limit %d) = %d frames, more %v; want %d, more %v", user, after, lim, len(frames), more, len(want), wantMore)
				}
				for j := range frames {
					if !bytes.Equal(frames[j], want[j]) {
						t.Fatalf("page(%s, after %d) frame %d = %.10q, want %.10q", user, after, j, frames[j], want[j])
					}
				}
			}
			checkHistory(t, h, convs)
		}
	})
}

// FuzzMember checks member's reading of a direct conversation id for one
// that has no message yet: the user may read it exactly when some other
// user's conversation with the user has that id.
func FuzzMember(f *testing.F) {
	f.Add("u1", "d:u1:u2")
	f.Add("u2", "d:u1:u2")
	f.Add("b:c", "d:a:b:c")
	f.Add("a", "d:a:b:c")
	f.Add("u", "d:u:u")
	f.Add("x", "g:x")
	f.Fuzz(func(t *testing.T, user, conv string) {
		s := &Server{convs: map[string]*conversation{}, groups: map[string]*group{}}
		_, ok := s.member(user, conv)
		if strings.HasPrefix(conv, "g:") {
			if ok {
				t.Fatalf("member(%q, %q) = true with no groups", user, conv)
			}
			return
		}
		// The other user, if any, is what is left of the id around user.
		var others []string
		if o, cut := strings.CutPrefix(conv, "d:"+user+":"); cut {
			others = append(others, o)
		}
		if strings.HasPrefix(conv, "d:") {
			if o, cut := strings.CutSuffix(conv[2:], ":"+user); cut {
				others = append(others, o)
			}
		}
		want := false
		for _, o := range others {
			a, b := min(user, o), max(user, o)
			if "d:"+a+":"+b == conv {
				want = true
			}
		}
		if ok != want {
			t.Fatalf("member(%q, %q) = %v, want %v", user, conv, ok, want)
		}
	})
}
