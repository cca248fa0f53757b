package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

// storeEpoch is the fixed "now" of the store tests.
var storeEpoch = time.Date(2026, 11, 30, 3, 15, 0, 0, time.UTC)

func fixedNow(t time.Time) func() time.Time { return func() time.Time { return t } }

// storeReport is a small but complete report that starts at start.
func storeReport(id string, start time.Time) *report.Soak {
	return &report.Soak{
		ID:      id,
		Kind:    "soak",
		Target:  "staging",
		Profile: report.Profile{Name: "smoke", Users: 10, Duration: time.Minute},
		Result:  "pass",
		Start:   start,
		End:     start.Add(2 * time.Minute),
		Deliveries: map[string]report.Deliveries{
			"all": {Expected: 1000, Delivered: 999, Lost: 1, LossRatio: 0.001},
		},
		Latency: map[string]report.Percentiles{
			"delivery_direct": {Count: 500, P99: 80 * time.Millisecond},
			"delivery_group":  {Count: 500, P99: 120 * time.Millisecond},
		},
	}
}

func storeCanary(id string, start time.Time) *report.Round {
	return &report.Round{
		ID: id, Kind: "canary", Target: "staging", Start: start, End: start.Add(time.Second), Result: "pass",
		Checks: []report.Check{{Kind: "direct", Pass: true, Expected: 1, Delivered: 1, MaxLatency: 40 * time.Millisecond}},
	}
}

func openStore(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%q) = %v", dir, err)
	}
	return s
}

func runIDs(t *testing.T, s *Store, limit int) []string {
	t.Helper()
	runs, err := s.Runs(limit)
	if err != nil {
		t.Fatalf("Runs(%d) = %v", limit, err)
	}
	ids := []string{}
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	return ids
}

func canaryIDs(t *testing.T, s *Store, limit int) []string {
	t.Helper()
	rounds, err := s.CanaryRounds(limit)
	if err != nil {
		t.Fatalf("CanaryRounds(%d) = %v", limit, err)
	}
	ids := []string{}
	for _, c := range rounds {
		ids = append(ids, c.ID)
	}
	return ids
}

// dirNames lists dir, for checking what pruning left on disk.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// TestRunIDsAreValid: every id NewRunID makes can name a run in the
// history.
func TestRunIDsAreValid(t *testing.T) {
	for _, at := range []time.Time{storeEpoch, {}, time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("UTC-12", -12*3600))} {
		if id := report.NewRunID(at); !validID(id) {
			t.Errorf("validID(NewRunID(%v)) = false for %q", at, id)
		}
	}
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{Now: fixedNow(storeEpoch)})
	// Saved out of order: the listing is by start time.
	starts := map[string]time.Duration{"b": -2 * time.Hour, "c": -time.Hour, "a": -3 * time.Hour}
	for _, id := range []string{"b", "c", "a"} {
		if err := s.SaveSoak(storeReport(id, storeEpoch.Add(starts[id]))); err != nil {
			t.Fatalf("SaveSoak(%q) = %v", id, err)
		}
	}
	for i := range 3 {
		if err := s.SaveCanary(storeCanary(fmt.Sprint("round", i), storeEpoch.Add(time.Duration(i)*time.Minute))); err != nil {
			t.Fatalf("SaveCanary = %v", err)
		}
	}

	check := func(t *testing.T, s *Store) {
		tests := []struct {
			limit      int
			wantRuns   []string
			wantRounds []string
		}{
			{0, []string{"c", "b", "a"}, []string{"round2", "round1", "round0"}},
			{2, []string{"c", "b"}, []string{"round2", "round1"}},
			{10, []string{"c", "b", "a"}, []string{"round2", "round1", "round0"}},
		}
		for _, tt := range tests {
			if got := runIDs(t, s, tt.limit); !slices.Equal(got, tt.wantRuns) {
				t.Errorf("Runs(%d) = %v, want %v", tt.limit, got, tt.wantRuns)
			}
			if got := canaryIDs(t, s, tt.limit); !slices.Equal(got, tt.wantRounds) {
				t.Errorf("CanaryRounds(%d) = %v, want %v", tt.limit, got, tt.wantRounds)
			}
		}
		runs, _ := s.Runs(1)
		want := report.RunSummary{
			ID: "c", Kind: "soak", Target: "staging", Profile: "smoke", Result: "pass",
			Start: storeEpoch.Add(-time.Hour), End: storeEpoch.Add(-time.Hour + 2*time.Minute),
			LossRatio: 0.001, P99Delivery: 120 * time.Millisecond,
		}
		if len(runs) != 1 || runs[0] != want {
			t.Errorf("Runs(1) = %+v, want [%+v]", runs, want)
		}
		for id, off := range starts {
			r, err := s.Soak(id)
			if err != nil {
				t.Fatalf("Soak(%q) = %v", id, err)
			}
			if w := storeReport(id, storeEpoch.Add(off)); r.ID != id || !r.Start.Equal(w.Start) || r.Deliveries["all"] != w.Deliveries["all"] {
				t.Errorf("Soak(%q) = %+v, want %+v", id, r, w)
			}
		}
		// A report, not a page: the daemon renders the page.
		if got := dirNames(t, filepath.Join(dir, runsDir)); !slices.Equal(got, []string{"a.json", "b.json", "c.json"}) {
			t.Errorf("runs/ holds %v, want the three reports only", got)
		}
	}
	t.Run("saved", func(t *testing.T) { check(t, s) })
	// A restart: a new Store over the same directory sees the same history.
	t.Run("reopened", func(t *testing.T) { check(t, openStore(t, dir, Options{Now: fixedNow(storeEpoch)})) })

	// Saving a run again replaces it.
	r := storeReport("a", storeEpoch.Add(-3*time.Hour))
	r.Result = "fail"
	if err := s.SaveSoak(r); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Runs(0); len(got) != 3 || got[2].Result != "fail" {
		t.Errorf("Runs after saving %q again = %+v, want 3 runs with %q failed", "a", got, "a")
	}
}

// TestStoreSeesOtherWriters checks that a run saved by another Store on
// the same directory (a one-off soak run next to the daemon) is listed,
// and one deleted is forgotten.
func TestStoreSeesOtherWriters(t *testing.T) {
	dir := t.TempDir()
	o := Options{Now: fixedNow(storeEpoch)}
	a, b := openStore(t, dir, o), openStore(t, dir, o)
	if err := b.SaveSoak(storeReport("x", storeEpoch)); err != nil {
		t.Fatal(err)
	}
	if got := runIDs(t, a, 0); !slices.Equal(got, []string{"x"}) {
		t.Errorf("Runs() = %v, want [x]", got)
	}
	if err := os.Remove(filepath.Join(dir, runsDir, "x.json")); err != nil {
		t.Fatal(err)
	}
	if got := runIDs(t, a, 0); len(got) != 0 {
		t.Errorf("Runs() after deleting x.json = %v, want none", got)
	}
}

func TestStoreBounds(t *testing.T) {
	h := time.Hour
	tests := []struct {
		name string
		save Options // while saving
		open Options // on reopening
		// starts of runs "r0", "r1", … relative to storeEpoch, saved in order
		starts []time.Duration
		want   []string // after saving
		reopen []string // after reopening
	}{
		{
			name:   "count",
			save:   Options{MaxRuns: 3},
			starts: []time.Duration{-5 * h, -4 * h, -3 * h, -2 * h, -h},
			want:   []string{"r4", "r3", "r2"},
			reopen: []string{"r4", "r3", "r2"},
		},
		{
			name:   "count keeps the newest whatever the saving order",
			save:   Options{MaxRuns: 2},
			starts: []time.Duration{-h, -5 * h, -2 * h, -4 * h},
			want:   []string{"r0", "r2"},
			reopen: []string{"r0", "r2"},
		},
		{
			name:   "age",
			save:   Options{MaxAge: 2 * h},
			starts: []time.Duration{-5 * h, -3 * h, -h, -10 * time.Minute},
			want:   []string{"r3", "r2"},
			reopen: []string{"r3", "r2"},
		},
		{
			name:   "count and age",
			save:   Options{MaxRuns: 2, MaxAge: 90 * time.Minute},
			starts: []time.Duration{-3 * h, -80 * time.Minute, -h, -30 * time.Minute},
			want:   []string{"r3", "r2"},
			reopen: []string{"r3", "r2"},
		},
		{
			name:   "tighter bounds apply on open",
			save:   Options{},
			open:   Options{MaxRuns: 3, MaxAge: 150 * time.Minute},
			starts: []time.Duration{-5 * h, -4 * h, -2 * h, -h, -10 * time.Minute, -5 * time.Minute},
			want:   []string{"r5", "r4", "r3", "r2", "r1", "r0"},
			reopen: []string{"r5", "r4", "r3"},
		},
		{
			name:   "age on open, as time passes",
			save:   Options{MaxAge: 3 * h},
			open:   Options{MaxAge: 3 * h, Now: fixedNow(storeEpoch.Add(90 * time.Minute))},
			starts: []time.Duration{-2 * h, -h},
			want:   []string{"r1", "r0"},
			reopen: []string{"r1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.save.Now == nil {
				tt.save.Now = fixedNow(storeEpoch)
			}
			s := openStore(t, dir, tt.save)
			for i, off := range tt.starts {
				if err := s.SaveSoak(storeReport(fmt.Sprint("r", i), storeEpoch.Add(off))); err != nil {
					t.Fatalf("SaveSoak(r%d) = %v", i, err)
				}
				// The page the previous release wrote beside each run it
				// kept: pruning deletes it with its run, so that a data
				// directory that release wrote stays bounded.
				base := filepath.Join(dir, runsDir, fmt.Sprint("r", i))
				if _, err := os.Stat(base + ".json"); err == nil {
					if err := os.WriteFile(base+".html", []byte("<!DOCTYPE html>"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := runIDs(t, s, 0); !slices.Equal(got, tt.want) {
				t.Errorf("Runs(0) = %v, want %v", got, tt.want)
			}
			if tt.open.Now == nil {
				tt.open.Now = fixedNow(storeEpoch)
			}
			if tt.open.MaxRuns == 0 && tt.open.MaxAge == 0 {
				tt.open = tt.save
			}
			s = openStore(t, dir, tt.open)
			if got := runIDs(t, s, 0); !slices.Equal(got, tt.reopen) {
				t.Errorf("Runs(0) after reopening = %v, want %v", got, tt.reopen)
			}
			// Pruned runs are gone from the disk, the old page and all.
			var files []string
			for _, id := range slices.Sorted(slices.Values(tt.reopen)) {
				files = append(files, id+".html", id+".json")
			}
			if got := dirNames(t, filepath.Join(dir, runsDir)); !slices.Equal(got, files) {
				t.Errorf("runs/ holds %v, want %v", got, files)
			}
		})
	}
}

// TestStoreCrashMidWrite leaves what a crash at each step of a save would:
// a half-written temp file, a page whose JSON was never renamed (by a
// version that wrote pages), a truncated canary line. The history stays
// readable and ignores them, and pruning removes the leftovers once they
// are a minute old.
func TestStoreCrashMidWrite(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, runsDir)
	s := openStore(t, dir, Options{Now: time.Now})
	if err := s.SaveSoak(storeReport("done", storeEpoch)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "c2"} {
		if err := s.SaveCanary(storeCanary(id, storeEpoch)); err != nil {
			t.Fatal(err)
		}
	}
	var full bytes.Buffer
	if err := report.WriteJSON(&full, storeReport("half", storeEpoch.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	line, _ := json.Marshal(storeCanary("torn", storeEpoch))
	leftovers := []struct {
		path string
		data []byte
	}{
		{filepath.Join(runs, ".tmp-half.json-123456"), full.Bytes()[:full.Len()/2]},
		{filepath.Join(runs, ".tmp-half.html-654321"), []byte("<!doctype html><ti")},
		{filepath.Join(runs, "orphan.html"), []byte("<!doctype html>")},
		{filepath.Join(dir, ".tmp-canary.jsonl-42"), []byte(`{"id":"c1"}` + "\n")},
	}
	for _, l := range leftovers {
		if err := os.WriteFile(l.path, l.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, canaryFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(line[:len(line)/2])
	f.Close()

	// The restart after the crash.
	s = openStore(t, dir, Options{Now: time.Now})
	if got := runIDs(t, s, 0); !slices.Equal(got, []string{"done"}) {
		t.Errorf("Runs(0) = %v, want [done]", got)
	}
	for _, id := range []string{"half", "orphan"} {
		if _, err := s.Soak(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Soak(%q) = %v, want ErrNotFound", id, err)
		}
	}
	if got := canaryIDs(t, s, 0); !slices.Equal(got, []string{"c2", "c1"}) {
		t.Errorf("CanaryRounds(0) = %v, want [c2 c1]", got)
	}
	// The next round is not glued onto the torn line.
	if err := s.SaveCanary(storeCanary("c3", storeEpoch)); err != nil {
		t.Fatal(err)
	}
	if got := canaryIDs(t, s, 0); !slices.Equal(got, []string{"c3", "c2", "c1"}) {
		t.Errorf("CanaryRounds(0) after a new round = %v, want [c3 c2 c1]", got)
	}
	// Fresh leftovers may belong to a writer in another process: kept.
	for _, l := range leftovers {
		if _, err := os.Stat(l.path); err != nil {
			t.Errorf("fresh leftover %s: %v, want it kept", l.path, err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	for _, l := range leftovers {
		if err := os.Chtimes(l.path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	s = openStore(t, dir, Options{Now: time.Now})
	for _, l := range leftovers {
		if _, err := os.Stat(l.path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s a minute old: %v, want it deleted", l.path, err)
		}
	}
	if got := runIDs(t, s, 0); !slices.Equal(got, []string{"done"}) {
		t.Errorf("Runs(0) after pruning = %v, want [done]", got)
	}
}

// TestStoreDamagedReport checks that a report that cannot be read is left
// out of the listing, and that Soak says which file is damaged.
func TestStoreDamagedReport(t *testing.T) {
	var full bytes.Buffer
	if err := report.WriteJSON(&full, storeReport("x", storeEpoch)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"truncated", full.Bytes()[:full.Len()/2]},
		{"empty", nil},
		{"not json", []byte("<html>")},
		{"trailing data", append(bytes.Clone(full.Bytes()), "{}"...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, Options{Now: fixedNow(storeEpoch)})
			if err := s.SaveSoak(storeReport("good", storeEpoch)); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, runsDir, "x.json")
			if err := os.WriteFile(path, tt.data, 0o644); err != nil {
				t.Fatal(err)
			}
			// Both a store that finds it on open and one that finds it
			// later skip it.
			for _, s := range []*Store{s, openStore(t, dir, Options{Now: fixedNow(storeEpoch)})} {
				if got := runIDs(t, s, 0); !slices.Equal(got, []string{"good"}) {
					t.Errorf("Runs(0) = %v, want [good]", got)
				}
				_, err := s.Soak("x")
				if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), path) {
					t.Errorf("Soak(%q) = %v, want an error naming %s", "x", err, path)
				}
			}
		})
	}
}

func TestStoreBadIDs(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{Now: fixedNow(storeEpoch)})
	// Files a path trick might reach.
	var outside bytes.Buffer
	report.WriteJSON(&outside, storeReport("x", storeEpoch))
	os.WriteFile(filepath.Join(dir, "x.json"), outside.Bytes(), 0o644)
	os.WriteFile(filepath.Join(dir, "x.html"), []byte("secret"), 0o644)
	if err := s.SaveSoak(storeReport("a", storeEpoch)); err != nil {
		t.Fatal(err)
	}
	ids := []string{
		"", "../x", "..", ".", "a/b", "runs/../a", "/etc/passwd", `..\x`, "a.json", "a.html",
		"%2e%2e%2fx", "a\x00", "a b", "á", strings.Repeat("a", maxIDLen+1),
		"missing",
	}
	for _, id := range ids {
		if r, err := s.Soak(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Soak(%q) = %v, %v, want ErrNotFound", id, r, err)
		}
		if id != "missing" {
			if err := s.SaveSoak(storeReport(id, storeEpoch)); err == nil {
				t.Errorf("SaveSoak(id %q) = nil, want an error", id)
			}
		}
	}
	if got := dirNames(t, filepath.Join(dir, runsDir)); !slices.Equal(got, []string{"a.json"}) {
		t.Errorf("runs/ holds %v, want only run a", got)
	}
}

func TestStoreCanaryRotation(t *testing.T) {
	tests := []struct {
		max, saves int
		want       int // rounds kept
	}{
		{max: 10, saves: 10, want: 10},
		{max: 10, saves: 11, want: 5},
		{max: 10, saves: 16, want: 10},
		{max: 10, saves: 17, want: 5},
		{max: 10, saves: 100, want: 10},
		{max: 1, saves: 5, want: 1},
		{max: 3, saves: 4, want: 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("max %d saves %d", tt.max, tt.saves), func(t *testing.T) {
			dir := t.TempDir()
			o := Options{MaxCanaryRounds: tt.max, Now: fixedNow(storeEpoch)}
			s := openStore(t, dir, o)
			for i := range tt.saves {
				// Reopen halfway: the line count survives a restart.
				if i == tt.saves/2 {
					s = openStore(t, dir, o)
				}
				if err := s.SaveCanary(storeCanary(fmt.Sprint(i), storeEpoch)); err != nil {
					t.Fatal(err)
				}
				if n := fileLines(t, filepath.Join(dir, canaryFile)); n > tt.max {
					t.Fatalf("after %d rounds canary.jsonl has %d lines, want at most %d", i+1, n, tt.max)
				}
			}
			var want []string
			for i := tt.saves - 1; i >= tt.saves-tt.want; i-- {
				want = append(want, fmt.Sprint(i))
			}
			if got := canaryIDs(t, s, 0); !slices.Equal(got, want) {
				t.Errorf("CanaryRounds(0) = %v, want %v", got, want)
			}
			if got := dirNames(t, dir); !slices.Equal(got, []string{canaryFile, runsDir}) {
				t.Errorf("data directory holds %v, want only %s and %s", got, canaryFile, runsDir)
			}
		})
	}
}

// TestStoreCanaryRotationDropsDamage checks that rotation keeps valid rounds
// only, and their lines byte for byte, fields unknown to this version too.
func TestStoreCanaryRotationDropsDamage(t *testing.T) {
	dir := t.TempDir()
	lines := `{"id":"0"}` + "\n" + `{"id":"1"` + "\n" + `{"id":"2","future_field":[1,2]}` + "\n" + "garbage\n"
	path := filepath.Join(dir, canaryFile)
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, dir, Options{MaxCanaryRounds: 8, Now: fixedNow(storeEpoch)})
	for i := 3; i < 8; i++ {
		if err := s.SaveCanary(&report.Round{ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// 4 + 5 = 9 lines > 8: rotated to the newest 4 valid rounds.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte{'\n'}); n != 4 {
		t.Errorf("canary.jsonl after rotation has %d lines, want 4:\n%s", n, b)
	}
	if got := canaryIDs(t, s, 0); !slices.Equal(got, []string{"7", "6", "5", "4"}) {
		t.Errorf("CanaryRounds(0) = %v, want [7 6 5 4]", got)
	}

	os.WriteFile(path, []byte(lines), 0o644)
	s = openStore(t, dir, Options{MaxCanaryRounds: 4, Now: fixedNow(storeEpoch)})
	if err := s.SaveCanary(&report.Round{ID: "3"}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if want := `{"id":"2","future_field":[1,2]}` + "\n" + `{"id":"3","kind":""`; !strings.HasPrefix(string(b), want) {
		t.Errorf("canary.jsonl after rotation = %q, want it to start %q", b, want)
	}
	os.WriteFile(path, []byte(lines), 0o644)
	s = openStore(t, dir, Options{MaxCanaryRounds: 5, Now: fixedNow(storeEpoch)})
	s.SaveCanary(&report.Round{ID: "3"}) // 5 lines: not yet
	s.SaveCanary(&report.Round{ID: "4"}) // 6: keep the newest 2
	b, _ = os.ReadFile(path)
	if !strings.HasPrefix(string(b), `{"id":"3"`) {
		t.Errorf("canary.jsonl after rotation = %q, want rounds 3 and 4", b)
	}
}

func fileLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte{'\n'})
}

// TestStoreCanaryLongLines reads rounds that span several chunks of the
// backward reader.
func TestStoreCanaryLongLines(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{Now: fixedNow(storeEpoch)})
	var want []string
	for i, size := range []int{10, tailChunk - 40, 3 * tailChunk, 5, tailChunk, 1} {
		c := storeCanary(fmt.Sprint(i), storeEpoch)
		c.Target = strings.Repeat("t", size)
		if err := s.SaveCanary(c); err != nil {
			t.Fatal(err)
		}
		want = append([]string{c.ID}, want...)
	}
	for _, limit := range []int{0, 1, 3, 6, 7} {
		w := want
		if limit > 0 && limit < len(w) {
			w = w[:limit]
		}
		if got := canaryIDs(t, s, limit); !slices.Equal(got, w) {
			t.Errorf("CanaryRounds(%d) = %v, want %v", limit, got, w)
		}
	}
}

// TestEachLineBackward compares the backward reader with a forward split
// for every chunk size, torn last lines and empty lines included.
func TestEachLineBackward(t *testing.T) {
	inputs := []string{
		"", "\n", "a", "a\n", "a\nb", "a\nb\n", "\n\na\n\nbb\n\n", "abc\ndefgh\nij\nk\n",
		"long line here\nx\ntorn li",
	}
	for _, in := range inputs {
		var want []string
		for l := range strings.SplitSeq(in, "\n") {
			if l != "" {
				want = append([]string{l}, want...)
			}
		}
		path := filepath.Join(t.TempDir(), "f")
		os.WriteFile(path, []byte(in), 0o644)
		for chunk := int64(1); chunk <= int64(len(in))+1; chunk++ {
			for limit := 0; limit <= len(want)+1; limit++ {
				got := []string{}
				err := eachLineBackward(path, chunk, limit, func(l []byte) bool {
					got = append(got, string(l))
					return true
				})
				w := want
				if limit > 0 && limit < len(w) {
					w = w[:limit]
				}
				if err != nil || !slices.Equal(got, w) {
					t.Errorf("eachLineBackward(%q, chunk %d, limit %d) = %q, %v, want %q", in, chunk, limit, got, err, w)
				}
			}
		}
	}
}

func FuzzEachLineBackward(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc"), int64(2))
	f.Add([]byte("{\"id\":\"1\"}\n{\"id\""), int64(5))
	f.Fuzz(func(t *testing.T, in []byte, chunk int64) {
		if chunk <= 0 || chunk > 1<<20 {
			return
		}
		var want [][]byte
		for _, l := range bytes.Split(in, []byte{'\n'}) {
			if len(l) > 0 {
				want = append([][]byte{l}, want...)
			}
		}
		path := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(path, in, 0o644); err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		if err := eachLineBackward(path, chunk, 0, func(l []byte) bool {
			got = append(got, bytes.Clone(l))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("eachLineBackward(%q, chunk %d) = %q, want %q", in, chunk, got, want)
		}
	})
}

// TestStoreConcurrent runs writers and readers together under -race.
func TestStoreConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{MaxRuns: 5, MaxCanaryRounds: 20, Now: fixedNow(storeEpoch)})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 10 {
				id := fmt.Sprintf("w%d-%d", w, i)
				if err := s.SaveSoak(storeReport(id, storeEpoch.Add(time.Duration(i)*time.Second))); err != nil {
					t.Errorf("SaveSoak(%q) = %v", id, err)
				}
				if err := s.SaveCanary(storeCanary(id, storeEpoch)); err != nil {
					t.Errorf("SaveCanary(%q) = %v", id, err)
				}
			}
		})
		wg.Go(func() {
			for range 20 {
				runs, err := s.Runs(0)
				if err != nil || len(runs) > 5 {
					t.Errorf("Runs(0) = %d runs, %v, want at most 5", len(runs), err)
				}
				for _, r := range runs {
					// Pruning may delete it meanwhile, but never half.
					if _, err := s.Soak(r.ID); err != nil && !errors.Is(err, ErrNotFound) {
						t.Errorf("Soak(%q) = %v", r.ID, err)
					}
				}
				// One over the bound between an append and the rotation
				// it triggers.
				if rounds, err := s.CanaryRounds(0); err != nil || len(rounds) > 21 {
					t.Errorf("CanaryRounds(0) = %d rounds, %v, want at most 21", len(rounds), err)
				}
			}
		})
	}
	wg.Wait()
	if got := runIDs(t, s, 0); len(got) != 5 {
		t.Errorf("Runs(0) = %v, want 5 runs", got)
	}
	if n := fileLines(t, filepath.Join(dir, canaryFile)); n > 20 || n < 10 {
		t.Errorf("canary.jsonl has %d lines, want 10 to 20", n)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	tests := []struct {
		dir  string
		want string
	}{
		{"", "no data directory"},
		{file, file},
		{filepath.Join(file, "sub"), file},
	}
	for _, tt := range tests {
		if _, err := Open(tt.dir, Options{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Open(%q) = %v, want an error naming %q", tt.dir, err, tt.want)
		}
	}
}

// A run whose process died between BeginSoak and SaveSoak is recorded as
// aborted by the next Open, with a note saying so; a run that was
// saved leaves no marker behind; a marker whose run was saved anyway (a
// crash between the two) is dropped without touching the run.
func TestStoreRecoversAbortedRun(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	found := start.Add(time.Hour)
	s := openStore(t, dir, Options{Now: fixedNow(start)})

	began := &report.Soak{ID: "20261130T100000Z-aaaaaa", Kind: "soak", Target: "staging", Start: start, Profile: report.Profile{Name: "peak", Users: 500}}
	if err := s.BeginSoak(began); err != nil {
		t.Fatal(err)
	}
	finished := storeReport("20261130T100500Z-bbbbbb", start.Add(5*time.Minute))
	if err := s.BeginSoak(finished); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveSoak(finished); err != nil {
		t.Fatal(err)
	}
	// Saved, then its marker written again: as if the process died after
	// SaveSoak's rename and before the marker's removal.
	crashed := storeReport("20261130T101000Z-cccccc", start.Add(10*time.Minute))
	if err := s.SaveSoak(crashed); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginSoak(&report.Soak{ID: crashed.ID, Start: crashed.Start}); err != nil {
		t.Fatal(err)
	}
	// Only in-progress runs have markers; listing them is not the store's
	// business until the process is gone.
	if ids := runIDs(t, s, 10); len(ids) != 2 {
		t.Fatalf("runs before the restart = %v, want the two saved", ids)
	}

	// The process dies; the next one opens the store.
	s = openStore(t, dir, Options{Now: fixedNow(found)})
	if ids := runIDs(t, s, 10); len(ids) != 3 {
		t.Fatalf("runs after the restart = %v, want 3", ids)
	}
	r, err := s.Soak(began.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Result != "aborted" || !r.End.Equal(found) || r.Profile.Name != "peak" || len(r.Notes) == 0 ||
		!strings.Contains(r.Notes[len(r.Notes)-1], "stopped during this run") {
		t.Errorf("recovered run = result %q, end %v, profile %q, notes %q; want aborted at %v with a note", r.Result, r.End, r.Profile.Name, r.Notes, found)
	}
	var page bytes.Buffer
	if err := report.WriteHTML(&page, r); err != nil || !strings.Contains(page.String(), "stopped before its end") {
		t.Errorf("recovered run's page: %v, want the aborted banner", err)
	}
	for _, id := range []string{finished.ID, crashed.ID} {
		r, err := s.Soak(id)
		if err != nil || r.Result != "pass" {
			t.Errorf("run %s = %v, %v; want it as saved", id, r, err)
		}
	}
	for _, name := range dirNames(t, filepath.Join(dir, runsDir)) {
		if strings.HasSuffix(name, runningSuffix) {
			t.Errorf("marker %s left behind", name)
		}
	}
}
