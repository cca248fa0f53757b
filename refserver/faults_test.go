package refserver

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/testwait"
)

func TestFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults Faults
		rand   float64 // what Options.Rand always returns
		sent   int
		// wantSeqs is the order of deliveries to the recipient.
		wantSeqs []uint64
		// minLatency is the least time from the first send to the first
		// delivery.
		minLatency time.Duration
		wantStats  Stats
	}{
		{
			name: "none", sent: 3, wantSeqs: []uint64{1, 2, 3},
			wantStats: Stats{Deliveries: 3},
		},
		{
			name: "drop all", faults: Faults{Drop: 1}, sent: 3, wantSeqs: nil,
			wantStats: Stats{Dropped: 3},
		},
		{
			name: "duplicate all", faults: Faults{Duplicate: 1}, sent: 2, wantSeqs: []uint64{1, 1, 2, 2},
			wantStats: Stats{Deliveries: 4, Duplicated: 2},
		},
		{
			name: "reorder swaps consecutive deliveries", faults: Faults{Reorder: 1}, sent: 4, wantSeqs: []uint64{2, 1, 4, 3},
			wantStats: Stats{Deliveries: 4, Held: 2, Reordered: 2},
		},
		{
			name: "reorder releases a lone delivery after reorderHold", faults: Faults{Reorder: 1}, sent: 1,
			wantSeqs: []uint64{1}, minLatency: reorderHold,
			wantStats: Stats{Deliveries: 1, Held: 1},
		},
		{
			name: "fixed delay keeps order", faults: Faults{Delay: 200 * time.Millisecond}, sent: 5,
			wantSeqs: []uint64{1, 2, 3, 4, 5}, minLatency: 200 * time.Millisecond,
			wantStats: Stats{Deliveries: 5, Delayed: 5},
		},
		{
			name: "jitter", faults: Faults{Jitter: 200 * time.Millisecond}, rand: 0.75, sent: 1,
			wantSeqs: []uint64{1}, minLatency: 150 * time.Millisecond,
			wantStats: Stats{Deliveries: 1, Delayed: 1},
		},
		{
			// A probability below the draw never fires.
			name: "drop below the draw", faults: Faults{Drop: 0.5}, rand: 0.5, sent: 2, wantSeqs: []uint64{1, 2},
			wantStats: Stats{Deliveries: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rand
			s, url := startServer(t, Options{Faults: tt.faults, Rand: func() float64 { return r }})
			u1 := login(t, url, "u1", "t")
			u2 := login(t, url, "u2", "t")

			start := time.Now()
			for i := range tt.sent {
				u1.sendTo("u2", "m")
				// Faults never touch acks.
				if a := u1.readType("ack"); a.Seq != uint64(i+1) {
					t.Fatalf("ack seq = %d, want %d", a.Seq, i+1)
				}
			}
			var got []uint64
			var raws [][]byte
			for i := range tt.wantSeqs {
				f := u2.readType("msg")
				if i == 0 {
					if lat := time.Since(start); lat < tt.minLatency {
						t.Errorf("first delivery after %v, want at least %v", lat, tt.minLatency)
					}
				}
				got = append(got, f.Seq)
				raws = append(raws, f.raw)
			}
			if !slices.Equal(got, tt.wantSeqs) {
				t.Errorf("delivery seqs = %v, want %v", got, tt.wantSeqs)
			}
			if tt.faults.Duplicate == 1 && len(raws) >= 2 && !bytes.Equal(raws[0], raws[1]) {
				t.Errorf("duplicate %s differs from original %s", raws[1], raws[0])
			}

			// With faults off, the next message is the next thing the
			// recipient reads: nothing else was left in flight.
			s.SetFaults(Faults{})
			u1.sendTo("u2", "marker")
			u1.readType("ack")
			if f := u2.readType("msg"); f.Body != "marker" || f.Seq != uint64(tt.sent+1) {
				t.Errorf("after faults off got %s, want the marker with seq %d", f.raw, tt.sent+1)
			}

			st := s.Stats()
			want := tt.wantStats
			want.Deliveries++ // the marker
			got2 := Stats{Deliveries: st.Deliveries, Dropped: st.Dropped, Duplicated: st.Duplicated, Held: st.Held, Reordered: st.Reordered, Delayed: st.Delayed}
			if got2 != want {
				t.Errorf("Stats() = %+v, want %+v", got2, want)
			}
		})
	}
}

func TestSetFaultsClamps(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetFaults(Faults{Drop: 2, Duplicate: -1, Delay: -time.Second})
	got := *s.faults.Load()
	if want := (Faults{Drop: 1}); got != want {
		t.Errorf("SetFaults(out of range) stored %+v, want %+v", got, want)
	}
}

func TestDelayHeapOrder(t *testing.T) {
	var h delayHeap
	// (at, n): ties in at must come out in insertion order.
	in := []delayed{{at: 5, n: 1}, {at: 1, n: 2}, {at: 5, n: 3}, {at: 3, n: 4}, {at: 1, n: 5}, {at: 5, n: 6}}
	for _, d := range in {
		h.push(d)
	}
	var got []uint64
	for len(h) > 0 {
		got = append(got, h.pop().n)
	}
	if want := []uint64{2, 5, 4, 1, 3, 6}; !slices.Equal(got, want) {
		t.Errorf("pop order = %v, want %v", got, want)
	}
}

// stalledStats is the part of Stats the stall tests compare.
func stalledStats(st Stats) Stats {
	return Stats{Connections: st.Connections, Deliveries: st.Deliveries, Stalled: st.Stalled, SlowConsumerKicks: st.SlowConsumerKicks}
}

// checkStalledStats waits briefly for s's counters to reach want: a
// delivery is counted just after it is queued, so its reader may see it
// first.
func checkStalledStats(t *testing.T, s *Server, what string, want Stats) {
	t.Helper()
	var got Stats
	defer func() {
		if t.Failed() {
			t.Logf("Stats() %s = %+v, want %+v", what, got, want)
		}
	}()
	testwait.Every(t, time.Second, 2*time.Millisecond, "the stall counted "+what, func() bool {
		got = stalledStats(s.Stats())
		return got == want
	})
}

// wsPing sends a WebSocket ping from c and reads up to the server's
// application pong with it, failing unless the WebSocket pong came first,
// echoing the ping's payload, and nothing else did.
func (c *client) wsPing(payload string) {
	c.tb.Helper()
	var pongs []string
	c.ws.SetPongHandler(func(s string) error { pongs = append(pongs, s); return nil })
	defer c.ws.SetPongHandler(nil)
	if err := c.ws.WriteControl(websocket.PingMessage, []byte(payload), time.Now().Add(ioTimeout)); err != nil {
		c.tb.Fatalf("%s: ping: %v", c.user, err)
	}
	c.roundTrip()
	if len(pongs) != 1 || pongs[0] != payload {
		c.tb.Fatalf("%s: WebSocket pongs %q to one ping of %q, want it echoed once", c.user, pongs, payload)
	}
}

// TestStall checks the stall fault on a live session: it stays open, its
// pings are answered and its sends acked and delivered, while nothing is
// delivered to it, direct or group; other users are unaffected; turning
// the stall off resumes delivery with the next message.
func TestStall(t *testing.T) {
	s, url := startServer(t, Options{})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	u3 := login(t, url, "u3", "t")
	u1.write(map[string]any{"type": "group", "group": "g", "members": []string{"u1", "u2", "u3"}})
	u1.readType("ok")

	s.Stall("u2", true)
	// Two direct messages and two group messages for u2, all acked.
	for i, send := range []func() string{
		func() string { return u1.sendTo("u2", "d1") },
		func() string { return u1.sendGroup("g", "g1") },
		func() string { return u1.sendTo("u2", "d2") },
		func() string { return u1.sendGroup("g", "g2") },
	} {
		id := send()
		if a := u1.readType("ack"); a.ID != id {
			t.Fatalf("send %d: ack for %q, want %q", i, a.ID, id)
		}
	}
	// u3 is not stalled: it gets the group messages.
	for _, want := range []string{"g1", "g2"} {
		if f := u3.readType("msg"); f.Body != want {
			t.Errorf("u3 got %s, want the group message %q", f.raw, want)
		}
	}
	// The acks above were sent after u2's deliveries were routed, so if
	// any had reached u2's queue it would come before these pongs.
	u2.wsPing("stall?")
	u2.roundTrip()
	// u2's own sends are acked and delivered.
	id := u2.sendTo("u1", "from the stalled one")
	if a := u2.readType("ack"); a.ID != id {
		t.Errorf("u2's ack for %q, want %q", a.ID, id)
	}
	if f := u1.readType("msg"); f.Body != "from the stalled one" {
		t.Errorf("u1 got %s, want u2's message", f.raw)
	}
	checkStalledStats(t, s, "while stalled", Stats{Connections: 3, Deliveries: 3, Stalled: 4})

	s.Stall("u2", false)
	u1.sendTo("u2", "d3")
	u1.readType("ack")
	// The direct conversation's seq shows the two messages lost: 3 was
	// u2's own.
	if f := u2.readType("msg"); f.Body != "d3" || f.Seq != 4 {
		t.Errorf("after the stall u2 got %s, want d3 with seq 4", f.raw)
	}
	u2.roundTrip()
	checkStalledStats(t, s, "after the stall", Stats{Connections: 3, Deliveries: 4, Stalled: 4})
}

// TestStallFutureSessions checks a stall set before login, through
// Options.Stall: the user's offline backlog is discarded at login, and
// every later session of the user is stalled too, until Stall turns it off.
func TestStallFutureSessions(t *testing.T) {
	s, url := startServer(t, Options{Stall: []string{"u2"}, MaxDevices: 1})
	u1 := login(t, url, "u1", "t")
	// Queued while u2 is offline, discarded when it logs in stalled.
	for _, b := range []string{"o1", "o2"} {
		u1.sendTo("u2", b)
		u1.readType("ack")
	}
	u2 := login(t, url, "u2", "t")
	u2.roundTrip()
	u1.sendTo("u2", "live")
	u1.readType("ack")
	u2.roundTrip()

	// A new login replaces the session (MaxDevices 1); the stall holds
	// for the new one.
	u2b := login(t, url, "u2", "t")
	if code, _ := u2.readClose(); code != CloseConflict {
		t.Errorf("replaced session closed with %d, want %d", code, CloseConflict)
	}
	u1.sendTo("u2", "to the new session")
	u1.readType("ack")
	u2b.roundTrip()

	s.Stall("u2", false)
	u1.sendTo("u2", "resumed")
	u1.readType("ack")
	if f := u2b.readType("msg"); f.Body != "resumed" || f.Seq != 5 {
		t.Errorf("after the stall u2 got %s, want the message with seq 5", f.raw)
	}
	checkStalledStats(t, s, "", Stats{Connections: 2, Deliveries: 1, Stalled: 4})
	if st := s.Stats(); st.OfflineQueued != 2 {
		t.Errorf("Stats().OfflineQueued = %d, want 2: an offline stalled user's deliveries queue as usual", st.OfflineQueued)
	}
}

// TestStallAfterDelay checks the stall applies when a delivery is made,
// after the other faults: one delayed into a stall is discarded when it
// comes due.
func TestStallAfterDelay(t *testing.T) {
	s, url := startServer(t, Options{Faults: Faults{Delay: 100 * time.Millisecond}})
	u1 := login(t, url, "u1", "t")
	u2 := login(t, url, "u2", "t")
	u1.sendTo("u2", "delayed into the stall")
	u1.readType("ack")
	s.Stall("u2", true)
	testwait.For(t, ioTimeout, "the delayed delivery to be discarded", func() bool { return s.Stats().Stalled == 1 })
	s.Stall("u2", false)
	u2.roundTrip()
	if st := s.Stats(); st.Delayed != 1 || st.Deliveries != 0 {
		t.Errorf("Stats() = %+v, want one delayed delivery, none made", st)
	}
}

// TestStallOptionRejectsEmptyUser: an empty name stalls nobody, so it is
// a mistake to report, not a user.
func TestStallOptionRejectsEmptyUser(t *testing.T) {
	_, err := New(Options{Stall: []string{"u1", ""}})
	if want := "Options.Stall[1] is empty"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("New(Options{Stall: [u1 \"\"]}) = %v, want an error containing %q", err, want)
	}
}

// TestCapacity: with Capacity N the server delivers at most N a second:
// a burst that it would pass at once arrives spread over at least
// (burst-1)/N, and what would wait over capacityMaxWait is shed at once,
// counted and hidden from history, so that the backlog stays bounded.
func TestCapacity(t *testing.T) {
	const perSec, burst = 200, 100
	srv, url := startServer(t, Options{Faults: Faults{Capacity: perSec}})
	a, b := login(t, url, "ann", "t"), login(t, url, "bob", "t")
	start := time.Now()
	for i := range burst {
		a.sendTo("bob", fmt.Sprint(i))
	}
	for range burst {
		a.readType("ack")
	}
	var last time.Time
	for range burst {
		b.readType("msg")
		last = time.Now()
	}
	// The first goes at once; each other waits its slot: a machine can
	// only be slower than this, never faster.
	if span, least := last.Sub(start), time.Duration(burst-1)*time.Second/perSec; span < least {
		t.Errorf("%d deliveries over %v at a capacity of %d/s, want at least %v", burst, span, perSec, least)
	}
	if st := srv.Stats(); st.CapacityQueued < burst-10 || st.CapacityDropped != 0 {
		t.Errorf("queued %d, dropped %d: want nearly all %d queued, none dropped", st.CapacityQueued, st.CapacityDropped, burst)
	}

	// At 1 a second, 30 s of backlog holds 31: the rest of 40 are shed
	// as they are sent.
	srv.SetFaults(Faults{Capacity: 1})
	time.Sleep(10 * time.Millisecond)
	before := srv.Stats().CapacityDropped
	for i := range 40 {
		a.sendTo("bob", fmt.Sprint("shed", i))
	}
	for range 40 {
		a.readType("ack")
	}
	if got := srv.Stats().CapacityDropped - before; got < 8 || got > 10 {
		t.Errorf("shed %d of 40 sent at a capacity of 1/s, want the 9 past 30 s of backlog", got)
	}
}

// TestRefuse: with Refuse at 0.5, about half of 400 sends are answered
// with an "overloaded" error instead of an ack, and only the acked ones
// reach the recipient; at 0 every send is acked again.
func TestRefuse(t *testing.T) {
	const n = 400
	srv, url := startServer(t, Options{Faults: Faults{Refuse: 0.5}})
	a, b := login(t, url, "ann", "t"), login(t, url, "bob", "t")
	// Sends go in batches well under the send queue: 400 unread replies
	// can overflow it when the server's writer is starved of CPU, and
	// that is the slow-consumer close, not what this test is about.
	const batch = 50
	acked := 0
	for i := 0; i < n; i += batch {
		for j := range batch {
			a.sendTo("bob", fmt.Sprint(i+j))
		}
		before := acked
		for range batch {
			switch f := a.read(); f.Type {
			case "ack":
				acked++
			case "error":
				if f.Code != "overloaded" {
					t.Fatalf("refused with %s, want code overloaded", f.raw)
				}
			default:
				t.Fatalf("got %s, want an ack or an error", f.raw)
			}
		}
		for range acked - before {
			b.readType("msg")
		}
	}
	// Binomial(400, 0.5): 5 standard deviations either side.
	if acked < 150 || acked > 250 {
		t.Errorf("%d of %d sends acked at Refuse 0.5, want about half", acked, n)
	}
	if st := srv.Stats(); int(st.Refused) != n-acked {
		t.Errorf("Stats.Refused = %d, want %d", st.Refused, n-acked)
	}
	b.roundTrip() // nothing refused was delivered
	srv.SetFaults(Faults{})
	time.Sleep(10 * time.Millisecond)
	a.sendTo("bob", "after")
	a.readType("ack")
	if err := (Faults{Refuse: 1.5}).Validate(); err == nil || !strings.Contains(err.Error(), "Faults.Refuse") {
		t.Errorf("Validate(Refuse 1.5) = %v, want an error naming Faults.Refuse", err)
	}
}
