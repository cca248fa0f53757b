package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// reportSeeds adds the golden reports to a fuzz target's seeds, whole and
// cut short as a crash mid-write would leave them (though the history
// writes atomically, so no crash should).
func reportSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, name := range []string{"report.golden.json", "report-drill.golden.json", "report-compare.golden.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b, b[:len(b)/2])
	}
	out = append(out,
		[]byte(`{}`),
		[]byte(`null`),
		[]byte(`{"start":"0000-01-01T00:00:00+23:59","end":"9999-12-31T23:59:59-23:59"}`),
		[]byte(`{"deliveries":{"all":{"loss_ratio":1e308}},"latency":{"delivery_direct":{"p99_ns":-9223372036854775808}}}`),
		[]byte(`{"drill":{},"saturation":{},"samples":[{},{}],"profile":{"rate":-1}}`),
		[]byte(`{"id":"x"} {"id":"y"}`),
		[]byte(`{"id":"`+strings.Repeat("[", 1000)+`"}`),
		[]byte(`{"samples":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`),
		[]byte("{\"target\":\"\xff\"}"),
	)
	return out
}

// FuzzReadJSON reads arbitrary bytes as a stored report, as the run
// history does for every runs/*.json: ReadJSON never panics and fails
// with its own message; a report it accepts can be summarised for the
// listing, and is written back by WriteJSON, as the API serves it, to
// JSON that reads back to the same report.
func FuzzReadJSON(f *testing.F) {
	for _, s := range reportSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ReadJSON(bytes.NewReader(b))
		if err != nil {
			if r != nil || !strings.HasPrefix(err.Error(), "report: read json: ") {
				t.Fatalf("ReadJSON(%q) = %v, %v, want nil and an error of its own", b, r, err)
			}
			return
		}
		_ = r.Summary()
		var once bytes.Buffer
		if err := WriteJSON(&once, r); err != nil {
			t.Fatalf("ReadJSON(%q) accepted a report that WriteJSON refuses: %v", b, err)
		}
		r2, err := ReadJSON(bytes.NewReader(once.Bytes()))
		if err != nil {
			t.Fatalf("ReadJSON(WriteJSON(ReadJSON(%q))) = %v", b, err)
		}
		var twice bytes.Buffer
		if err := WriteJSON(&twice, r2); err != nil || !bytes.Equal(once.Bytes(), twice.Bytes()) {
			t.Fatalf("report %q does not survive a round trip: %s, then %s (%v)", b, once.Bytes(), twice.Bytes(), err)
		}
	})
}
