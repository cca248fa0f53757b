package reference

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

func TestParseFrame(t *testing.T) {
	tests := []struct {
		in   string
		want frame
	}{
		{`{"type":"msg","from":"u1","group":"g1","conv":"g:g1","msg_id":"43","seq":9,"body":"imc1 x"}`,
			frame{typ: b("msg"), from: b("u1"), group: b("g1"), msgID: b("43"), seq: 9, body: b("imc1 x")}},
		{` { "type" : "ack" , "id":"17", "msg_id":"42","seq":7 } `,
			frame{typ: b("ack"), id: b("17"), msgID: b("42"), seq: 7}},
		{`{"type":"error","id":"3","code":"not_member","message":"a \"quoted\" \u00e9 \ud83d\ude00 \n"}`,
			frame{typ: b("error"), id: b("3"), code: b("not_member"), message: b("a \"quoted\" é 😀 \n")}},
		{`{"type":"pong","extra":{"a":[1,2.5e3,-0.5,true,false,null,{"b":"c"}]},"n":-1}`,
			frame{typ: b("pong")}},
		{`{"type":"x","message":"lone \ud83d half"}`, frame{typ: b("x"), message: b("lone \uFFFD half")}},
		{`{}`, frame{}},
	}
	for _, tt := range tests {
		var f frame
		if err := parseFrame([]byte(tt.in), &f); err != nil {
			t.Errorf("parseFrame(%q) = %v, want nil", tt.in, err)
			continue
		}
		if !sameFrame(f, tt.want) {
			t.Errorf("parseFrame(%q) = %s, want %s", tt.in, show(f), show(tt.want))
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	for _, in := range []string{
		``, `[]`, `{`, `{"type"}`, `{"type":"msg",}`, `{"type":"msg"} x`, `{"type":msg}`,
		`{"seq":-1}`, `{"seq":1.5}`, `{"seq":018}`, `{"seq":99999999999999999999999}`,
		`{"type":"a` + "\x01" + `"}`, `{"type":"\q"}`, `{"type":"\u12"}`, "{\"type\":\"\xff\"}",
		`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		`{"x":tru}`, `{"x":01}`, `{"x":1.}`, `{"x":1e}`, `{"x":-}`,
	} {
		var f frame
		if err := parseFrame([]byte(in), &f); err == nil {
			t.Errorf("parseFrame(%q) = nil, want an error", in)
		}
	}
}

// FuzzParseFrame checks the hand-written parser against encoding/json: it
// must never panic, and it must accept exactly the objects encoding/json
// accepts (within its depth limit), with the same string values.
func FuzzParseFrame(f *testing.F) {
	f.Add([]byte(`{"type":"msg","from":"u1","seq":9,"body":"imc1 x"}`))
	f.Add([]byte(`{"type":"error","message":"\ud83d\ude00\n","x":[1,{"a":null}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var ref map[string]any
		refErr := json.Unmarshal(in, &ref)
		cp := append([]byte(nil), in...)
		var fr frame
		err := parseFrame(cp, &fr)
		if err != nil {
			return // stricter than encoding/json is allowed (depth, seq range)
		}
		if refErr != nil {
			t.Fatalf("parseFrame(%q) accepted what encoding/json rejects: %v", in, refErr)
		}
		if s, ok := ref["type"].(string); ok && s != string(fr.typ) {
			t.Fatalf("parseFrame(%q).type = %q, encoding/json says %q", in, fr.typ, s)
		}
		if s, ok := ref["body"].(string); ok && s != string(fr.body) {
			t.Fatalf("parseFrame(%q).body = %q, encoding/json says %q", in, fr.body, s)
		}
	})
}

// BenchmarkDeliveryPath measures the receive path from a delivery frame's
// bytes to the ledger's counters: parse, then ledger.
func BenchmarkDeliveryPath(b *testing.B) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
	start := time.Now()
	l := engine.NewLedger(set, "run1", start, 10*time.Second, 30*time.Second)
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	var body, frameBuf []byte
	now := start.UnixNano()
	var fr frame
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		body = probe.AppendBody(body[:0], &h, 0)
		frameBuf = append(frameBuf[:0], `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"`...)
		frameBuf = append(frameBuf, `123456","seq":`...)
		frameBuf = append(frameBuf, `77,"body":`...)
		frameBuf = jsonscan.AppendString(frameBuf, body)
		frameBuf = append(frameBuf, '}')
		if err := parseFrame(frameBuf, &fr); err != nil {
			b.Fatal(err)
		}
		in.Receive(fr.body, now+int64(i)+1e6)
	}
}

// BenchmarkDeliveryPathEncodingJSON is the baseline for
// BenchmarkDeliveryPath: the same frames decoded with encoding/json into a
// struct, the obvious alternative to the hand-written parser. Compare the two
// from one run (the bench script prints the ratio).
func BenchmarkDeliveryPathEncodingJSON(b *testing.B) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
	start := time.Now()
	l := engine.NewLedger(set, "run1", start, 10*time.Second, 30*time.Second)
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	var body, frameBuf []byte
	now := start.UnixNano()
	var fr struct {
		Type  string `json:"type"`
		From  string `json:"from"`
		Group string `json:"group"`
		MsgID string `json:"msg_id"`
		Seq   uint64 `json:"seq"`
		Body  string `json:"body"`
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		body = probe.AppendBody(body[:0], &h, 0)
		frameBuf = append(frameBuf[:0], `{"type":"msg","from":"imcanary-u17","group":"imcanary-g3","conv":"g:imcanary-g3","msg_id":"`...)
		frameBuf = append(frameBuf, `123456","seq":`...)
		frameBuf = append(frameBuf, `77,"body":`...)
		frameBuf = jsonscan.AppendString(frameBuf, body)
		frameBuf = append(frameBuf, '}')
		if err := json.Unmarshal(frameBuf, &fr); err != nil {
			b.Fatal(err)
		}
		in.Receive([]byte(fr.Body), now+int64(i)+1e6)
	}
}

func b(s string) []byte { return []byte(s) }

func sameFrame(a, b frame) bool {
	return string(a.typ) == string(b.typ) && string(a.id) == string(b.id) && string(a.from) == string(b.from) &&
		string(a.group) == string(b.group) && string(a.msgID) == string(b.msgID) && string(a.body) == string(b.body) &&
		string(a.code) == string(b.code) && string(a.message) == string(b.message) && a.seq == b.seq
}

func show(f frame) string {
	return `{typ:"` + string(f.typ) + `" id:"` + string(f.id) + `" from:"` + string(f.from) + `" group:"` + string(f.group) +
		`" msgID:"` + string(f.msgID) + `" body:"` + string(f.body) + `" code:"` + string(f.code) + `" message:"` + string(f.message) + `"}`
}
