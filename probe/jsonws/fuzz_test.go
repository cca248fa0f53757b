package jsonws

import (
	"encoding/json"
	"strings"
	"testing"
)

// Real frames of the servers the shipped mappings describe: the seed
// corpus of the decoder's fuzz target.
var seedFrames = []string{
	// The reference server.
	`{"type":"msg","from":"u1","group":"g1","conv":"g:g1","msg_id":"43","seq":9,"body":"imc1 r u1 g.g1 9 1 0-0"}`,
	`{"type":"ack","id":"3","msg_id":"42","conv":"d:u1:u2","seq":7}`,
	`{"type":"seqs","id":"8","convs":{"d:u1:u2":7,"g:g1":14}}`,
	`{"type":"error","id":"3","code":"not_member","message":"…"}`,
	// Tinode.
	`{"ctrl":{"id":"5","topic":"grpX2aLfY2xJQ","params":{"seq":12},"code":202,"text":"accepted","ts":"2026-12-01T10:00:00.000Z"}}`,
	`{"data":{"topic":"usrA1b2","from":"usrC3d4","ts":"2026-12-01T10:00:00.000Z","seq":3,"content":"imc1 r u2 d.u1 3 1 0-0"}}`,
	`{"pres":{"topic":"me","src":"usrA1b2","what":"on"}}`,
	// Socket.IO (Engine.IO v4 framing).
	`0{"sid":"31Pz","upgrades":[],"pingInterval":25000,"pingTimeout":20000,"maxPayload":1000000}`,
	`40{"sid":"8AOm6Yw862bTcqymAAAC"}`,
	`44{"message":"unauthorized"}`,
	`432[{"ok":true,"seq":1,"conv":"d:alice:bob","id":1}]`,
	`42["message",{"id":2,"from":"alice","conv":"g:g1","seq":1,"body":"hello g1","group":"g1"}]`,
	`2`,
	`42/admin,["x"]`,
	`{"a":"\ud83d\ude00\n","b":[1,{"c":null}],"d":-1.5e3}`,
}

// FuzzDecode feeds arbitrary frames to the decoders of the shipped
// mappings: they never panic, an object frame they accept is JSON that
// encoding/json accepts, and the body they find is the one it finds.
func FuzzDecode(f *testing.F) {
	for _, s := range seedFrames {
		f.Add([]byte(s))
	}
	var maps []*mapping
	for _, path := range []string{"../../configs/jsonws-reference.yaml", "../../configs/socketio.yaml"} {
		m, errs := compile(loadSection(f, path))
		if len(errs) > 0 {
			f.Fatal(errs)
		}
		maps = append(maps, m)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, m := range maps {
			msgs := 0
			var body string
			var hasBody bool
			err := m.dec.each(append([]byte(nil), in...), m.dec.newMsg(), func(x *msg) error {
				msgs++
				if v := x.vals[m.delivery.body]; v.kind == kindString {
					body, hasBody = string(v.b), true
				}
				for _, r := range []*rule{m.delivery.match, m.ack.match, m.done.match} {
					r.match(x)
				}
				corrID(x.vals[m.ack.id])
				return nil
			})
			if err != nil || m.framing != framingObject {
				continue
			}
			var ref any
			if jerr := json.Unmarshal(in, &ref); jerr != nil {
				t.Fatalf("decoded %q, which encoding/json refuses: %v", in, jerr)
			}
			if obj, ok := ref.(map[string]any); ok && hasBody {
				if s, ok := obj["body"].(string); !ok || s != body {
					t.Fatalf("body of %q = %q, encoding/json says %q", in, body, obj["body"])
				}
			}
		}
	})
}

// TestSeedFramesDecode keeps the seed corpus meaningful: each frame is
// read by at least one shipped mapping.
func TestSeedFramesDecode(t *testing.T) {
	var maps []*mapping
	for _, path := range []string{"../../configs/jsonws-reference.yaml", "../../configs/socketio.yaml"} {
		m, _ := compile(loadSection(t, path))
		maps = append(maps, m)
	}
	for _, s := range seedFrames {
		ok := false
		for _, m := range maps {
			if m.dec.each([]byte(s), m.dec.newMsg(), func(*msg) error { return nil }) == nil {
				ok = true
			}
		}
		if !ok && !strings.HasPrefix(s, "{") {
			t.Errorf("no mapping reads %q", s)
		}
	}
}
