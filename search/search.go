// Package search finds the largest load a server keeps its objectives
// at: the knee. It plans the steps of one varied dimension (messages per
// second, users online, group size): geometric up from a start until a
// step fails, then bisection between the last step that passed and the
// first that failed, until the two are within a precision. It decides
// only what to try next; running a step and judging it against the
// thresholds is the caller's (the soak runner's).
//
// A step the prober could not judge because it was itself saturated ends
// the search as inconclusive: the limit found there is imcanary's, and
// the search never reports it as the server's.
package search

import (
	"errors"
	"fmt"
	"math"
)

// Plan is how a search steps.
type Plan struct {
	// Start is the first step's load; Max the most the search tries.
	Start, Max float64
	// Factor is the growth from one step to the next before a step
	// fails, above 1 (2 doubles the load).
	Factor float64
	// Precision ends the bisection once the failing load is within this
	// fraction above the passing one (0.05: 5%).
	Precision float64
	// Whole says the load is a count (users, group size): steps are
	// whole numbers, and the bisection ends at adjacent ones.
	Whole bool
}

// Validate names what is wrong with p.
func (p Plan) Validate() error {
	switch {
	case !(p.Start > 0):
		return fmt.Errorf("start %v: must be above 0", p.Start)
	case !(p.Max >= p.Start):
		return fmt.Errorf("max %v: must be at least start (%v)", p.Max, p.Start)
	case !(p.Factor > 1) || math.IsInf(p.Factor, 0):
		return fmt.Errorf("factor %v: must be above 1", p.Factor)
	case !(p.Precision > 0 && p.Precision < 1):
		return fmt.Errorf("precision %v: must be a fraction between 0 and 1", p.Precision)
	case p.Whole && p.Start < 1:
		return fmt.Errorf("start %v: a count starts at 1 at least", p.Start)
	}
	return nil
}

// Verdict is a step's outcome.
type Verdict int

const (
	// Pass: every threshold held at the step's load.
	Pass Verdict = iota
	// Fail: a threshold broke.
	Fail
	// Inconclusive: the prober was saturated during the step, so its
	// figures cannot tell the server's limit from its own.
	Inconclusive
)

func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Fail:
		return "fail"
	}
	return "inconclusive"
}

// Step is one load tried and what it gave.
type Step struct {
	Load    float64
	Verdict Verdict
}

// End says why a search ended.
type End int

const (
	// Running: the search has a next step.
	Running End = iota
	// Found: the knee lies between the last passing and the first
	// failing load, within the precision.
	Found
	// NoLimit: the most the plan allows passed; the server's limit, if
	// any, is beyond the search's reach.
	NoLimit
	// BelowStart: even the smallest load tried failed.
	BelowStart
	// ProberLimit: the prober saturated before the server broke.
	ProberLimit
)

func (e End) String() string {
	return [...]string{"running", "found", "no limit within reach", "fails below the start", "inconclusive: the prober is the limit"}[e]
}

// Search is one search's state. Not safe for concurrent use.
type Search struct {
	p     Plan
	steps []Step
	// pass is the highest load that passed, fail the lowest that failed
	// (0: none yet).
	pass, fail float64
	end        End
}

// minStart is how far below its start a search goes looking for a load
// that passes: a failing start is halved this many times at most.
const minStart = 1.0 / 64

// New starts a search of p.
func New(p Plan) (*Search, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Search{p: p}, nil
}

// Next returns the load to try next, and false once the search has ended
// (End says why).
func (s *Search) Next() (float64, bool) {
	if s.end != Running {
		return 0, false
	}
	var load float64
	switch {
	case len(s.steps) == 0:
		load = s.p.Start
	case s.fail == 0:
		// Nothing failed yet: up, geometrically, to Max.
		load = math.Min(s.pass*s.p.Factor, s.p.Max)
	case s.pass == 0:
		// Everything tried failed: down, geometrically.
		load = s.fail / s.p.Factor
	default:
		load = (s.pass + s.fail) / 2
	}
	if s.p.Whole {
		load = math.Floor(load)
		if s.pass > 0 && load <= s.pass {
			load = s.pass + 1
		}
	}
	return load, true
}

// Record records the verdict of the step at load, which Next returned,
// and whether the search ends with it.
func (s *Search) Record(load float64, v Verdict) error {
	if s.end != Running {
		return errors.New("search: a step recorded after the search ended")
	}
	s.steps = append(s.steps, Step{Load: load, Verdict: v})
	switch v {
	case Inconclusive:
		s.end = ProberLimit
		return nil
	case Pass:
		s.pass = math.Max(s.pass, load)
		if s.fail == 0 && load >= s.p.Max {
			s.end = NoLimit
			return nil
		}
	case Fail:
		if s.fail == 0 || load < s.fail {
			s.fail = load
		}
		if s.pass == 0 && load <= s.p.Start*minStart || s.p.Whole && s.pass == 0 && load <= 1 {
			s.end = BelowStart
			return nil
		}
	}
	if s.pass > 0 && s.fail > 0 {
		if s.p.Whole && s.fail-s.pass <= 1 || !s.p.Whole && s.fail-s.pass <= s.p.Precision*s.pass {
			s.end = Found
		}
	}
	return nil
}

// End says whether and why the search ended.
func (s *Search) End() End { return s.end }

// Knee returns the largest load that passed and the smallest that
// failed (0 for none).
func (s *Search) Knee() (pass, fail float64) { return s.pass, s.fail }

// Steps returns the steps so far, in the order they were tried.
func (s *Search) Steps() []Step { return append([]Step(nil), s.steps...) }
