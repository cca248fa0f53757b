package history

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

func storeSearch(id, profile string, start time.Time, knee float64) *report.Search {
	return &report.Search{ID: id, Kind: "search", Target: "refserver", Profile: profile, Vary: "rate",
		Start: 10, Max: 400, Factor: 2, Precision: 0.05, Result: report.SearchFound, Knee: knee, FirstFail: knee * 1.05,
		StartTime: start, EndTime: start.Add(time.Minute),
		Steps: []report.SearchStep{{Value: knee, Result: "pass"}, {Value: knee * 1.05, Result: "fail"}}}
}

func TestSearchHistory(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := openStore(t, dir, Options{MaxRuns: 3, Now: fixedNow(t0.Add(24 * time.Hour))})

	first := storeSearch("20261201T000000Z-a", "find", t0, 80)
	if err := s.CompareSearch(first); err != nil {
		t.Fatal(err)
	}
	if c := first.Comparisons; len(c) != 2 || !strings.Contains(c[0].Missing, "no earlier search") || !strings.Contains(c[1].Missing, "no baseline") {
		t.Fatalf("first search's comparisons %+v: want both missing, saying why", c)
	}
	if err := s.SaveSearch(first); err != nil {
		t.Fatal(err)
	}
	// A search of another profile, and an aborted one of this profile,
	// come between: neither is the previous search.
	if err := s.SaveSearch(storeSearch("20261201T010000Z-b", "other", t0.Add(time.Hour), 10)); err != nil {
		t.Fatal(err)
	}
	aborted := storeSearch("20261201T020000Z-c", "find", t0.Add(2*time.Hour), 0)
	aborted.Result = report.SearchAborted
	if err := s.SaveSearch(aborted); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PinBaseline(aborted.ID); err == nil {
		t.Error("an aborted search was pinned")
	}
	sum, err := s.PinBaseline(first.ID)
	if err != nil || sum.Profile != "find" || sum.Kind != "search" {
		t.Fatalf("pin the first search: %+v, %v", sum, err)
	}

	second := storeSearch("20261201T030000Z-d", "find", t0.Add(3*time.Hour), 60)
	if err := s.CompareSearch(second); err != nil {
		t.Fatal(err)
	}
	for i, against := range []string{report.AgainstPrevious, report.AgainstBaseline} {
		c := second.Comparisons[i]
		if c.Against != against || c.ID != first.ID || c.Missing != "" {
			t.Fatalf("comparison %d: %+v, want the first search as the %s", i, c.Comparison, against)
		}
		if len(c.Deltas) == 0 || c.Deltas[0].Name != "knee" || c.Deltas[0].Was != 80 || c.Deltas[0].Now != 60 || !c.Deltas[0].Worse {
			t.Errorf("%s knee delta %+v: want 80 → 60, worse", against, c.Deltas)
		}
	}
	if err := s.SaveSearch(second); err != nil {
		t.Fatal(err)
	}
	got, err := s.Search(second.ID)
	if err != nil || got.Knee != 60 || len(got.Comparisons) != 2 {
		t.Fatalf("read back: %+v, %v", got, err)
	}

	// MaxRuns 3 and the pinned first search not counted: a fifth search
	// prunes the oldest unpinned one, the other profile's.
	if err := s.SaveSearch(storeSearch("20261201T040000Z-e", "find", t0.Add(4*time.Hour), 61)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{first.ID: true, "20261201T010000Z-b": false, aborted.ID: true, second.ID: true, "20261201T040000Z-e": true} {
		if _, err := s.Search(id); (err == nil) != want {
			t.Errorf("search %s kept %v, want %v (%v)", id, err == nil, want, err)
		}
	}

	if list, err := s.Searches(2); err != nil || len(list) != 2 || list[0].ID != "20261201T040000Z-e" || list[1].ID != second.ID || list[1].Knee != 60 {
		t.Errorf("Searches(2) = %+v, %v; want the two newest, newest first", list, err)
	}

	// A damaged file is skipped, not taken for the previous search.
	if err := os.WriteFile(filepath.Join(dir, searchesDir, "20261201T050000Z-f.json"), []byte("{\"kind\":\"search\""), 0o644); err != nil {
		t.Fatal(err)
	}
	third := storeSearch("20261201T060000Z-g", "find", t0.Add(6*time.Hour), 62)
	_ = s.CompareSearch(third)
	if c := third.Comparisons[0]; c.ID != "20261201T040000Z-e" {
		t.Errorf("previous of the third search: %q (%s), want 20261201T040000Z-e past the damaged file", c.ID, c.Missing)
	}
	if list, _ := s.Searches(0); len(list) != 4 {
		t.Errorf("Searches(0) lists %d, want the 4 readable ones, the damaged one skipped", len(list))
	}
	if _, err := s.Search("../x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Search(../x): %v, want ErrNotFound", err)
	}
	if err := s.SaveSearch(storeSearch("a/b", "find", t0, 1)); err == nil {
		t.Error("a search with id a/b was saved")
	}
	// A soak run is never read as a search, nor a search as a run.
	if _, err := s.Soak(first.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Soak(a search's id): %v, want ErrNotFound", err)
	}
}
