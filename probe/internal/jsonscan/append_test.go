package jsonscan

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzAppendString: what AppendString writes, encoding/json reads back as
// the same string, for every valid UTF-8 input.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "imcanary-u0", `a"b\c`, "tab\tnl\nnul\x00", "é ✓ 𝄞", "\x7f\x1f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		b := AppendString([]byte("x"), s)
		var got string
		if err := json.Unmarshal(b[1:], &got); err != nil || got != s {
			t.Fatalf("AppendString(%q) = %s, which reads back as %q, %v", s, b[1:], got, err)
		}
		if e := AppendEscaped(nil, []byte(s)); string(e) != string(b[2:len(b)-1]) {
			t.Fatalf("AppendEscaped(%q) = %s, want %s", s, e, b[2:len(b)-1])
		}
	})
}

func TestParseUint(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "7": 7, "18446744073709551615": -2, "18446744073709551616": -1,
		"": -1, "-1": -1, "1.5": -1, "12a": -1, "000000000000000000001": -1,
	} {
		got, ok := ParseUint([]byte(in))
		switch {
		case want == -1 && ok:
			t.Errorf("ParseUint(%q) = %d, want refused", in, got)
		case want == -2 && (!ok || got != 1<<64-1):
			t.Errorf("ParseUint(%q) = %d, %v, want the largest uint64", in, got, ok)
		case want >= 0 && (!ok || got != uint64(want)):
			t.Errorf("ParseUint(%q) = %d, %v, want %d", in, got, ok, want)
		}
	}
}
