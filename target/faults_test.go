package target

import (
	"bytes"
	"slices"
	"testing"
	"time"
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
			wantStats: Stats{Deliveries: 4, Reordered: 2},
		},
		{
			name: "reorder releases a lone delivery after reorderHold", faults: Faults{Reorder: 1}, sent: 1,
			wantSeqs: []uint64{1}, minLatency: reorderHold,
			wantStats: Stats{Deliveries: 1},
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
			got2 := Stats{Deliveries: st.Deliveries, Dropped: st.Dropped, Duplicated: st.Duplicated, Reordered: st.Reordered, Delayed: st.Delayed}
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
