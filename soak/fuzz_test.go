package soak

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// reportSeeds adds the golden reports to a fuzz target's seeds, whole and
// cut short as a crash mid-write would leave them (though writeAtomic
// means no crash should).
func reportSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, name := range []string{"report.golden.json", "report-drill.golden.json"} {
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

// FuzzReadJSON reads arbitrary bytes as a stored report, as the history
// does for every runs/*.json: ReadJSON never panics and fails with its own
// message; a report it accepts can be summarised for the listing, and is
// written back by WriteJSON, as the API serves it, to JSON that reads
// back to the same report.
func FuzzReadJSON(f *testing.F) {
	for _, s := range reportSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ReadJSON(bytes.NewReader(b))
		if err != nil {
			if r != nil || !strings.HasPrefix(err.Error(), "soak: read json: ") {
				t.Fatalf("ReadJSON(%q) = %v, %v, want nil and an error of its own", b, r, err)
			}
			return
		}
		_ = summarize(r)
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

// FuzzStoreRead opens a history whose one run report and canary.jsonl hold
// arbitrary bytes, as a disk error or another program might leave them.
// Nothing panics; the run is listed exactly when its report reads, and a
// report that does not read is an error naming the file, not "not found";
// CanaryRounds returns exactly the lines that decode, newest first.
func FuzzStoreRead(f *testing.F) {
	canary := []byte(`{"id":"c1","kind":"canary","target":"t","start":"2026-11-30T03:15:00Z","end":"2026-11-30T03:15:01Z","result":"pass","checks":[{"kind":"direct","pass":true,"expected":1,"delivered":1,"max_latency_ns":5}]}`)
	for i, s := range reportSeeds(f) {
		var c []byte
		switch i % 3 {
		case 0:
			c = append(bytes.Clone(canary), '\n')
		case 1:
			c = append(append(bytes.Clone(canary), "\n{\"id\":\"c2\"}\n\n"...), canary[:20]...)
		case 2:
			c = []byte("\n\n{\"checks\":[1]}\nnull\n[]\n")
		}
		f.Add(s, c)
	}
	const id = "20261130T031500Z-3f9a1c"
	f.Fuzz(func(t *testing.T, report, canaryLog []byte) {
		dir := t.TempDir()
		runs := filepath.Join(dir, runsDir)
		if err := os.MkdirAll(runs, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(runs, id+".json")
		if err := os.WriteFile(path, report, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, canaryFile), canaryLog, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := OpenStore(dir, StoreOptions{Now: fixedNow(storeEpoch)})
		if err != nil {
			t.Fatalf("OpenStore over a report %q = %v", report, err)
		}
		_, readErr := ReadJSON(bytes.NewReader(report))

		list, err := s.Runs(0)
		if err != nil {
			t.Fatalf("Runs(0) = %v", err)
		}
		if listed := len(list) == 1 && list[0].ID == id; listed != (readErr == nil) || len(list) > 1 {
			t.Fatalf("report %q (read error %v): Runs(0) = %+v", report, readErr, list)
		}
		r, err := s.Soak(id)
		switch {
		case readErr == nil && (err != nil || r == nil):
			t.Fatalf("Soak(%q) of report %q = %+v, %v, want it", id, report, r, err)
		case readErr != nil && (err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), path)):
			t.Fatalf("Soak(%q) of corrupt report %q = %v, want an error naming %s", id, report, err, path)
		}

		var want []Canary
		for l := range bytes.SplitSeq(canaryLog, []byte{'\n'}) {
			var c Canary
			if len(l) > 0 && json.Unmarshal(l, &c) == nil {
				want = append([]Canary{c}, want...)
			}
		}
		got, err := s.CanaryRounds(0)
		if err != nil || len(got) != len(want) {
			t.Fatalf("CanaryRounds(0) of %q = %d rounds, %v, want %d", canaryLog, len(got), err, len(want))
		}
		for i := range got {
			g, _ := json.Marshal(got[i])
			w, _ := json.Marshal(want[i])
			if !bytes.Equal(g, w) {
				t.Fatalf("CanaryRounds(0) of %q: round %d = %s, want %s", canaryLog, i, g, w)
			}
		}
		if one, err := s.CanaryRounds(1); err != nil || len(one) != min(1, len(want)) {
			t.Fatalf("CanaryRounds(1) of %q = %d rounds, %v", canaryLog, len(one), err)
		}
	})
}
