package engine

import (
	"fmt"
	"testing"
	"time"
)

func spans(st *sendStream) string {
	s := ""
	for _, v := range st.voids {
		s += fmt.Sprintf("%d-%d ", v.lo, v.hi)
	}
	return s
}

func TestSendStreamVoids(t *testing.T) {
	tests := []struct {
		add  []uint64
		want string
	}{
		{[]uint64{5}, "5-5 "},
		{[]uint64{5, 6, 7}, "5-7 "},
		{[]uint64{7, 6, 5}, "5-7 "},
		{[]uint64{11, 10}, "10-11 "},        // out of order must not invert
		{[]uint64{3, 9, 6}, "3-3 6-6 9-9 "}, // sorted
		{[]uint64{3, 5, 4}, "3-5 "},         // the middle joins both
		{[]uint64{5, 5}, "5-5 "},            // idempotent
		{[]uint64{1, 3, 5, 7, 9, 11, 13, 15, 30}, "1-3 5-5 7-7 9-9 11-11 13-13 15-15 30-30 "}, // full: closest pair merged
	}
	for _, tt := range tests {
		st := &sendStream{}
		for _, s := range tt.add {
			st.addVoid(s)
		}
		if got := spans(st); got != tt.want {
			t.Errorf("addVoid(%v) spans = %q, want %q", tt.add, got, tt.want)
		}
	}
}

// TestTakeVoidTakesTurns checks every pending span reaches receivers within
// one message per span, and each is carried voidRepeats times.
func TestTakeVoidTakesTurns(t *testing.T) {
	st := &sendStream{}
	for _, s := range []uint64{2, 5, 8} {
		st.addVoid(s)
	}
	seen := map[uint64]int{}
	for i := range 3 * voidRepeats {
		lo, _ := st.takeVoid()
		if i < 3 && seen[lo] > 0 {
			t.Fatalf("span %d carried twice before every span was carried once", lo)
		}
		seen[lo]++
	}
	for _, s := range []uint64{2, 5, 8} {
		if seen[s] != voidRepeats {
			t.Errorf("span %d carried %d times, want %d", s, seen[s], voidRepeats)
		}
	}
	if lo, hi := st.takeVoid(); lo != 0 || hi != 0 || len(st.voids) != 0 {
		t.Errorf("after all repeats takeVoid() = %d-%d with %d spans left, want 0-0 and none", lo, hi, len(st.voids))
	}
}

func TestBackoffBounded(t *testing.T) {
	for _, min := range []time.Duration{time.Millisecond, 20 * time.Second, time.Minute} {
		p := &Population{opts: Options{Connection: Connection{BackoffMin: min, BackoffMax: 2 * time.Minute}}}
		for attempt := range 100 {
			if d := p.backoff(attempt); d <= 0 || d > p.opts.BackoffMax {
				t.Fatalf("backoff(%d) with initial %v = %v, want in (0, %v]", attempt, min, d, p.opts.BackoffMax)
			}
		}
	}
}
