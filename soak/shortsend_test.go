package soak

import (
	"context"
	"testing"
	"time"

	"github.com/imcanary/imcanary/refserver"
)

// TestSoakShortSendPhase: a send phase shorter than the sample interval
// still gets a sample, or min_online_ratio would fail a clean run at 0%.
func TestSoakShortSendPhase(t *testing.T) {
	url, _ := startTarget(t, refserver.Faults{})
	r, _ := newTestRunner(t, url)
	r.o.SampleEvery = 0 // the default: 1 s for this profile
	p := testProfile()
	p.Ramp, p.Duration = 0, 500*time.Millisecond
	rep, err := r.Run(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Result != "pass" {
		t.Errorf("clean target: result %s, min_online_ratio row %+v", rep.Result, row(rep, "min_online_ratio"))
	}
}
