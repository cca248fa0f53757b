package search

import (
	"math"
	"strings"
	"testing"
)

// run searches a server that passes every load up to limit and a prober
// that saturates at prober (0: never), and returns the search.
func run(t *testing.T, p Plan, limit, prober float64) *Search {
	t.Helper()
	s, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		load, ok := s.Next()
		if !ok {
			return s
		}
		if p.Whole && load != math.Floor(load) {
			t.Fatalf("step %v: a count must be whole", load)
		}
		v := Pass
		switch {
		case prober > 0 && load >= prober:
			v = Inconclusive
		case load > limit:
			v = Fail
		}
		if err := s.Record(load, v); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("search did not end in 100 steps: %v", s.Steps())
	return nil
}

func TestSearch(t *testing.T) {
	rate := Plan{Start: 100, Max: 100000, Factor: 2, Precision: 0.05}
	users := Plan{Start: 10, Max: 5000, Factor: 2, Precision: 0.05, Whole: true}
	for _, tt := range []struct {
		name          string
		p             Plan
		limit, prober float64
		end           End
		maxSteps      int
	}{
		{"the reference server's known limit", rate, 3000, 0, Found, 12},
		{"a limit at a step exactly", rate, 1600, 0, Found, 12},
		{"no limit within reach", rate, 1e9, 0, NoLimit, 12},
		{"the prober saturates first", rate, 3000, 1000, ProberLimit, 12},
		{"a failing start", rate, 30, 0, Found, 20},
		{"nothing passes", rate, 0.5, 0, BelowStart, 20},
		{"whole users", users, 437, 0, Found, 20},
		{"whole users, a limit of 1", users, 1, 0, Found, 20},
		{"whole users, none pass", users, 0, 0, BelowStart, 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := run(t, tt.p, tt.limit, tt.prober)
			if s.End() != tt.end {
				t.Fatalf("ended %v after %v, want %v", s.End(), s.Steps(), tt.end)
			}
			if n := len(s.Steps()); n > tt.maxSteps {
				t.Errorf("%d steps, want at most %d: %v", n, tt.maxSteps, s.Steps())
			}
			pass, fail := s.Knee()
			switch tt.end {
			case Found:
				// The knee is bracketed: what passed is at or below
				// the limit, what failed above it, within precision.
				if pass > tt.limit || fail <= tt.limit {
					t.Errorf("knee %v..%v does not bracket the limit %v", pass, fail, tt.limit)
				}
				if tt.p.Whole && fail-pass != 1 || !tt.p.Whole && (fail-pass) > tt.p.Precision*pass {
					t.Errorf("knee %v..%v: wider than the precision", pass, fail)
				}
			case NoLimit:
				if pass != tt.p.Max || fail != 0 {
					t.Errorf("knee %v..%v, want the plan's max passing and nothing failing", pass, fail)
				}
			case ProberLimit:
				// The last step is the prober's, and no server limit
				// is claimed: nothing failed.
				steps := s.Steps()
				if last := steps[len(steps)-1]; last.Verdict != Inconclusive || fail != 0 {
					t.Errorf("steps %v, knee %v..%v: want it to end on the inconclusive step, nothing failed", steps, pass, fail)
				}
			}
			if _, ok := s.Next(); ok {
				t.Error("Next after the end gave a step")
			}
			if err := s.Record(1, Pass); err == nil {
				t.Error("Record after the end succeeded")
			}
		})
	}
}

func TestPlanValidate(t *testing.T) {
	good := Plan{Start: 100, Max: 1000, Factor: 2, Precision: 0.05}
	for _, tt := range []struct {
		edit func(*Plan)
		want string
	}{
		{func(p *Plan) { p.Start = 0 }, "start 0: must be above 0"},
		{func(p *Plan) { p.Max = 50 }, "max 50: must be at least start"},
		{func(p *Plan) { p.Factor = 1 }, "factor 1: must be above 1"},
		{func(p *Plan) { p.Factor = math.NaN() }, "factor NaN"},
		{func(p *Plan) { p.Precision = 0 }, "precision 0"},
		{func(p *Plan) { p.Precision = 1 }, "precision 1"},
		{func(p *Plan) { p.Whole, p.Start = true, 0.5 }, "a count starts at 1"},
	} {
		p := good
		tt.edit(&p)
		if _, err := New(p); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", p, err, tt.want)
		}
	}
	if _, err := New(good); err != nil {
		t.Errorf("New(%+v) = %v", good, err)
	}
}

// TestSearchSteps pins the steps of one search, the order a reader sees
// in a report: up by the factor, then halving the bracket.
func TestSearchSteps(t *testing.T) {
	s := run(t, Plan{Start: 100, Max: 100000, Factor: 2, Precision: 0.05}, 3000, 0)
	var got []float64
	for _, st := range s.Steps() {
		got = append(got, st.Load)
	}
	want := []float64{100, 200, 400, 800, 1600, 3200, 2400, 2800, 3000, 3100}
	if len(got) != len(want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("steps %v, want %v", got, want)
		}
	}
}
