package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// baselinesFile maps each profile to its pinned baseline run. It is small
// and rewritten whole on every pin.
const baselinesFile = "baselines.json"

// Pin is one profile's pinned baseline.
type Pin struct {
	ID     string    `json:"id"`
	Pinned time.Time `json:"pinned"`
}

func (s *Store) baselinesPath() string { return filepath.Join(s.dir, baselinesFile) }

// readPins reads baselines.json; a missing file pins nothing.
func (s *Store) readPins() (map[string]Pin, error) {
	b, err := os.ReadFile(s.baselinesPath())
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Pin{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	pins := map[string]Pin{}
	if err := json.Unmarshal(b, &pins); err != nil {
		return nil, fmt.Errorf("run history: %s: %w", s.baselinesPath(), err)
	}
	return pins, nil
}

// PinBaseline pins the run id as the baseline of its profile, replacing
// the profile's earlier pin, and returns the run. Later runs of the
// profile are compared with it.
func (s *Store) PinBaseline(id string) (report.RunSummary, error) {
	var sum report.RunSummary
	r, err := s.Soak(id)
	switch {
	case errors.Is(err, ErrNotFound):
		// A search's id: a profile with a search only ever searches, so
		// its pin is a search.
		sr, serr := s.Search(id)
		if serr != nil {
			if errors.Is(serr, ErrNotFound) {
				serr = err
			}
			return report.RunSummary{}, fmt.Errorf("pin %q: %w", id, serr)
		}
		if sr.Result == report.SearchAborted {
			return report.RunSummary{}, fmt.Errorf("pin %q: the search was aborted and found no knee to compare with", id)
		}
		sum = report.RunSummary{ID: sr.ID, Kind: sr.Kind, Target: sr.Target, Profile: sr.Profile, Result: sr.Result, Start: sr.StartTime, End: sr.EndTime}
	case err != nil:
		return report.RunSummary{}, fmt.Errorf("pin %q: %w", id, err)
	case r.Result == metrics.ResultAborted:
		return report.RunSummary{}, fmt.Errorf("pin %q: the run was aborted and has no counts to compare with", id)
	default:
		sum = r.Summary()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pins, err := s.readPins()
	if err != nil {
		return report.RunSummary{}, err
	}
	pins[sum.Profile] = Pin{ID: sum.ID, Pinned: s.o.Now().UTC()}
	b, err := json.MarshalIndent(pins, "", "  ")
	if err != nil {
		return report.RunSummary{}, err
	}
	if err := writeAtomic(s.baselinesPath(), append(b, '\n')); err != nil {
		return report.RunSummary{}, fmt.Errorf("pin %q: %w", id, err)
	}
	if err := syncDir(s.dir); err != nil {
		return report.RunSummary{}, fmt.Errorf("pin %q: %w", id, err)
	}
	return sum, nil
}

// Baseline returns the pin of profile; ok is false when it has none.
func (s *Store) Baseline(profile string) (p Pin, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pins, err := s.readPins()
	if err != nil {
		return Pin{}, false, err
	}
	p, ok = pins[profile]
	return p, ok, nil
}

// Compare sets r.Comparisons: r beside the previous run of its profile
// against the same target (the newest that started before it and was not
// aborted), and beside the profile's pinned baseline. A run that is not
// there is a Comparison that says why. The error is for a history that
// cannot be read; r then has what could be compared.
func (s *Store) Compare(r *report.Soak) error {
	r.Comparisons = nil
	prev, err := s.previous(r)
	switch {
	case err != nil:
		r.Comparisons = append(r.Comparisons, report.MissingComparison(report.AgainstPrevious, "the history could not be read: "+err.Error()))
	case prev == nil:
		r.Comparisons = append(r.Comparisons, report.MissingComparison(report.AgainstPrevious,
			fmt.Sprintf("no earlier run of profile %q against %q in the history (aborted runs are not compared)", r.Profile.Name, r.Target)))
	default:
		r.Comparisons = append(r.Comparisons, report.Compare(report.AgainstPrevious, r, prev))
	}

	base, why, berr := baseline(s, r.Profile.Name, r.ID, "run", s.Soak)
	if why != "" {
		r.Comparisons = append(r.Comparisons, report.MissingComparison(report.AgainstBaseline, why))
	} else {
		r.Comparisons = append(r.Comparisons, report.Compare(report.AgainstBaseline, r, base))
	}
	return errors.Join(err, berr)
}

// previous returns the newest run of r's profile and target that started
// before r and was not aborted, or nil.
func (s *Store) previous(r *report.Soak) (*report.Soak, error) {
	s.mu.Lock()
	if _, err := s.refresh(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	var id string
	for _, e := range slices.Backward(s.index) {
		if e.damaged == nil && e.ID != r.ID && e.Profile == r.Profile.Name && e.Target == r.Target &&
			e.Kind == r.Kind && e.Result != metrics.ResultAborted && e.Start.Before(r.Start) {
			id = e.ID
			break
		}
	}
	s.mu.Unlock()
	if id == "" {
		return nil, nil
	}
	return s.Soak(id)
}

// baseline returns the pinned baseline of profile to compare the report
// id with, read by load, or why there is none in words; what names the
// kind of report, "run" or "search". The error is for a history that
// could not be read.
func baseline[T any](s *Store, profile, id, what string, load func(string) (T, error)) (base T, missing string, err error) {
	var none T
	pin, ok, err := s.Baseline(profile)
	switch {
	case err != nil:
		return none, "the pinned baselines could not be read: " + err.Error(), err
	case !ok:
		return none, fmt.Sprintf("no baseline is pinned for profile %q (imcanary soak pin %s_ID pins one)", profile, strings.ToUpper(what)), nil
	case pin.ID == id:
		return none, "this " + what + " is the pinned baseline", nil
	}
	base, err = load(pin.ID)
	switch {
	case errors.Is(err, ErrNotFound):
		return none, fmt.Sprintf("the pinned baseline %s is no longer in the history as a %s (deleted: pruning keeps a pinned %s)", pin.ID, what, what), nil
	case err != nil:
		return none, fmt.Sprintf("the pinned baseline %s could not be read: %v", pin.ID, err), err
	}
	return base, "", nil
}
