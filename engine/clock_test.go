package engine

import (
	"log/slog"
	"testing"
	"time"
)

// TestClockEstimate checks the estimate is the median exchange of the
// window, with that exchange's own uncertainty, and that an exchange that
// contradicts it (a clock stepped) makes it untrusted until the window has
// seen the step.
func TestClockEstimate(t *testing.T) {
	ms := int64(time.Millisecond)
	type step struct {
		off, unc int64 // the exchange added, ms
		// wantOff, wantUnc is the estimate after it; trusted whether a
		// delivery's latency is corrected by it.
		wantOff, wantUnc int64
		trusted          bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"median of five", []step{
			{10, 1, 10, 1, true}, {12, 2, 10, 1, true}, {50, 45, 12, 2, true},
			{11, 1, 11, 1, true}, {9, 3, 11, 1, true},
		}},
		{"oldest leaves the window", []step{
			{0, 1, 0, 1, true}, {0, 1, 0, 1, true}, {0, 1, 0, 1, true}, {0, 1, 0, 1, true}, {0, 1, 0, 1, true},
			{1, 1, 0, 1, true},
		}},
		{"too uncertain", []step{{10, 60, 10, 60, false}}},
		{"a step is untrusted until the median has it", []step{
			{0, 1, 0, 1, true}, {0, 1, 0, 1, true}, {0, 1, 0, 1, true},
			{100, 1, 0, 1, false}, {100, 1, 0, 1, false}, {100, 1, 100, 1, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Population{opts: Options{CrossFrom: "peer", Deadline: time.Second}}
			c := newCrossClock(p)
			now := time.Now().UnixNano()
			for i, s := range tt.steps {
				now += int64(time.Second)
				c.add(c.peer([]byte("peer")), clockSample{at: now, offset: s.off * ms, unc: s.unc * ms})
				off, cross, ok := c.correction([]byte("peer"), now)
				est := c.peers[0].est
				if !cross || est.offset != s.wantOff*ms || est.unc != s.wantUnc*ms || ok != s.trusted || ok && off != est.offset {
					t.Errorf("after exchange %d (%d±%d ms): estimate %v±%v trusted %v, want %d±%d ms trusted %v",
						i, s.off, s.unc, time.Duration(est.offset), time.Duration(est.unc), ok, s.wantOff, s.wantUnc, s.trusted)
				}
			}
			if _, _, ok := c.correction([]byte("peer"), now+int64(clockMaxAge)+1); ok {
				t.Errorf("an estimate with no exchange for clockMaxAge is still trusted")
			}
			if _, cross, _ := c.correction([]byte("other"), now); cross {
				t.Errorf("correction of a sender not CrossFrom: cross-shard, want not")
			}
		})
	}
}

// FuzzClockBody feeds user 0 arbitrary clock bodies: none may panic, and
// only one addressed to it, from a peer, with a round trip within the
// deadline, may become a sample.
func FuzzClockBody(f *testing.F) {
	f.Add([]byte("imt1 answer r0 s0-u0 r1 s1-u0 1000 2000 2500"))
	f.Add([]byte("imt1 return r0 s0-u0 r1 s1-u0 -5 99999999999999999999 0"))
	f.Add([]byte("imt1 answer r0 s0-u0 r1 s1-u0 1000 2000"))
	f.Add([]byte("imt1  answer"))
	f.Fuzz(func(t *testing.T, body []byte) {
		p := &Population{opts: Options{CrossFrom: "s1-u0", Deadline: time.Second}, run: []byte("r0"), log: slog.New(slog.DiscardHandler)}
		u := &user{p: p, name: "s0-u0", nameB: []byte("s0-u0")}
		p.users = []*user{u}
		c := newCrossClock(p)
		dev := &device{u: u}
		at := int64(3000)
		if !c.onDelivery(dev, body, at) && len(body) >= 5 && string(body[:5]) == clockMagic+" " {
			t.Fatalf("onDelivery(%q) = false for a clock body", body)
		}
		if pc := c.peers[0]; pc.n > 0 && (pc.newest.unc < 0 || pc.newest.unc > int64(time.Second)) {
			t.Fatalf("onDelivery(%q) kept a sample of uncertainty %d ns", body, pc.newest.unc)
		}
	})
}
