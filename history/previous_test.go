package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

// previousRelease is a data directory as imcanary a58460c, the last
// version that wrote report pages, left it. That version's own Store made
// it, not a copy of its code: it saved three soak runs (the golden
// reports of package report, one renamed, and a small passing run) with
// their runs/<id>.html pages, three canary rounds, a run killed mid-way
// that its next start recorded as aborted, the marker of a run still in
// progress when it stopped, and a page whose JSON a crash kept from being
// renamed into place.
var previousRelease = filepath.Join("testdata", "datadir-a58460c")

// TestPreviousReleaseDataDir opens what the previous release wrote: every
// run is listed and read, and renders to the very page that release
// stored beside it, which is what the daemon now serves from the JSON;
// the rounds read back as written; the run in progress is recorded as
// aborted, without a page; and pruning deletes the old pages with their
// runs and the stray one, so that the directory stays bounded.
func TestPreviousReleaseDataDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(previousRelease)); err != nil {
		t.Fatal(err)
	}
	// As found on a restart an hour after the last write: nothing in it
	// is being written.
	found := time.Date(2026, 3, 15, 10, 0, 0, 0, time.UTC)
	old := found.Add(-time.Hour)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chtimes(path, old, old)
	})
	if err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(dir, runsDir)
	s := openStore(t, dir, Options{Now: fixedNow(found)})

	const (
		steady  = "20260314T090000Z-4f2a9c"
		drill   = "20260314T090000Z-d7e1b0"
		passed  = "20260315T070000Z-c3c3c3"
		killed  = "20260315T080000Z-a1a1a1"
		running = "20260315T090000Z-b2b2b2"
		stray   = "20260313T000000Z-f0f0f0"
	)
	list, err := s.Runs(0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range list {
		got = append(got, r.ID+" "+r.Result)
	}
	want := []string{running + " aborted", killed + " aborted", passed + " pass", drill + " inconclusive", steady + " fail"}
	if !slices.Equal(got, want) {
		t.Errorf("Runs(0) = %q, want %q", got, want)
	}

	for _, id := range []string{steady, drill, passed, killed} {
		r, err := s.Soak(id)
		if err != nil {
			t.Errorf("Soak(%q) = %v", id, err)
			continue
		}
		stored, err := os.ReadFile(filepath.Join(previousRelease, runsDir, id+".html"))
		if err != nil {
			t.Fatal(err)
		}
		var page bytes.Buffer
		if err := report.WriteHTML(&page, r); err != nil {
			t.Fatalf("WriteHTML(Soak(%q)) = %v", id, err)
		}
		if stored = []byte(strings.NewReplacer(report.PageChanges...).Replace(string(stored))); !bytes.Equal(page.Bytes(), stored) {
			t.Errorf("WriteHTML(Soak(%q)) = %d bytes, want the %d bytes of the page the previous release stored, with report.PageChanges made", id, page.Len(), len(stored))
		}
	}
	r, err := s.Soak(running)
	if err != nil {
		t.Fatalf("Soak(%q) = %v", running, err)
	}
	if r.Result != "aborted" || !r.End.Equal(found) || r.Profile.Name != "nightly" || len(r.Notes) == 0 ||
		!strings.Contains(r.Notes[len(r.Notes)-1], "stopped during this run") {
		t.Errorf("run in progress at the previous release's end = result %q, end %v, profile %q, notes %q; want aborted at %v with a note",
			r.Result, r.End, r.Profile.Name, r.Notes, found)
	}

	lines, err := os.ReadFile(filepath.Join(previousRelease, canaryFile))
	if err != nil {
		t.Fatal(err)
	}
	var wantRounds []string
	for l := range bytes.Lines(lines) {
		wantRounds = append([]string{string(bytes.TrimSuffix(l, []byte{'\n'}))}, wantRounds...)
	}
	rounds, err := s.CanaryRounds(0)
	if err != nil {
		t.Fatal(err)
	}
	var gotRounds []string
	for _, c := range rounds {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		gotRounds = append(gotRounds, string(b))
	}
	if len(wantRounds) != 3 || !slices.Equal(gotRounds, wantRounds) {
		t.Errorf("CanaryRounds(0) = %q, want the previous release's lines, newest first: %q", gotRounds, wantRounds)
	}

	// The marker is gone, the recorded run has no page, and the stray
	// page is pruned; the old pages stay beside their runs.
	wantFiles := []string{
		drill + ".html", drill + ".json", steady + ".html", steady + ".json",
		passed + ".html", passed + ".json", killed + ".html", killed + ".json", running + ".json",
	}
	slices.Sort(wantFiles)
	if got := dirNames(t, runs); !slices.Equal(got, wantFiles) {
		t.Errorf("runs/ after opening holds %v, want %v", got, wantFiles)
	}
	if _, err := os.Stat(filepath.Join(runs, stray+".html")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stray page %s.html: %v, want it pruned", stray, err)
	}

	// Tighter bounds prune the old runs, their pages with them.
	s = openStore(t, dir, Options{MaxRuns: 2, Now: fixedNow(found)})
	if got := runIDs(t, s, 0); !slices.Equal(got, []string{running, killed}) {
		t.Errorf("Runs(0) with MaxRuns 2 = %v, want [%s %s]", got, running, killed)
	}
	if got, want := dirNames(t, runs), []string{killed + ".html", killed + ".json", running + ".json"}; !slices.Equal(got, want) {
		t.Errorf("runs/ with MaxRuns 2 holds %v, want %v", got, want)
	}
}
