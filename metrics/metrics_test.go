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

// TestFrameCounts: a driver's frame counts are exported as counters read
// at scrape time, under the target's name.
func TestRetries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	n := uint64(0)
	RegisterRetries(reg, "staging", func() uint64 { return n })
	n = 7
	want := `
# HELP imcanary_send_retries_total Sends tried again, under the same idempotency key, after they got no answer or a transient refusal; the server counts each once.
# TYPE imcanary_send_retries_total counter
imcanary_send_retries_total{target="staging"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestFrameCounts(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	unmatched, gaps, missed := uint64(3), uint64(2), uint64(5)
	RegisterFrameCounts(reg, "staging", FrameCounts{
		Unmatched: func() uint64 { return unmatched },
		Gaps:      func() (uint64, uint64) { return gaps, missed },
	})
	unmatched = 4
	want := `
# HELP imcanary_frames_ignored_total Frames read from the server that imcanary did not use, by reason: unmatched frames matched no rule of the protocol's mapping.
# TYPE imcanary_frames_ignored_total counter
imcanary_frames_ignored_total{reason="unmatched",target="staging"} 4
# HELP imcanary_server_sequence_gaps_total Jumps in a conversation's server-assigned sequence numbers within a session: pushes the server's own numbering shows it skipped.
# TYPE imcanary_server_sequence_gaps_total counter
imcanary_server_sequence_gaps_total{target="staging"} 2
# HELP imcanary_server_sequence_missed_total Sequence numbers the server's numbering skipped, over imcanary_server_sequence_gaps_total's gaps.
# TYPE imcanary_server_sequence_missed_total counter
imcanary_server_sequence_missed_total{target="staging"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
