package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/imcanary/imcanary/metrics"
)

// TestReach checks when the target counts as unreachable: at once while no
// attempt has ever succeeded, after three failures in a row once one has,
// and reachable again at the first success; and that the gauge callback
// runs once per change.
func TestReach(t *testing.T) {
	var changes []bool
	r := NewReach(func(ok bool) { changes = append(changes, ok) })
	if st := r.State(); st.Known {
		t.Fatalf("State() before any attempt = %+v, want unknown", st)
	}
	err := errors.New("boom")
	r.Failed(metrics.ConnectRefused, err)
	if st := r.State(); !st.Known || st.Reachable || st.Streak != 1 || st.Reason != metrics.ConnectRefused || st.Err != "boom" {
		t.Fatalf("after a first failure: %+v, want unreachable, streak 1, the reason and error", st)
	}
	r.Succeeded()
	r.Failed(metrics.ConnectTimeout, err)
	r.Failed(metrics.ConnectTimeout, err)
	if st := r.State(); !st.Reachable || st.Streak != 2 {
		t.Fatalf("two failures after a success: %+v, want still reachable", st)
	}
	r.Failed(metrics.ConnectTimeout, err)
	if st := r.State(); st.Reachable || st.Reason != metrics.ConnectTimeout {
		t.Fatalf("three failures after a success: %+v, want unreachable (timeout)", st)
	}
	r.Failed(metrics.ConnectTimeout, err)
	r.Succeeded()
	r.Succeeded()
	if st := r.State(); !st.Reachable || st.Streak != 0 || st.LastFailure.IsZero() {
		t.Fatalf("after a success: %+v, want reachable with the last failure kept", st)
	}
	if want := []bool{false, true, false, true}; !slices.Equal(changes, want) {
		t.Errorf("onChange calls = %v, want %v", changes, want)
	}
	var nilReach *Reach
	nilReach.Failed(metrics.ConnectRefused, err)
	nilReach.Succeeded()
	if st := nilReach.State(); st.Known {
		t.Errorf("nil Reach State() = %+v, want the zero state", st)
	}
}
