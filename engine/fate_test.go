package engine

import "testing"

// TestFateRecord: a stream's ack record tells acknowledged, written off and
// in flight apart, and holds no bits until the stream's first message (an
// idle population's streams never make them).
func TestFateRecord(t *testing.T) {
	var f fate
	if f.bits.Load() != nil || f.of(1) != fateUnknown {
		t.Fatal("a stream that never sent has a record")
	}
	f.ack(1) // an ack for nothing written is ignored
	if f.bits.Load() != nil {
		t.Fatal("an ack before any write made the record")
	}
	for seq := uint64(1); seq <= 3; seq++ {
		f.write(seq)
	}
	f.ack(1)
	f.writeOff(2)
	for seq, want := range map[uint64]fateOf{1: fateAcked, 2: fateOff, 3: fatePending, 4: fateUnknown} {
		if got := f.of(seq); got != want {
			t.Errorf("of(%d) = %d, want %d", seq, got, want)
		}
	}
	// Its slot taken by a later seq, a message is unknown again.
	f.write(1 + fateRing)
	if got := f.of(1); got != fateUnknown {
		t.Errorf("of(1) after seq %d took its slot = %d, want unknown", 1+fateRing, got)
	}
	var none *fate
	none.write(1)
	none.ack(1)
	if none.of(1) != fateUnknown {
		t.Error("a nil record knows a fate")
	}
}

// TestFanoutBeforeFirstMessage: a group stream holds no timing ring until
// it sends, and a delivery it never timed is ignored.
func TestFanoutBeforeFirstMessage(t *testing.T) {
	f := &fanout{}
	f.arrived(1, 100)
	if f.ring != nil {
		t.Fatal("a delivery made the ring")
	}
}
