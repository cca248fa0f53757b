package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/report"
)

// storeSeeds are stored reports for a fuzz target's seeds: those of the
// previous release's data directory (testdata/datadir-a58460c, a run
// marker among them), whole and cut short as a crash mid-write would
// leave them (though writeAtomic means no crash should), and a few that
// are barely reports.
func storeSeeds(f *testing.F) [][]byte {
	paths, err := filepath.Glob(filepath.Join(previousRelease, runsDir, "*"))
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, path := range paths {
		if filepath.Ext(path) == ".html" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b, b[:len(b)/2])
	}
	if len(out) == 0 {
		f.Fatalf("no reports under %s", previousRelease)
	}
	return append(out, []byte(`{}`), []byte(`null`), []byte(`{"id":"x"} {"id":"y"}`))
}

// FuzzStoreRead opens a history whose one run report and canary.jsonl hold
// arbitrary bytes, as a disk error or another program might leave them.
// Nothing panics; the run is listed exactly when its report reads, and a
// report that does not read is an error naming the file, not "not found";
// CanaryRounds returns exactly the lines that decode, newest first.
func FuzzStoreRead(f *testing.F) {
	canary := []byte(`{"id":"c1","kind":"canary","target":"t","start":"2026-11-30T03:15:00Z","end":"2026-11-30T03:15:01Z","result":"pass","checks":[{"kind":"direct","pass":true,"expected":1,"delivered":1,"max_latency_ns":5}]}`)
	previous, err := os.ReadFile(filepath.Join(previousRelease, canaryFile))
	if err != nil {
		f.Fatal(err)
	}
	for i, s := range storeSeeds(f) {
		var c []byte
		switch i % 4 {
		case 0:
			c = append(bytes.Clone(canary), '\n')
		case 1:
			c = append(append(bytes.Clone(canary), "\n{\"id\":\"c2\"}\n\n"...), canary[:20]...)
		case 2:
			c = []byte("\n\n{\"checks\":[1]}\nnull\n[]\n")
		case 3:
			c = previous
		}
		f.Add(s, c)
	}
	const id = "20261130T031500Z-3f9a1c"
	f.Fuzz(func(t *testing.T, stored, canaryLog []byte) {
		dir := t.TempDir()
		runs := filepath.Join(dir, runsDir)
		if err := os.MkdirAll(runs, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(runs, id+".json")
		if err := os.WriteFile(path, stored, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, canaryFile), canaryLog, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, Options{Now: fixedNow(storeEpoch)})
		if err != nil {
			t.Fatalf("Open over a report %q = %v", stored, err)
		}
		_, readErr := report.ReadJSON(bytes.NewReader(stored))

		list, err := s.Runs(0)
		if err != nil {
			t.Fatalf("Runs(0) = %v", err)
		}
		if listed := len(list) == 1 && list[0].ID == id; listed != (readErr == nil) || len(list) > 1 {
			t.Fatalf("report %q (read error %v): Runs(0) = %+v", stored, readErr, list)
		}
		r, err := s.Soak(id)
		switch {
		case readErr == nil && (err != nil || r == nil):
			t.Fatalf("Soak(%q) of report %q = %+v, %v, want it", id, stored, r, err)
		case readErr != nil && (err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), path)):
			t.Fatalf("Soak(%q) of corrupt report %q = %v, want an error naming %s", id, stored, err, path)
		}

		var want []report.Round
		for l := range bytes.SplitSeq(canaryLog, []byte{'\n'}) {
			var c report.Round
			if len(l) > 0 && json.Unmarshal(l, &c) == nil {
				want = append([]report.Round{c}, want...)
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
