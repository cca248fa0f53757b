package refserver

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestOutgoingFrames(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want map[string]any
	}{
		{
			"ack", appendAck(nil, `i"d`, 42, "d:u1:u2", 7),
			map[string]any{"type": "ack", "id": `i"d`, "msg_id": "42", "conv": "d:u1:u2", "seq": 7.0},
		},
		{
			"direct msg", appendMsg(nil, "u1", "to", "u2", "d:u1:u2", 42, 7, []byte(`"b\u00e9\n"`)),
			map[string]any{"type": "msg", "from": "u1", "to": "u2", "conv": "d:u1:u2", "msg_id": "42", "seq": 7.0, "body": "bé\n"},
		},
		{
			"group msg", appendMsg(nil, "u1", "group", "g1", "g:g1", 43, 9, []byte(`""`)),
			map[string]any{"type": "msg", "from": "u1", "group": "g1", "conv": "g:g1", "msg_id": "43", "seq": 9.0, "body": ""},
		},
		{"reply", appendReply(nil, "pong", "5"), map[string]any{"type": "pong", "id": "5"}},
		{
			"error", appendError(nil, "3", "not_member", "not a member of group \"g\""),
			map[string]any{"type": "error", "id": "3", "code": "not_member", "message": "not a member of group \"g\""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got map[string]any
			if err := json.Unmarshal(tt.got, &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) = %v", tt.got, err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("frame %s has %d fields, want %d", tt.got, len(got), len(tt.want))
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("frame %s: %q = %v, want %v", tt.got, k, got[k], v)
				}
			}
		})
	}
}

func TestAppendString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"\n\r\t\x00\x1f", `"\n\r\t\u0000\u001f"`},
		{"<&>", `"<&>"`},
		{"ü\u2028\u2029", `"ü\u2028\u2029"`},
		{"a\xffb", `"a\ufffdb"`},
	}
	for _, tt := range tests {
		if got := string(appendString(nil, tt.in)); got != tt.want {
			t.Errorf("appendString(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a", `"\`, "\x00\u2028", "\xff\xfe", "日本語"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := appendString(nil, s)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("appendString(%q) = %s, not valid JSON: %v", s, out, err)
		}
		if utf8.ValidString(s) && got != s {
			t.Fatalf("appendString(%q) decodes to %q", s, got)
		}
		// encoding/json agrees on invalid UTF-8 too: both use U+FFFD.
		want, _ := json.Marshal(s)
		var wantS string
		_ = json.Unmarshal(want, &wantS)
		if got != wantS {
			t.Fatalf("appendString(%q) decodes to %q, encoding/json to %q", s, got, wantS)
		}
	})
}
