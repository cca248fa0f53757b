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
			"history msg", appendHistMsg(nil, `7"`, appendMsg(nil, "u1", "group", "g1", "g:g1", 43, 9, []byte(`"x"`))),
			map[string]any{"type": "msg", "id": `7"`, "from": "u1", "group": "g1", "conv": "g:g1", "msg_id": "43", "seq": 9.0, "body": "x"},
		},
		{
			"history ok", appendHistOK(nil, "7", "g:g1", 12, 3, true),
			map[string]any{"type": "ok", "id": "7", "conv": "g:g1", "last": 12.0, "first": 3.0, "more": true},
		},
		{
			"history ok, nothing more", appendHistOK(nil, "7", "d:a:b", 0, 1, false),
			map[string]any{"type": "ok", "id": "7", "conv": "d:a:b", "last": 0.0, "first": 1.0, "more": false},
		},
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

func TestAppendSeqs(t *testing.T) {
	convs := []convSeq{{"d:a:b", 7}, {"g:g\"1", 9}, {"g:z", 0}}
	tests := []struct {
		name     string
		maxBytes int
		want     string
	}{
		{"none", 1 << 10, `{"type":"seqs","id":"8","convs":{}}`},
		{"all", 1 << 10, `{"type":"seqs","id":"8","convs":{"d:a:b":7,"g:g\"1":9,"g:z":0}}`},
		{"cut", 74, `{"type":"seqs","id":"8","convs":{"d:a:b":7,"g:g\"1":9},"more":true}`},
		{"cut to nothing", 10, `{"type":"seqs","id":"8","convs":{},"more":true}`},
	}
	for _, tt := range tests {
		in := convs
		if tt.name == "none" {
			in = nil
		}
		got := string(appendSeqs(nil, "8", in, tt.maxBytes))
		if got != tt.want {
			t.Errorf("appendSeqs(%s, max %d) = %s, want %s", tt.name, tt.maxBytes, got, tt.want)
		}
		if tt.name == "cut" && len(got) > tt.maxBytes {
			t.Errorf("appendSeqs(%s, max %d) is %d bytes long", tt.name, tt.maxBytes, len(got))
		}
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
