package probe

import (
	"bytes"
	"testing"
)

// FuzzBodyRoundTrip holds ParseBody to its contract on any bytes a server
// might hand back: it never panics, never changes its input, fails only
// with its own errors (ErrNotProbe exactly when the magic is missing), and
// a body it accepts is encoded again by AppendBody, padded or not, to one
// that parses to the same Header, field for field.
func FuzzBodyRoundTrip(f *testing.F) {
	f.Add([]byte("imc1 r s d.x 1 2 0-0"), uint16(0))
	f.Add([]byte("imc1 run1 imcanary-u17 g.imcanary-g3 18446744073709551615 9223372036854775807 1-2 xxxx"), uint16(200))
	f.Add([]byte("imc1 r s d.x 007 0002 0-00 trailing words"), uint16(3))
	f.Add([]byte("imc1 r\xff s\x00 d.\n 1 2 3-4"), uint16(64))
	f.Add([]byte("imc1 r s d 1 9223372036854775808 0-0"), uint16(0))
	f.Add([]byte("imc2 r s d 1 2 0-0"), uint16(0))
	f.Add([]byte("imc1 r s d 9 2 0-0 r7 m3 b1"), uint16(90))
	f.Add([]byte("imc1 r s d 9 2 0-0 b1 r7 r8 xx"), uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, size uint16) {
		in := bytes.Clone(b)
		var h Header
		err := ParseBody(b, &h)
		if !bytes.Equal(b, in) {
			t.Fatalf("ParseBody(%q) changed its input to %q", in, b)
		}
		if notProbe := !bytes.HasPrefix(b, []byte(bodyMagic+" ")); notProbe != (err == ErrNotProbe) {
			t.Fatalf("ParseBody(%q) = %v, want ErrNotProbe exactly when the magic is missing", b, err)
		}
		if err != nil {
			if err != ErrNotProbe && err != ErrBadBody && err != errFieldNumber {
				t.Fatalf("ParseBody(%q) = %v, want one of its own errors", b, err)
			}
			return
		}
		if h.Seq == 0 || h.Intended < 0 || h.VoidHi < h.VoidLo ||
			len(h.Run) == 0 || len(h.Sender) == 0 || len(h.Stream) == 0 {
			t.Fatalf("ParseBody(%q) accepted %+v, which breaks its own rules", b, h)
		}
		again := AppendBody(nil, &h, int(size))
		// Padding needs a space before its first 'x', so a body one byte
		// short of size stays unpadded: AppendBody's "at least size" is
		// one byte generous there.
		if len(again) < int(size)-1 {
			t.Fatalf("AppendBody(%+v, %d) = %q, shorter than asked", h, size, again)
		}
		var h2 Header
		if err := ParseBody(again, &h2); err != nil || !sameHeader(&h, &h2) {
			t.Fatalf("ParseBody(%q) = %+v, re-encoded as %q parses to %+v, %v", b, h, again, h2, err)
		}
	})
}

func sameHeader(a, b *Header) bool {
	return bytes.Equal(a.Run, b.Run) && bytes.Equal(a.Sender, b.Sender) && bytes.Equal(a.Stream, b.Stream) &&
		a.Seq == b.Seq && a.Intended == b.Intended && a.VoidLo == b.VoidLo && a.VoidHi == b.VoidHi &&
		a.HasResolved == b.HasResolved && a.Resolved == b.Resolved && a.OffMask == b.OffMask && a.Begun == b.Begun
}
