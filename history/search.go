package history

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/imcanary/imcanary/report"
)

// searchesDir holds the searches for the server's limit, one
// searches/<id>.json each, apart from runs/: a search is not a soak run
// (its steps are runs of the profile, and are not kept), and a search is
// compared only with earlier searches.
const searchesDir = "searches"

func (s *Store) searchesPath() string { return filepath.Join(s.dir, searchesDir) }

// SaveSearch records r as searches/<id>.json, replacing a search of the
// same id, then prunes the searches as runs are pruned: beyond MaxRuns or
// older than MaxAge, the oldest first, a pinned one kept.
func (s *Store) SaveSearch(r *report.Search) error {
	if !validID(r.ID) {
		return fmt.Errorf("save search: invalid id %q", r.ID)
	}
	if r.StartTime.IsZero() {
		return fmt.Errorf("save search %s: no start time", r.ID)
	}
	var js bytes.Buffer
	if err := report.WriteSearchJSON(&js, r); err != nil {
		return fmt.Errorf("save search %s: %w", r.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := s.searchesPath()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save search: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, r.ID+".json"), js.Bytes()); err != nil {
		return fmt.Errorf("save search: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("save search: %w", err)
	}
	if err := s.pruneSearches(); err != nil {
		return fmt.Errorf("search %s saved, but pruning the searches failed: %w", r.ID, err)
	}
	return nil
}

// Search returns the search id; ErrNotFound for an id that names none.
func (s *Store) Search(id string) (*report.Search, error) {
	return readReport(s.searchesPath(), id, report.ReadSearchJSON)
}

// Searches returns up to limit searches, newest first; a file that cannot
// be read is skipped (limit ≤ 0 means all).
func (s *Store) Searches(limit int) ([]report.SearchSummary, error) {
	ids, err := s.searches()
	if err != nil {
		return nil, err
	}
	out := []report.SearchSummary{}
	for _, id := range slices.Backward(ids) {
		if limit > 0 && len(out) == limit {
			break
		}
		if r, err := s.Search(id); err == nil {
			out = append(out, r.Summary())
		}
	}
	return out, nil
}

// searches returns the ids of the saved searches, oldest first (an id
// begins with its start time, to the second). Called with mu held or
// not: a listing races only with a rename, which is atomic.
func (s *Store) searches() ([]string, error) {
	des, err := os.ReadDir(s.searchesPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	var ids []string
	for _, de := range des {
		id, ok := strings.CutSuffix(de.Name(), ".json")
		if ok && de.Type().IsRegular() && validID(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// pruneSearches deletes searches past the history's bounds, a pinned
// one kept and not counted. Called with mu held.
func (s *Store) pruneSearches() error {
	ids, err := s.searches()
	if err != nil {
		return err
	}
	pins, err := s.readPins()
	if err != nil {
		return err
	}
	pinned := map[string]bool{}
	for _, p := range pins {
		pinned[p.ID] = true
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return pinned[id] })
	now := s.o.Now()
	var errs []error
	for i, id := range ids {
		tooMany := len(ids)-i > s.o.MaxRuns
		tooOld := false
		if s.o.MaxAge > 0 {
			if fi, err := os.Stat(filepath.Join(s.searchesPath(), id+".json")); err == nil {
				tooOld = now.Sub(fi.ModTime()) > s.o.MaxAge
			}
		}
		if !tooMany && !tooOld {
			break
		}
		if err := os.Remove(filepath.Join(s.searchesPath(), id+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CompareSearch sets r.Comparisons: r beside the previous search of its
// profile against the same target (the newest that started before it and
// was not aborted), and beside the profile's pinned baseline, as Compare
// does a soak run.
func (s *Store) CompareSearch(r *report.Search) error {
	r.Comparisons = nil
	prev, err := s.previousSearch(r)
	switch {
	case err != nil:
		r.Comparisons = append(r.Comparisons, report.MissingSearchComparison(report.AgainstPrevious, "the history could not be read: "+err.Error()))
	case prev == nil:
		r.Comparisons = append(r.Comparisons, report.MissingSearchComparison(report.AgainstPrevious,
			fmt.Sprintf("no earlier search of profile %q against %q in the history (aborted searches are not compared)", r.Profile, r.Target)))
	default:
		r.Comparisons = append(r.Comparisons, report.CompareSearch(report.AgainstPrevious, r, prev))
	}
	base, why, berr := baseline(s, r.Profile, r.ID, "search", s.Search)
	if why != "" {
		r.Comparisons = append(r.Comparisons, report.MissingSearchComparison(report.AgainstBaseline, why))
	} else {
		r.Comparisons = append(r.Comparisons, report.CompareSearch(report.AgainstBaseline, r, base))
	}
	return errors.Join(err, berr)
}

// previousSearch returns the newest search of r's profile and target that
// started before r and was not aborted, or nil. Damaged files are
// skipped: one bad file must not hide every earlier search.
func (s *Store) previousSearch(r *report.Search) (*report.Search, error) {
	ids, err := s.searches()
	if err != nil {
		return nil, err
	}
	for _, id := range slices.Backward(ids) {
		if id == r.ID {
			continue
		}
		was, err := s.Search(id)
		if err != nil {
			continue
		}
		if was.Profile == r.Profile && was.Target == r.Target && was.Result != report.SearchAborted && was.StartTime.Before(r.StartTime) {
			return was, nil
		}
	}
	return nil, nil
}
