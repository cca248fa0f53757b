package history

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

func comparison(t *testing.T, r *report.Soak, against string) report.Comparison {
	t.Helper()
	for _, c := range r.Comparisons {
		if c.Against == against {
			return c
		}
	}
	t.Fatalf("no %s comparison in %+v", against, r.Comparisons)
	return report.Comparison{}
}

func delta(t *testing.T, c report.Comparison, name string) report.Delta {
	t.Helper()
	i := slices.IndexFunc(c.Deltas, func(d report.Delta) bool { return d.Name == name })
	if i < 0 {
		t.Fatalf("no delta %q in the %s comparison", name, c.Against)
	}
	return c.Deltas[i]
}

// TestCompareFirstRun: a profile's first run says it has nothing to be
// compared with, and that no baseline is pinned.
func TestCompareFirstRun(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Now: fixedNow(storeEpoch)})
	r := storeReport("r1", storeEpoch)
	if err := s.Compare(r); err != nil {
		t.Fatal(err)
	}
	if c := comparison(t, r, report.AgainstPrevious); !strings.Contains(c.Missing, `no earlier run of profile "smoke"`) || len(c.Deltas) > 0 {
		t.Errorf("previous = %+v, want missing: no earlier run", c)
	}
	if c := comparison(t, r, report.AgainstBaseline); !strings.Contains(c.Missing, "no baseline is pinned") ||
		!strings.Contains(c.Missing, "imcanary soak pin RUN_ID") {
		t.Errorf("baseline = %+v, want missing: none pinned, and how to pin one", c)
	}
}

// TestComparePreviousAndBaseline: the previous run is the newest earlier
// run of the same profile and target that was not aborted; the baseline
// is the pinned run; a regression since either shows as its delta.
func TestComparePreviousAndBaseline(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{Now: fixedNow(storeEpoch.Add(time.Hour))})
	at := func(m int) time.Time { return storeEpoch.Add(time.Duration(m) * time.Minute) }

	base := storeReport("base", at(0))
	prev := storeReport("prev", at(10))
	prev.Latency["delivery_direct"] = report.Percentiles{Count: 500, P99: 100 * time.Millisecond}
	aborted := storeReport("aborted", at(20))
	aborted.Result = metrics.ResultAborted
	other := storeReport("other-profile", at(21))
	other.Profile.Name = "stress"
	elsewhere := storeReport("other-target", at(22))
	elsewhere.Target = "production"
	later := storeReport("later", at(40)) // after the run compared: never its previous
	for _, r := range []*report.Soak{base, prev, aborted, other, elsewhere, later} {
		if err := s.SaveSoak(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PinBaseline("base"); err != nil {
		t.Fatalf("PinBaseline(base) = %v", err)
	}

	// The run under test regressed: direct p99 4× the previous run's,
	// loss five times the baseline's.
	r := storeReport("now", at(30))
	r.Latency["delivery_direct"] = report.Percentiles{Count: 500, P99: 400 * time.Millisecond}
	r.Deliveries["all"] = report.Deliveries{Expected: 1000, Delivered: 995, Lost: 5, LossRatio: 0.005}
	r.Profile.Users = 20
	if err := s.Compare(r); err != nil {
		t.Fatal(err)
	}
	p := comparison(t, r, report.AgainstPrevious)
	if p.ID != "prev" || p.Missing != "" {
		t.Fatalf("previous = %q (missing %q), want prev", p.ID, p.Missing)
	}
	if d := delta(t, p, "delivery_direct p99"); d.Was != 0.1 || d.Now != 0.4 || !d.Worse || d.Relative == nil || *d.Relative < 2.99 || *d.Relative > 3.01 {
		t.Errorf("previous delivery_direct p99 = %+v, want 100ms → 400ms (+300%%), worse", d)
	}
	if !slices.Equal(p.SettingsChanged, []string{"users"}) {
		t.Errorf("previous SettingsChanged = %q, want [users]", p.SettingsChanged)
	}
	b := comparison(t, r, report.AgainstBaseline)
	if b.ID != "base" || b.Missing != "" {
		t.Fatalf("baseline = %q (missing %q), want base", b.ID, b.Missing)
	}
	if d := delta(t, b, "loss"); d.Was != 0.001 || d.Now != 0.005 || !d.Worse {
		t.Errorf("baseline loss = %+v, want 0.1%% → 0.5%%, worse", d)
	}

	// The pin is in the data directory: another process sees it.
	s2 := openStore(t, dir, Options{Now: fixedNow(storeEpoch.Add(time.Hour))})
	if pin, ok, err := s2.Baseline("smoke"); err != nil || !ok || pin.ID != "base" {
		t.Errorf("Baseline(smoke) in a second store = %+v, %v, %v, want base", pin, ok, err)
	}
	// The baseline compared with itself says so.
	if err := s.Compare(base); err != nil {
		t.Fatal(err)
	}
	if c := comparison(t, base, report.AgainstBaseline); c.Missing != "this run is the pinned baseline" {
		t.Errorf("baseline of the baseline = %+v", c)
	}
}

func TestPinBaselineErrors(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{Now: fixedNow(storeEpoch)})
	aborted := storeReport("aborted", storeEpoch)
	aborted.Result = metrics.ResultAborted
	if err := s.SaveSoak(aborted); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PinBaseline("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("PinBaseline(nope) = %v, want ErrNotFound", err)
	}
	if _, err := s.PinBaseline("aborted"); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("PinBaseline(aborted) = %v, want it refused as aborted", err)
	}
	if _, ok, _ := s.Baseline("smoke"); ok {
		t.Error("a refused pin pinned something")
	}
}

// TestCompareBaselinePruned: a baseline that the history's bounds pushed
// out is named as pruned, not silently dropped.
// TestPinnedBaselineOutlivesPruning: max_runs prunes the oldest runs that
// are not pinned, and keeps the pinned baseline, however old; a baseline
// that is gone all the same (deleted by hand) is reported missing.
func TestPinnedBaselineOutlivesPruning(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{MaxRuns: 2, MaxAge: 30 * time.Minute, Now: fixedNow(storeEpoch.Add(time.Hour))})
	if err := s.SaveSoak(storeReport("first", storeEpoch.Add(40*time.Minute))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PinBaseline("first"); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"second", "third", "fourth"} {
		if err := s.SaveSoak(storeReport(id, storeEpoch.Add(time.Duration(41+i)*time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := s.Runs(0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	if want := []string{"first", "fourth", "third"}; !slices.Equal(ids, want) {
		t.Errorf("runs kept with max_runs 2 = %v, want %v: the two newest and the pinned baseline", ids, want)
	}
	// Past max_age too: a reopened store (which prunes) at a later time.
	s = openStore(t, dir, Options{MaxRuns: 2, MaxAge: 30 * time.Minute, Now: fixedNow(storeEpoch.Add(3 * time.Hour))})
	if _, err := s.Soak("first"); err != nil {
		t.Errorf("pinned baseline after max_age: %v, want it kept", err)
	}
	if _, err := s.Soak("third"); err == nil {
		t.Errorf("run third kept past max_age, want it pruned")
	}
	r := storeReport("now", storeEpoch.Add(3*time.Hour))
	if err := s.Compare(r); err != nil {
		t.Fatal(err)
	}
	if c := comparison(t, r, report.AgainstBaseline); c.ID != "first" {
		t.Errorf("baseline = %+v, want the pinned run first", c)
	}

	if err := os.Remove(filepath.Join(dir, "runs", "first.json")); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, Options{MaxRuns: 2, Now: fixedNow(storeEpoch.Add(3 * time.Hour))})
	r = storeReport("later", storeEpoch.Add(4*time.Hour))
	if err := s.Compare(r); err != nil {
		t.Fatal(err)
	}
	if c := comparison(t, r, report.AgainstBaseline); !strings.Contains(c.Missing, "the pinned baseline first is no longer in the history") {
		t.Errorf("baseline = %+v, want missing: deleted", c)
	}
}
