package centrifugo

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe/internal/jsonscan"
)

// FuzzParsePubs checks parsePubs, which reads the publications a subscribe
// reply recovers, on its own against encoding/json: it never panics, it
// stops at the callback's error, and an array it accepts is one that
// encoding/json decodes to as many objects with the same body, publisher,
// epoch and offset. Like the frame parser it may be stricter, never more
// lenient.
func FuzzParsePubs(f *testing.F) {
	f.Add([]byte(`[{"data":{"b":"imc1 r u d.v 1 2 0-0"},"info":{"user":"u","client":"c"},"offset":1,"epoch":"EP"},{"data":{"b":"x"},"offset":2}]`))
	f.Add([]byte(` [ ] `))
	f.Add([]byte(`[{"data":null,"info":null,"offset":null,"epoch":null},{"data":{"b":1,"b":"\u00e9\ud83d\ude00"},"tags":{"k":"v"}}]`))
	f.Add([]byte(`[{"data":"eyJiIjoieCJ9","offset":18446744073709551615}]`))
	f.Add([]byte(`[{"data":{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}}]`))
	f.Add([]byte("[{\"data\":{\"b\":\"\xff\"}}]"))
	f.Add([]byte(`[{"offset":18446744073709551616}]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		type seen struct {
			body, user, epoch string
			offset            uint64
		}
		var got []seen
		err := parsePubs(bytes.Clone(in), func(pb *pub) error {
			got = append(got, seen{string(pb.body), string(pb.user), string(pb.epoch), pb.offset})
			return nil
		})
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("parsePubs(%q) returned an error without a message", in)
			}
			return
		}
		// A callback's error ends the walk at once.
		if len(got) > 0 {
			stop, n := jsonscan.ErrEOF, 0
			if err := parsePubs(bytes.Clone(in), func(*pub) error { n++; return stop }); err != stop || n != 1 {
				t.Fatalf("parsePubs(%q) with a failing callback = %v after %d calls, want its error after 1", in, err, n)
			}
		}
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		var ref []any
		if err := dec.Decode(&ref); err != nil || dec.More() {
			t.Fatalf("parsePubs(%q) accepted what encoding/json reads as %v (more: %v)", in, err, dec.More())
		}
		if ref == nil || len(ref) != len(got) {
			t.Fatalf("parsePubs(%q) saw %d publications, encoding/json %d", in, len(got), len(ref))
		}
		for i, r := range ref {
			m, ok := r.(map[string]any)
			if !ok {
				t.Fatalf("parsePubs(%q) accepted publication %d, which encoding/json reads as %T", in, i, r)
			}
			want := seen{
				body:   jsonString(m, "data", "b"),
				user:   jsonString(m, "info", "user"),
				epoch:  jsonString(m, "epoch"),
				offset: jsonUint(m, "offset"),
			}
			if got[i] != want {
				t.Fatalf("parsePubs(%q) publication %d = %+v, encoding/json says %+v", in, i, got[i], want)
			}
		}
	})
}

// jsonString returns the string at path in v, or "".
func jsonString(v any, path ...string) string {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	s, _ := v.(string)
	return s
}

func jsonUint(m map[string]any, key string) uint64 {
	n, _ := m[key].(json.Number)
	u, _ := strconv.ParseUint(n.String(), 10, 64)
	return u
}

// TestParseFrameHostile: frames no server should send, in sizes up to the
// read limit and beyond, are each an error, found without allocating in
// proportion to the frame and well within a second.
func TestParseFrameHostile(t *testing.T) {
	const pub = `{"push":{"channel":"chat:g","pub":{"data":{"b":"`
	for name, frame := range map[string]string{
		"deep nesting":      `{"push":{"x":` + strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20) + `}}`,
		"deep nesting open": `{"x":` + strings.Repeat(`{"a":`, 1<<18),
		"deep in pubs":      `{"id":2,"subscribe":{"publications":[{"data":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}]}}`,
		"huge string":       pub + strings.Repeat("x", 1<<22),
		"huge escapes":      pub + strings.Repeat(`\u00e9`, 1<<18),
		"invalid utf-8":     pub + "imc1 \xff\xfe" + `"}}}}`,
		"bad escape":        pub + `\x41"}}}}`,
		"control character": pub + "\x01" + `"}}}}`,
		"huge number":       `{"id":` + strings.Repeat("9", 1<<16) + `}`,
		"negative id":       `{"id":-1}`,
		"float offset":      `{"push":{"pub":{"offset":1e3}}}`,
		"nan":               `{"id":NaN}`,
		"truncated":         pub + "imc1",
		"trailing garbage":  `{"id":1}x`,
		"not an object":     `[1,2,3]`,
		"null message":      `null`,
		"many messages":     strings.Repeat("{}\n", 1<<18) + "{",
	} {
		t.Run(name, func(t *testing.T) {
			b := []byte(frame)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			var err error
			var m msg
			p := parser{jsonscan.Scanner{B: b}}
			for err == nil && p.More() {
				err = p.message(&m)
			}
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil || err.Error() == "" {
				t.Errorf("parsing %.60q… = %v, want an error", frame, err)
			}
			// An error is a few small allocations; nothing grows with
			// the frame.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
				t.Errorf("parsing %.60q… allocated %d bytes", frame, alloc)
			}
			if took > 5*time.Second {
				t.Errorf("parsing %.60q… took %v", frame, took)
			}
		})
	}
}
