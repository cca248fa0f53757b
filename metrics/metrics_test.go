package metrics

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestInitialScrape is the golden scrape of a fresh Set: every series an
// alert may need exists at zero before the first event, with the names,
// help texts, labels and buckets that operators' rules rely on. A change
// here is a change to the contract with every dashboard and alert.
func TestInitialScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.For("staging", SourceBackground)
	m.Probe("staging")
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	golden := filepath.Join("testdata", "initial.prom")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(string(want))); err != nil {
		t.Errorf("scrape differs from %s (run with -update if intended): %v", golden, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestLatencyBuckets checks the histogram resolves 1 ms to 30 s and has a
// boundary at the latency SLI's 1 s threshold.
func TestLatencyBuckets(t *testing.T) {
	b := LatencyBuckets
	if b[0] != 0.001 || b[len(b)-1] != 30 {
		t.Errorf("LatencyBuckets = %v, want 0.001 … 30", b)
	}
	has1 := false
	for i, v := range b {
		if i > 0 && v <= b[i-1] {
			t.Errorf("LatencyBuckets not ascending at %d: %v", i, b)
		}
		has1 = has1 || v == 1
	}
	if !has1 {
		t.Errorf("LatencyBuckets = %v, want a boundary at 1 s", b)
	}
}
