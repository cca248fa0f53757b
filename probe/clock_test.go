package probe

import (
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
