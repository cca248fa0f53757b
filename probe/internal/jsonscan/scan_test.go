package jsonscan

import (
	"encoding/json"
	"testing"
)

// FuzzSkip holds the scanner to encoding/json's grammar: whatever it reads
// as one whole value must be valid JSON. (It may refuse more: nesting past
// MaxDepth, invalid UTF-8.)
func FuzzSkip(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5e3,-0.5,true,false,null,{"b":"c\u00e9\n"}]}`, `"\ud83d\ude00"`, `[]`, `01`, `{"a":}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		p := Scanner{B: b}
		if p.Skip(0) != nil || p.End() != nil {
			return
		}
		if !json.Valid(in) {
			t.Fatalf("scanner accepted %q, which is not valid JSON", in)
		}
	})
}

func TestStrUnescapesInPlace(t *testing.T) {
	for in, want := range map[string]string{
		`"plain"`:              "plain",
		`"a\"b\\c\/d"`:         `a"b\c/d`,
		`"\u00e9\ud83d\ude00"`: "é😀",
		`"lone \ud83d x"`:      "lone \uFFFD x",
	} {
		p := Scanner{B: []byte(in)}
		got, err := p.Str()
		if err != nil || string(got) != want {
			t.Errorf("Str(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`"a`, `"\q"`, `"\u12"`, "\"\x01\"", "\"\xff\""} {
		p := Scanner{B: []byte(in)}
		if _, err := p.Str(); err == nil {
			t.Errorf("Str(%q) = nil error, want one", in)
		}
	}
}
