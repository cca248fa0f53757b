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
