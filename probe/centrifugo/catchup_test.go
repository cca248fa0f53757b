package centrifugo

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/probe"
)

// Tests of catch-up (catchup.go) against the scripted server of
// session_test.go: recovery from the device's Catchup place, history
// fetches of gaps, syncs, lost streams, and several devices of one user.

// pubJSON is a publication of chat:g1 by u2 at offset off, as a
// subscribe or history result lists it.
func pubJSON(off uint64) string {
	return fmt.Sprintf(`{"data":{"b":"imc1 p%d"},"info":{"user":"u2","client":"x"},"offset":%d}`, off, off)
}

// pubsJSON lists the publications at offsets lo..hi.
func pubsJSON(lo, hi uint64) string {
	var p []string
	for off := lo; off <= hi; off++ {
		p = append(p, pubJSON(off))
	}
	return "[" + strings.Join(p, ",") + "]"
}

// pushJSON is the push of pubJSON(off).
func pushJSON(off uint64) string {
	return `{"push":{"channel":"chat:g1","pub":` + pubJSON(off) + `}}`
}

// nextHistory pings the client every 20 ms, which makes a running session
// look at what is due, and returns the first history command it sends
// (answering nothing else), or fails after 5 s.
func (fc *fakeConn) nextHistory() command {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		fc.send(`{}`)
		cmd, err := fc.read()
		if err != nil {
			fc.t.Errorf("fake server: waiting for a history command: %v", err)
			return command{}
		}
		if cmd.History != nil {
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	fc.t.Error("fake server: no history command within 5s")
	return command{}
}

// quiet pings the client for d and fails on any command but a pong.
func (fc *fakeConn) quiet(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		fc.send(`{}`)
		cmd, err := fc.read()
		if err != nil || cmd.raw != "{}" {
			fc.t.Errorf("fake server: command %q, %v; want only pongs", cmd.raw, err)
			return
		}
	}
}

func since(cmd command) string {
	h := cmd.History
	if h == nil {
		return "no history command"
	}
	if h.Since == nil {
		return fmt.Sprintf("%s limit %d", h.Channel, h.Limit)
	}
	return fmt.Sprintf("%s since %d/%s limit %d", h.Channel, h.Since.Offset, h.Since.Epoch, h.Limit)
}

// seqs renders what rec was given as offset/recovered.
func seqs(rec *recorder) string {
	var out []string
	fetched := rec.fetched()
	for i, dl := range rec.got() {
		out = append(out, fmt.Sprintf("%d/%v", dl.seq, fetched[i]))
	}
	return strings.Join(out, " ")
}

// TestCatchUpFetchesGap: a live push that skips an offset opens a gap,
// which, once its grace has passed, is fetched with a history command
// since the offset before it, and what it brings is delivered as
// recovered.
func TestCatchUpFetchesGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		got := make(chan command, 1)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			fc.subscribes(2, positioned("EP", 0))
			fc.send(pushJSON(1) + "\n" + pushJSON(3))
			cmd := fc.nextHistory()
			got <- cmd
			fc.send(fmt.Sprintf(`{"id":%d,"history":{"publications":%s,"epoch":"EP","offset":3}}`, cmd.ID, pubsJSON(2, 2)))
			fc.quiet(100 * time.Millisecond)
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		dev := testDevice(true)
		s, err := d.Connect(context.Background(), "u1", dev)
		if err != nil {
			t.Fatal(err)
		}
		var rec recorder
		serve(t, s, &rec)
		if got, want := since(<-got), "chat:g1 since 1/EP limit 1"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
		if got, want := seqs(&rec), "1/false 3/false 2/true"; got != want {
			t.Errorf("delivered %s, want %s", got, want)
		}
		if n := dev.Catchup.Missing(); n != 0 {
			t.Errorf("Catchup.Missing() = %d after the fetch, want 0", n)
		}
		if got, want := d.ServerStats(), (ServerStats{Gaps: 1, Missed: 1, Recovered: 1}); got != want {
			t.Errorf("ServerStats() = %+v, want %+v", got, want)
		}
	})
}

// TestCatchUpFetchesInFlightBound: however many gaps are due, a session
// has at most maxFetches history requests unanswered.
func TestCatchUpFetchesInFlightBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		asked := make(chan int, 1)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			fc.subscribes(2, positioned("EP", 0))
			var b []string
			for off := uint64(1); off <= 41; off += 2 {
				b = append(b, pushJSON(off))
			}
			// 20 gaps, merged to Catchup's 16.
			fc.send(strings.Join(b, "\n"))
			n := 0
			fc.nextHistory()
			n++
			// The retry is a second away: for half of it, only the first
			// round is seen.
			for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				fc.send(`{}`)
				for {
					cmd, err := fc.read()
					if err != nil {
						t.Error(err)
						return
					}
					if cmd.History == nil {
						break
					}
					n++
				}
			}
			asked <- n
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		s, err := d.Connect(context.Background(), "u1", testDevice(true))
		if err != nil {
			t.Fatal(err)
		}
		serve(t, s, &recorder{})
		if n := <-asked; n != maxFetches {
			t.Errorf("history requests in flight = %d with 16 gaps due, want %d", n, maxFetches)
		}
	})
}

// TestCatchUpSyncFindsTail: Sync asks each channel's top; the top a sync
// found is applied at the next sync, when whatever was on its way as a
// push has arrived, and what is still missing then is fetched.
func TestCatchUpSyncFindsTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var round atomic.Int32
		answered := make(chan struct{}, 2)
		fetched := make(chan string, 1)
		url := startFake(t, func(fc *fakeConn) {
			fc.acceptConnect(connectOK)
			fc.subscribes(2, positioned("EP", 5))
			for r := range 2 {
				var replies []string
				for range 2 {
					cmd, err := fc.read()
					if err != nil || cmd.History == nil || cmd.History.Limit != 0 || cmd.History.Since != nil {
						t.Errorf("sync %d: command %q, %v; want a history of limit 0", r, cmd.raw, err)
						return
					}
					top := 5
					if cmd.History.Channel == "chat:g1" {
						top = 7
					}
					replies = append(replies, fmt.Sprintf(`{"id":%d,"history":{"publications":[],"epoch":"EP","offset":%d}}`, cmd.ID, top))
				}
				round.Store(int32(r + 1))
				fc.send(strings.Join(replies, "\n"))
				if r == 0 {
					// Nothing fetched on the first sync's word.
					fc.quiet(100 * time.Millisecond)
				}
				answered <- struct{}{}
			}
			cmd := fc.nextHistory()
			fetched <- since(cmd)
			fc.send(fmt.Sprintf(`{"id":%d,"history":{"publications":%s,"epoch":"EP","offset":7}}`, cmd.ID, pubsJSON(6, 7)))
			fc.quiet(100 * time.Millisecond)
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		dev := testDevice(true)
		s, err := d.Connect(context.Background(), "u1", dev)
		if err != nil {
			t.Fatal(err)
		}
		var rec recorder
		done := make(chan *probe.Disconnect, 1)
		go func() { done <- serve(t, s, &rec) }()
		sy := s.(probe.Syncer)
		for range 2 {
			if err := sy.Sync(); err != nil {
				t.Fatal(err)
			}
			<-answered
			testwait.For(t, 5*time.Second, "the sync answered", func() bool {
				ss := s.(*session)
				ss.pmu.Lock()
				defer ss.pmu.Unlock()
				return len(ss.syncs) == 0
			})
		}
		<-done
		if got, want := <-fetched, "chat:g1 since 5/EP limit 2"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
		if got, want := seqs(&rec), "6/true 7/true"; got != want {
			t.Errorf("delivered %s, want %s", got, want)
		}
		if n := dev.Catchup.Missing(); n != 0 {
			t.Errorf("Catchup.Missing() = %d, want 0", n)
		}
	})
}

// TestCatchUpUnrecovered: a resubscribe the server cannot recover
// (recovered false, the stream's top above the device's place) is caught
// up with history, a page at a time; what history no longer has is
// answered, not asked again.
func TestCatchUpUnrecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var asked []string
		url := startFakeNth(t, func(fc *fakeConn, n int) {
			fc.acceptConnect(connectOK)
			if n == 1 {
				fc.subscribes(2, positioned("EP", 10))
				fc.close(websocket.CloseGoingAway, "")
				fc.drain()
				return
			}
			fc.subscribes(2, func(cmd command) string {
				if cmd.Subscribe.Channel == "chat:g1" {
					return `"subscribe":{"recoverable":true,"epoch":"EP","offset":265,"positioned":true,"was_recovering":true}`
				}
				return `"subscribe":{"recoverable":true,"epoch":"EP","offset":10,"recovered":true,"positioned":true,"was_recovering":true}`
			})
			// 11-15 are gone from history: it starts at 16.
			for _, page := range [][2]uint64{{16, 115}, {116, 215}, {216, 250}} {
				cmd := fc.nextHistory()
				mu.Lock()
				asked = append(asked, since(cmd))
				mu.Unlock()
				fc.send(fmt.Sprintf(`{"id":%d,"history":{"publications":%s,"epoch":"EP","offset":265}}`, cmd.ID, pubsJSON(page[0], page[1])))
			}
			// 251-265 were trimmed meanwhile: an empty page answers the
			// rest.
			cmd := fc.nextHistory()
			mu.Lock()
			asked = append(asked, since(cmd))
			mu.Unlock()
			fc.send(fmt.Sprintf(`{"id":%d,"history":{"publications":[],"epoch":"EP","offset":265}}`, cmd.ID))
			fc.quiet(100 * time.Millisecond)
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		dev := testDevice(true)
		var rec recorder
		for i := range 2 {
			s, err := d.Connect(context.Background(), "u1", dev)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				serve(t, s, &recorder{})
			} else {
				serve(t, s, &rec)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		// The gap 11-265 is 255: Catchup's Fetch asks 255, paged by 100.
		want := "chat:g1 since 10/EP limit 100,chat:g1 since 115/EP limit 100,chat:g1 since 215/EP limit 55,chat:g1 since 250/EP limit 15"
		if got := strings.Join(asked, ","); got != want {
			t.Errorf("history requests:\n%s\nwant\n%s", got, want)
		}
		fetched := rec.fetched()
		if len(fetched) != 235 || !fetched[0] || !fetched[234] {
			t.Errorf("delivered %d (first recovered %v), want 235 recovered", len(fetched), len(fetched) > 0 && fetched[0])
		}
		if n := dev.Catchup.Missing(); n != 0 {
			t.Errorf("Catchup.Missing() = %d, want 0: what history lacks is answered", n)
		}
	})
}

// TestCatchUpLostStream: a resubscribe that finds another epoch moves the
// device to the new stream's top, fetching nothing; the next resubscribe
// recovers in the new epoch from there. A history fetch refused as an
// unrecoverable position makes the session ask where the stream stands.
func TestCatchUpLostStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var third, fetchAfterLoss command
		url := startFakeNth(t, func(fc *fakeConn, n int) {
			fc.acceptConnect(connectOK)
			switch n {
			case 1:
				fc.subscribes(2, positioned("EP", 10))
			case 2:
				fc.subscribes(2, func(cmd command) string {
					if cmd.Subscribe.Channel == "chat:g1" {
						return `"subscribe":{"recoverable":true,"epoch":"NEW","offset":3,"positioned":true,"was_recovering":true}`
					}
					return `"subscribe":{"recoverable":true,"epoch":"EP","offset":10,"recovered":true,"positioned":true,"was_recovering":true}`
				})
				fc.send(pushJSON(4))
				fc.quiet(150 * time.Millisecond)
				// A gap in the new stream; the server has lost that one
				// too by the time it is fetched.
				fc.send(pushJSON(6))
				cmd := fc.nextHistory()
				fc.send(fmt.Sprintf(`{"id":%d,"error":{"code":112,"message":"unrecoverable position"}}`, cmd.ID))
				sync, err := fc.read()
				for err == nil && sync.raw == "{}" {
					// The pong of nextHistory's last ping.
					sync, err = fc.read()
				}
				if err != nil || sync.History == nil || sync.History.Limit != 0 || sync.History.Channel != "chat:g1" {
					t.Errorf("after 112: command %q, %v; want a history of limit 0 on chat:g1", sync.raw, err)
					return
				}
				fc.send(fmt.Sprintf(`{"id":%d,"history":{"publications":[],"epoch":"THIRD","offset":2}}`, sync.ID))
				fc.quiet(150 * time.Millisecond)
				mu.Lock()
				fetchAfterLoss = cmd
				mu.Unlock()
			case 3:
				cmds := fc.subscribes(2, func(cmd command) string {
					if cmd.Subscribe.Channel == "chat:g1" {
						return positioned("THIRD", 2)(cmd)
					}
					return positioned("EP", 10)(cmd)
				})
				mu.Lock()
				for _, c := range cmds {
					if c.Subscribe.Channel == "chat:g1" {
						third = c
					}
				}
				mu.Unlock()
			}
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		dev := testDevice(true)
		var rec recorder
		for i := range 3 {
			s, err := d.Connect(context.Background(), "u1", dev)
			if err != nil {
				t.Fatal(err)
			}
			if i == 1 {
				serve(t, s, &rec)
			} else {
				serve(t, s, &recorder{})
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if got, want := since(fetchAfterLoss), "chat:g1 since 4/NEW limit 1"; got != want {
			t.Errorf("fetch in the new stream = %s, want %s", got, want)
		}
		if got, want := seqs(&rec), "4/false 6/false"; got != want {
			t.Errorf("delivered %s, want %s", got, want)
		}
		if sc := third.Subscribe; sc == nil || !sc.Recover || sc.Epoch != "THIRD" || sc.Offset != 2 {
			t.Errorf("third subscribe = %s, want recover from 2 in THIRD", third.raw)
		}
		if n := dev.Catchup.Missing(); n != 0 {
			t.Errorf("Catchup.Missing() = %d, want 0: a lost stream's gaps are not asked for", n)
		}
		// Two lost streams and the gap at 5.
		if got := d.ServerStats(); got.Gaps != 3 {
			t.Errorf("ServerStats() = %+v, want 3 gaps", got)
		}
	})
}

// TestDevicesOfOneUser: two devices of one user are online at once, each a
// connection of its own with its own place in the channels. Each gets every
// publication but its own: what the other device published it delivers.
// A device that logs in again does not deliver what it published in its
// last session when the recovery brings it back.
func TestDevicesOfOneUser(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		both := make(chan struct{})
		var once sync.Once
		var ready sync.WaitGroup
		ready.Add(2)
		url := startFakeNth(t, func(fc *fakeConn, n int) {
			fc.acceptConnect(fmt.Sprintf(`{"client":"c%d","expires":true,"ttl":3600,"ping":25,"pong":true}`, n))
			if n <= 2 {
				fc.subscribes(2, positioned("EP", 0))
				ready.Done()
				once.Do(func() { go func() { ready.Wait(); close(both) }() })
				<-both
				fc.send(`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 from u2"},"info":{"user":"u2","client":"x"},"offset":1}}}` + "\n" +
					`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 from c1"},"info":{"user":"u1","client":"c1"},"offset":2}}}` + "\n" +
					`{"push":{"channel":"chat:g1","pub":{"data":{"b":"imc1 from c2"},"info":{"user":"u1","client":"c2"},"offset":3}}}`)
				fc.quiet(100 * time.Millisecond)
				fc.close(websocket.CloseGoingAway, "")
				fc.drain()
				return
			}
			// Device 0 again: the recovery brings back what it published
			// as c1, and what device 1 published since.
			fc.subscribes(2, func(cmd command) string {
				if cmd.Subscribe.Channel == "chat:g1" {
					return `"subscribe":{"recoverable":true,"epoch":"EP","publications":[` +
						`{"data":{"b":"imc1 c1 again"},"info":{"user":"u1","client":"c1"},"offset":4},` +
						`{"data":{"b":"imc1 c2 again"},"info":{"user":"u1","client":"c2"},"offset":5}],` +
						`"recovered":true,"offset":3,"positioned":true,"was_recovering":true}`
				}
				return `"subscribe":{"recoverable":true,"epoch":"EP","offset":0,"recovered":true,"positioned":true,"was_recovering":true}`
			})
			fc.quiet(100 * time.Millisecond)
			fc.close(websocket.CloseGoingAway, "")
			fc.drain()
		})
		d := newTestDriver(t, url, nil)
		devs := []probe.Device{{Index: 0, Catchup: probe.NewCatchup(20 * time.Millisecond)}, {Index: 1, Catchup: probe.NewCatchup(20 * time.Millisecond)}}
		var sessions [2]probe.Session
		var wg sync.WaitGroup
		for i := range devs {
			wg.Go(func() {
				s, err := d.Connect(context.Background(), "u1", devs[i])
				if err != nil {
					t.Error(err)
					return
				}
				sessions[i] = s
			})
		}
		wg.Wait()
		if sessions[0] == nil || sessions[1] == nil {
			t.FailNow()
		}
		// Connected in either order; which got c1 is the session's.
		var recs [2]recorder
		for i := range sessions {
			wg.Go(func() { serve(t, sessions[i], &recs[i]) })
		}
		wg.Wait()
		for i := range sessions {
			own := sessions[i].(*session).own
			var bodies []string
			for _, dl := range recs[i].got() {
				bodies = append(bodies, dl.body)
			}
			other := map[string]string{"c1": "imc1 from c2", "c2": "imc1 from c1"}[string(own[len(own)-1])]
			if got, want := strings.Join(bodies, ","), "imc1 from u2,"+other; got != want {
				t.Errorf("device %d (client %s) delivered %q, want %q", i, own[len(own)-1], got, want)
			}
			if n := devs[i].Catchup.Missing(); n != 0 {
				t.Errorf("device %d: Catchup.Missing() = %d, want 0 (its own publication held too)", i, n)
			}
		}
		if got := d.ServerStats(); got != (ServerStats{}) {
			t.Errorf("ServerStats() = %+v, want no gap: each device has its own positions", got)
		}
		// Device 0 logs in again, as whichever client it was.
		dev0 := sessions[0].(*session).own
		s, err := d.Connect(context.Background(), "u1", devs[0])
		if err != nil {
			t.Fatal(err)
		}
		var rec recorder
		serve(t, s, &rec)
		want := "5/true"
		if string(dev0[len(dev0)-1]) == "c2" {
			want = "4/true"
		}
		if got := seqs(&rec); got != want {
			t.Errorf("device 0 again (was %s) delivered %s, want %s: its own publication recovered is not delivered", dev0[len(dev0)-1], got, want)
		}
	})
}

// TestHandleFrameAllocsCatchUp: with catch-up, a session still handles a
// frame of deliveries and acks without allocating.
func TestHandleFrameAllocsCatchUp(t *testing.T) {
	d, err := New(Config{}, Options{URL: "ws://x", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	cu := probe.NewCatchup(time.Second)
	ch := "chat:imcanary-g3"
	cu.SetMark(ch, streamMark{epoch: "EP"}.String())
	cu.Behind(ch, 0, time.Now().UnixNano())
	st := &devState{pos: map[string]*position{ch: {epoch: "EP", known: true}}}
	s := &session{d: d, user: "imcanary-u1", userB: []byte("imcanary-u1"), st: st, acks: map[uint32]uint64{},
		cu: cu, marks: map[string]streamMark{ch: {epoch: "EP"}}, own: [][]byte{[]byte("c1")}}
	var h countHandler
	var got atomic.Int64
	h.n = &got
	frame := make([]byte, 0, 512)
	buf := make([]byte, 0, 512)
	offset := uint64(0)
	allocs := testing.AllocsPerRun(200, func() {
		offset++
		frame = pushFrame(frame[:0], []byte("imc1 run1 imcanary-u17 g.imcanary-g3 7 1764500000000000000 0-0"), offset)
		frame = append(frame, "\n"...)
		frame = append(frame, `{"id":12,"publish":{}}`...)
		s.acks[12] = offset
		buf = append(buf[:0], frame...)
		if err := s.handleFrame(buf, &h); err != nil {
			t.Fatal(err)
		}
		if err := s.fetchDue(time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("handling a frame with catch-up allocates %v times, want 0", allocs)
	}
	if seq, _ := cu.Position(ch); seq != offset || cu.Missing() != 0 {
		t.Errorf("Catchup at %d missing %d, want at %d missing none", seq, cu.Missing(), offset)
	}
}

// TestMarkRoundTrip: what String encodes parseMark decodes; anything else
// is no mark.
func TestMarkRoundTrip(t *testing.T) {
	for _, m := range []streamMark{{epoch: "EP"}, {epoch: "a:b", shift: 1 << 40}} {
		if got, ok := parseMark(m.String()); !ok || got != m {
			t.Errorf("parseMark(%q) = %+v, %v; want %+v", m.String(), got, ok, m)
		}
	}
	for _, s := range []string{"", "EP", "x:EP", "3:", "-1:EP"} {
		if m, ok := parseMark(s); ok {
			t.Errorf("parseMark(%q) = %+v, want no mark", s, m)
		}
	}
}
