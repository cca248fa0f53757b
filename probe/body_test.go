package probe

import (
	"bytes"
	"testing"
)

// TestBodyMarks: the resolved mark, the off mask and the stream's start
// go out after the void span and come back as written, in any order; a
// token that is not exactly one of them is padding, as it always was,
// so a body an earlier version accepted parses the same, and none is
// refused that was accepted before.
func TestBodyMarks(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Header
	}{
		{"imc1 r s d.x 5 9 0-0", Header{}},
		{"imc1 r s d.x 5 9 0-0 r4", Header{HasResolved: true, Resolved: 4}},
		{"imc1 r s d.x 5 9 0-0 r0", Header{HasResolved: true}},
		{"imc1 r s d.x 5 9 1-2 r4 m5 b77 xxxx", Header{HasResolved: true, Resolved: 4, OffMask: 5, Begun: 77}},
		{"imc1 r s d.x 5 9 0-0 b77 m1f r4", Header{HasResolved: true, Resolved: 4, OffMask: 0x1f, Begun: 77}},
		{"imc1 r s d.x 5 9 0-0 mffffffffffffffff", Header{OffMask: 1<<64 - 1}},
		// Padding, or words an earlier sender wrote: never marks.
		{"imc1 r s d.x 5 9 0-0 xxxx r4", Header{}},
		{"imc1 r s d.x 5 9 0-0 trailing words", Header{}},
		{"imc1 r s d.x 5 9 0-0 rx m5", Header{}},
		{"imc1 r s d.x 5 9 0-0 r4 r5", Header{HasResolved: true, Resolved: 4}},
		{"imc1 r s d.x 5 9 0-0 r4 mAB", Header{HasResolved: true, Resolved: 4}},
		{"imc1 r s d.x 5 9 0-0 m10000000000000000", Header{}},
		{"imc1 r s d.x 5 9 0-0 b9223372036854775808", Header{}},
		{"imc1 r s d.x 5 9 0-0 r18446744073709551616", Header{}},
		{"imc1 r s d.x 5 9 0-0  r4", Header{}},
	} {
		var h Header
		if err := ParseBody([]byte(tc.body), &h); err != nil {
			t.Errorf("ParseBody(%q) = %v, want it accepted", tc.body, err)
			continue
		}
		got := marks{h.HasResolved, h.Resolved, h.OffMask, h.Begun}
		if want := (marks{tc.want.HasResolved, tc.want.Resolved, tc.want.OffMask, tc.want.Begun}); got != want {
			t.Errorf("ParseBody(%q) marks = %+v, want %+v", tc.body, got, want)
		}
		if h.Seq != 5 || h.Intended != 9 || string(h.Stream) != "d.x" {
			t.Errorf("ParseBody(%q) = %+v: the marks changed the fields before them", tc.body, h)
		}
	}
}

type marks struct {
	has            bool
	resolved, mask uint64
	begun          int64
}

// TestBodyMarksAfterVoids: a body with marks starts with the same seven
// fields as one without, so an earlier version, which reads seven and
// takes the rest for padding, reads it as it would the body without
// them; and the padding still pads to the size asked.
func TestBodyMarksAfterVoids(t *testing.T) {
	plain := Header{Run: []byte("run"), Sender: []byte("p-u1"), Stream: []byte("g.p-g0"), Seq: 70, Intended: 1e18, VoidLo: 3, VoidHi: 4}
	marked := plain
	marked.HasResolved, marked.Resolved, marked.OffMask, marked.Begun = true, 68, 1<<63|1, 9e17
	a, b := AppendBody(nil, &plain, 200), AppendBody(nil, &marked, 200)
	if len(a) != 200 || len(b) != 200 {
		t.Fatalf("padded to %d and %d bytes, want 200", len(a), len(b))
	}
	if fa, fb := bytes.Fields(a)[:7], bytes.Fields(b)[:7]; !bytes.Equal(bytes.Join(fa, nil), bytes.Join(fb, nil)) {
		t.Fatalf("first seven fields %q, with marks %q: want the same", fa, fb)
	}
	var h Header
	if err := ParseBody(b, &h); err != nil || !sameHeader(&h, &marked) {
		t.Fatalf("ParseBody(%q) = %+v, %v; want %+v", b, h, err, marked)
	}
}
