package soak

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/imcanary/imcanary/report"
)

// TestGoldenNotes: the text the runner writes into a report (the drill's
// reaction, its ratios, the saturation and drill notes) is what package
// report's golden drill report shows for the same numbers, so that the
// golden files keep covering it now that the runner and the renderers
// live apart.
func TestGoldenNotes(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "report", "testdata", "report-drill.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if r.Drill == nil || len(r.Notes) < 2 {
		t.Fatalf("golden drill report has drill %v and %d notes, want a drill and its notes", r.Drill, len(r.Notes))
	}

	d := r.Drill.Deliveries
	d.LossRatio, d.LateRatio = 0, 0
	if setRatios(&d); d != r.Drill.Deliveries {
		t.Errorf("setRatios(%+v) = %+v, want the golden %+v", r.Drill.Deliveries, d, r.Drill.Deliveries)
	}
	ends := []drillEnd{
		{slowEnd: slowEnd{reason: "slow_consumer", code: 4008}, n: 58},
		{slowEnd: slowEnd{reason: "error"}, n: 3},
	}
	if got := drillReaction(r.Drill, ends, r.Drill.SlowReaders); got != r.Drill.Reaction {
		t.Errorf("drillReaction() = %q, want the golden %q", got, r.Drill.Reaction)
	}
	if got, want := saturationNote(r), r.Notes[0]; got != want {
		t.Errorf("saturationNote() = %q, want the golden %q", got, want)
	}
	if got, want := drillNote(r.Drill, r.Profile.Users), r.Notes[len(r.Notes)-1]; got != want {
		t.Errorf("drillNote() = %q, want the golden %q", got, want)
	}
}
