package centrifugo

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// summary is a parsed message with its slices copied out, for comparing.
type summary struct {
	id                         uint64
	fields                     int
	hasErr                     bool
	errCode                    uint64
	errMsg                     string
	result                     int
	epoch                      string
	offset, ping, ttl          uint64
	pong, expires, recovered   bool
	pubs                       string
	push                       int
	channel, body, user, pepch string
	poffset, code              uint64
	reason                     string
}

func summarize(m *msg, frame []byte) summary {
	return summary{
		id: m.id, fields: m.fields, hasErr: m.hasErr, errCode: m.errCode, errMsg: string(m.errMsg),
		result: m.result, epoch: string(m.res.epoch), offset: m.res.offset, ping: m.res.ping, ttl: m.res.ttl,
		pong: m.res.pong, expires: m.res.expires, recovered: m.res.recovered, pubs: string(frame[m.res.pubsLo:m.res.pubsHi]),
		push: m.push, channel: string(m.channel), body: string(m.pub.body), user: string(m.pub.user), pepch: string(m.pub.epoch),
		poffset: m.pub.offset, code: m.code, reason: string(m.reason),
	}
}

// parseAll parses every message of a frame.
func parseAll(frame []byte) ([]summary, error) {
	var out []summary
	var m msg
	p := parser{jsonscan.Scanner{B: frame}}
	for p.More() {
		if err := p.message(&m); err != nil {
			return out, err
		}
		out = append(out, summarize(&m, frame))
	}
	return out, nil
}

// Frames as Centrifugo v6.9.1 sent them (client ids shortened).
func TestParseFrame(t *testing.T) {
	tests := []struct {
		in   string
		want []summary
	}{
		{`{"id":1,"connect":{"client":"8537488b","version":"0.0.0 OSS","expires":true,"ttl":3600,"ping":25,"pong":true}}`,
			[]summary{{id: 1, fields: 2, result: resConnect, expires: true, ttl: 3600, ping: 25, pong: true}}},
		{`{"id":2,"subscribe":{"recoverable":true,"epoch":"pnyDOohn","positioned":true}}` + "\n" +
			`{"id":3,"subscribe":{"recoverable":true,"epoch":"BVHyZdbq","offset":1,"positioned":true}}`,
			[]summary{{id: 2, fields: 2, result: resSubscribe, epoch: "pnyDOohn"}, {id: 3, fields: 2, result: resSubscribe, epoch: "BVHyZdbq", offset: 1}}},
		{`{"id":4,"error":{"code":103,"message":"permission denied"}}`,
			[]summary{{id: 4, fields: 2, hasErr: true, errCode: 103, errMsg: "permission denied"}}},
		{`{"push":{"channel":"chat:cap","pub":{"data":{"b":"esc \"q\" \\ \u00e9 \n\t"},"info":{"user":"ub","client":"8537488b"},"offset":1,"epoch":"pnyDOohn"}}}` + "\n" +
			`{"id":7,"publish":{}}`,
			[]summary{
				{fields: 1, push: pushPub, channel: "chat:cap", body: "esc \"q\" \\ é \n\t", user: "ub", pepch: "pnyDOohn", poffset: 1},
				{id: 7, fields: 2, result: resPublish},
			}},
		{`{"id":21,"subscribe":{"recoverable":true,"epoch":"pnyDOohn","publications":[{"data":{"b":"imc1 r"},"info":{"user":"ub"},"offset":6}],"recovered":true,"offset":5,"positioned":true,"was_recovering":true}}`,
			[]summary{{id: 21, fields: 2, result: resSubscribe, epoch: "pnyDOohn", offset: 5, recovered: true,
				pubs: `[{"data":{"b":"imc1 r"},"info":{"user":"ub"},"offset":6}]`}}},
		{`{"id":22,"refresh":{"expires":true,"ttl":3600}}`, []summary{{id: 22, fields: 2, result: resRefresh, expires: true, ttl: 3600}}},
		{`{}`, []summary{{}}},
		{"{}\n{}\n", []summary{{}, {}}},
		{`{"push":{"channel":"chat:g1","unsubscribe":{"code":2500,"reason":"insufficient state"}}}`,
			[]summary{{fields: 1, push: pushUnsubscribe, channel: "chat:g1", code: 2500, reason: "insufficient state"}}},
		{`{"push":{"disconnect":{"code":3008,"reason":"slow","reconnect":true}}}`,
			[]summary{{fields: 1, push: pushDisconnect, code: 3008, reason: "slow"}}},
		{`{"push":{"channel":"chat:g1","join":{"info":{"user":"u3","client":"c"}}}}`,
			[]summary{{fields: 1, push: pushOther, channel: "chat:g1"}}},
		// Other payloads than imcanary's leave the body empty.
		{`{"push":{"channel":"chat:g1","pub":{"data":"notobject","info":{"user":"ub"},"offset":4}}}`,
			[]summary{{fields: 1, push: pushPub, channel: "chat:g1", user: "ub", poffset: 4}}},
		{`{"push":{"channel":"c","pub":{"data":{"b":7,"x":[1,{"y":null}]},"offset":4}}}`,
			[]summary{{fields: 1, push: pushPub, channel: "c", poffset: 4}}},
		// null reads as absent; the last of repeated keys counts.
		{`{"id":null,"error":null,"push":{"channel":null,"pub":{"data":null,"info":null,"offset":null}}}`,
			[]summary{{fields: 3, push: pushPub}}},
		{`{"push":{"channel":"a","pub":{"data":{"b":"one","b":"two"},"offset":1}},"push":{"channel":"b"}}`,
			[]summary{{fields: 2, push: pushOther, channel: "b"}}},
		{`{"\u0069d":5}`, []summary{{id: 5, fields: 1}}},
	}
	for _, tt := range tests {
		got, err := parseAll([]byte(tt.in))
		if err != nil {
			t.Errorf("parse(%q) = %v, want nil", tt.in, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("parse(%q) = %d messages, want %d", tt.in, len(got), len(tt.want))
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("parse(%q)[%d] = %+v, want %+v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	for _, in := range []string{
		`[]`, `{`, `{"id"}`, `{"id":1,}`, `{"id":1} x`, `{"id":x}`, `null`, `"x"`,
		`{"id":-1}`, `{"id":1.5}`, `{"id":1e3}`, `{"id":018}`, `{"id":99999999999999999999999}`, `{"id":"1"}`,
		`{"push":[]}`, `{"push":{"pub":"x"}}`, `{"push":{"channel":1}}`, `{"connect":{"pong":1}}`,
		`{"subscribe":{"publications":{}}}`, `{"subscribe":{"publications":[1,]}}`,
		`{"push":{"channel":"a` + "\x01" + `"}}`, `{"push":{"channel":"\q"}}`, `{"push":{"channel":"\u12"}}`,
		"{\"push\":{\"channel\":\"\xff\"}}", "{\"x\":\"\xff\"}", "{\"x\":\"\\n\xff\"}",
		`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		`{"x":tru}`, `{"x":01}`, `{"x":1.}`, `{"x":1e}`, `{"x":-}`, `{"x":nul}`,
		"{}\n{", "{} {\"id\":}",
	} {
		if _, err := parseAll([]byte(in)); err == nil {
			t.Errorf("parse(%q) = nil, want an error", in)
		}
	}
}

func TestParsePubs(t *testing.T) {
	in := []byte(` [ {"data":{"b":"imc1 a"},"info":{"user":"u2"},"offset":6} , {"data":{"b":"imc1 \"b\""},"offset":7,"epoch":"E"} ] `)
	var got []string
	err := parsePubs(in, func(pb *pub) error {
		got = append(got, string(pb.user)+"/"+string(pb.body)+"/"+strconv.FormatUint(pb.offset, 10)+"/"+string(pb.epoch))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := `u2/imc1 a/6/ /imc1 "b"/7/E`; strings.Join(got, " ") != want {
		t.Errorf("parsePubs = %q, want %q", strings.Join(got, " "), want)
	}
	for _, bad := range []string{`[`, `[{}`, `[{},]`, `{}`, `[1]`, `[] x`} {
		if err := parsePubs([]byte(bad), func(*pub) error { return nil }); err == nil {
			t.Errorf("parsePubs(%q) = nil, want an error", bad)
		}
	}
	stop := errors.New("stop")
	if err := parsePubs([]byte(`[{},{}]`), func(*pub) error { return stop }); err != stop {
		t.Errorf("parsePubs with a failing callback = %v, want its error", err)
	}
}

// FuzzParseFrame checks the hand-written parser against encoding/json: it
// must never panic, and every frame it accepts must be a stream of JSON
// objects that encoding/json decodes to the same values. It may be
// stricter (it wants integers where it reads numbers, objects where it
// reads fields, valid UTF-8); it must never be more lenient. The seed
// corpus in testdata/fuzz/FuzzParseFrame holds frames captured from
// Centrifugo v6.9.1.
func FuzzParseFrame(f *testing.F) {
	f.Add([]byte(`{"push":{"channel":"chat:g","pub":{"data":{"b":"imc1 x"},"info":{"user":"u"},"offset":9}}}` + "\n" + `{"id":3,"publish":{}}`))
	f.Add([]byte(`{"push":{"channel":"c","unsubscribe":{"code":2500,"reason":"insufficient state"}}}`))
	f.Add([]byte(`{"push":{"disconnect":{"code":3008,"reason":"slow"}}}` + "\n{}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		frame := bytes.Clone(in)
		got, err := parseAll(frame)
		if err != nil {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		for i, s := range got {
			var ref map[string]any
			if err := dec.Decode(&ref); err != nil {
				t.Fatalf("parse(%q) accepted message %d, encoding/json says %v", in, i, err)
			}
			if ref == nil {
				t.Fatalf("parse(%q) accepted message %d, encoding/json decodes null", in, i)
			}
			check(t, in, s, ref)
			// A subscribe result's raw publications parse on their own.
			if s.pubs != "" {
				n := 0
				if err := parsePubs([]byte(s.pubs), func(*pub) error { n++; return nil }); err == nil {
					if arr, _ := lookup(ref, "subscribe", "publications").([]any); len(arr) != n {
						t.Fatalf("parse(%q): %d publications, encoding/json says %d", in, n, len(arr))
					}
				}
			}
		}
		if err := dec.Decode(new(any)); err != io.EOF {
			t.Fatalf("parse(%q) saw %d messages, encoding/json sees more (%v)", in, len(got), err)
		}
	})
}

// lookup walks nested objects; nil if any step is missing or not an object.
func lookup(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func check(t *testing.T, in []byte, s summary, ref map[string]any) {
	t.Helper()
	str := func(v any) string { x, _ := v.(string); return x }
	num := func(v any) string {
		if n, ok := v.(json.Number); ok {
			return n.String()
		}
		return "0"
	}
	eq := func(what, got, want string) {
		if got != want {
			t.Fatalf("parse(%q).%s = %q, encoding/json says %q", in, what, got, want)
		}
	}
	eq("fields==0", strconv.FormatBool(s.fields == 0), strconv.FormatBool(len(ref) == 0))
	eq("id", strconv.FormatUint(s.id, 10), num(ref["id"]))
	if e, ok := ref["error"].(map[string]any); ok {
		eq("hasErr", strconv.FormatBool(s.hasErr), "true")
		eq("error.code", strconv.FormatUint(s.errCode, 10), num(e["code"]))
		eq("error.message", s.errMsg, str(e["message"]))
	} else {
		eq("hasErr", strconv.FormatBool(s.hasErr), "false")
	}
	push, _ := ref["push"].(map[string]any)
	eq("push present", strconv.FormatBool(s.push != pushNone), strconv.FormatBool(push != nil))
	if push == nil {
		return
	}
	eq("push.channel", s.channel, str(push["channel"]))
	if pb, ok := push["pub"].(map[string]any); ok {
		eq("pub.data.b", s.body, str(lookup(pb, "data", "b")))
		eq("pub.info.user", s.user, str(lookup(pb, "info", "user")))
		eq("pub.offset", strconv.FormatUint(s.poffset, 10), num(pb["offset"]))
		eq("pub.epoch", s.pepch, str(pb["epoch"]))
	} else {
		eq("pub.data.b", s.body, "")
	}
	u, uok := push["unsubscribe"].(map[string]any)
	d, dok := push["disconnect"].(map[string]any)
	if uok != dok {
		c := u
		if dok {
			c = d
		}
		eq("code", strconv.FormatUint(s.code, 10), num(c["code"]))
		eq("reason", s.reason, str(c["reason"]))
	}
}

// TestDeliveryPathAllocs: the parse of a push frame does not allocate.
func TestDeliveryPathAllocs(t *testing.T) {
	frame := []byte(`{"push":{"channel":"chat:imcanary-g3","pub":{"data":{"b":"imc1 run1 imcanary-u17 g.imcanary-g3 7 1764500000000000000 0-0"},"info":{"user":"imcanary-u17","client":"556ea035-9e02-4361-90a6-4b21fc0b44e5"},"offset":15}}}` + "\n" +
		`{"id":12,"publish":{}}`)
	buf := make([]byte, len(frame))
	var m msg
	allocs := testing.AllocsPerRun(100, func() {
		copy(buf, frame)
		p := parser{jsonscan.Scanner{B: buf}}
		for p.More() {
			if err := p.message(&m); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("parsing a push frame allocates %v times, want 0", allocs)
	}
}

// pushFrame appends the push frame Centrifugo sends for body.
func pushFrame(dst []byte, body []byte, offset uint64) []byte {
	dst = append(dst, `{"push":{"channel":"chat:imcanary-g3","pub":{"data":{"b":`...)
	dst = jsonscan.AppendString(dst, body)
	dst = append(dst, `},"info":{"user":"imcanary-u17","client":"556ea035-9e02-4361-90a6-4b21fc0b44e5"},"offset":`...)
	dst = strconv.AppendUint(dst, offset, 10)
	return append(dst, "}}}"...)
}

// BenchmarkDeliveryPath measures the receive path from a push frame's
// bytes to the ledger's counters: parse, then ledger.
func BenchmarkDeliveryPath(b *testing.B) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
	start := time.Now()
	l := engine.NewLedger(set, "run1", start, 10*time.Second, 30*time.Second)
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	var body, frame []byte
	now := start.UnixNano()
	var m msg
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		body = probe.AppendBody(body[:0], &h, 0)
		frame = pushFrame(frame[:0], body, uint64(i+1))
		p := parser{jsonscan.Scanner{B: frame}}
		for p.More() {
			if err := p.message(&m); err != nil {
				b.Fatal(err)
			}
			in.Receive(m.pub.body, now+int64(i)+1e6)
		}
	}
}

// BenchmarkDeliveryPathEncodingJSON is the baseline for
// BenchmarkDeliveryPath: the same frames decoded with encoding/json into
// structs, the obvious alternative to the hand-written parser.
func BenchmarkDeliveryPathEncodingJSON(b *testing.B) {
	set := metrics.New(prometheus.NewPedanticRegistry()).For("bench", metrics.SourceBackground)
	start := time.Now()
	l := engine.NewLedger(set, "run1", start, 10*time.Second, 30*time.Second)
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	var body, frame []byte
	now := start.UnixNano()
	var r struct {
		ID   uint32 `json:"id"`
		Push *struct {
			Channel string `json:"channel"`
			Pub     *struct {
				Data struct {
					B string `json:"b"`
				} `json:"data"`
				Info struct {
					User string `json:"user"`
				} `json:"info"`
				Offset uint64 `json:"offset"`
			} `json:"pub"`
		} `json:"push"`
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		body = probe.AppendBody(body[:0], &h, 0)
		frame = pushFrame(frame[:0], body, uint64(i+1))
		r.Push = nil
		if err := json.Unmarshal(frame, &r); err != nil {
			b.Fatal(err)
		}
		in.Receive([]byte(r.Push.Pub.Data.B), now+int64(i)+1e6)
	}
}

// TestHandleFrameAllocs: a session handles a frame of deliveries and acks
// without allocating, position tracking included.
func TestHandleFrameAllocs(t *testing.T) {
	d, err := New(Config{}, Options{URL: "ws://x", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	st := &devState{pos: map[string]*position{"chat:imcanary-g3": {epoch: "EP", known: true}}}
	s := &session{d: d, user: "imcanary-u1", userB: []byte("imcanary-u1"), st: st, acks: map[uint32]uint64{}}
	var h countHandler
	var got atomic.Int64
	h.n = &got
	frame := make([]byte, 0, 512)
	buf := make([]byte, 0, 512)
	offset := uint64(0)
	allocs := testing.AllocsPerRun(200, func() {
		offset++
		frame = pushFrame(frame[:0], []byte("imc1 run1 imcanary-u17 g.imcanary-g3 7 1764500000000000000 0-0"), offset)
		frame = append(frame, "\n"...)
		frame = append(frame, `{"id":12,"publish":{}}`...)
		s.acks[12] = offset
		buf = append(buf[:0], frame...)
		if err := s.handleFrame(buf, &h); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("handling a frame of a delivery and an ack allocates %v times, want 0", allocs)
	}
	if got.Load() == 0 || h.acks.Load() == 0 || d.ServerGaps() != 0 {
		t.Errorf("deliveries %d, acks %d, gaps %d: want deliveries and acks, no gap", got.Load(), h.acks.Load(), d.ServerGaps())
	}
}
