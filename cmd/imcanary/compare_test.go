package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/refserver"
)

// TestSoakComparesAndPins runs imcanary soak three times on one data
// directory: the first run has nothing to compare with and says so, the
// second is compared with the first, and after imcanary soak pin the third
// is compared with the pinned run as its baseline, in the text and in the
// JSON report.
func TestSoakComparesAndPins(t *testing.T) {
	cfg := soakConfig(t, startTarget(t, refserver.Faults{}))
	idRE := regexp.MustCompile(`id (\d{8}T\d{6}Z-[0-9a-f]{6})`)
	soak := func(args ...string) (string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		args = append([]string{"soak", "--config", cfg, "--profile", "smoke"}, args...)
		if code := run(args, &out, &errOut); code != exitOK {
			t.Fatalf("run(%q) = %d, want %d:\n%s%s", args, code, exitOK, out.String(), errOut.String())
		}
		m := idRE.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no run id in the report:\n%s", out.String())
		}
		return m[1], out.String()
	}

	first, out := soak()
	for _, want := range []string{`compared with the previous run: none: no earlier run of profile "smoke"`,
		`compared with the baseline run: none: no baseline is pinned for profile "smoke" (imcanary soak pin RUN_ID pins one)`} {
		if !strings.Contains(out, want) {
			t.Errorf("first run's report lacks %q:\n%s", want, out)
		}
	}
	second, out := soak()
	if !strings.Contains(out, "compared with the previous run "+first+" (PASS") {
		t.Errorf("second run %s is not compared with the first, %s:\n%s", second, first, out)
	}

	var pinOut, pinErr bytes.Buffer
	if code := run([]string{"soak", "pin", first, "--config", cfg}, &pinOut, &pinErr); code != exitOK ||
		!strings.Contains(pinOut.String(), "pinned "+first) {
		t.Fatalf("soak pin %s = %d:\n%s%s", first, code, pinOut.String(), pinErr.String())
	}
	if code := run([]string{"soak", "pin", "20990101T000000Z-000000", "--config", cfg}, &pinOut, &pinErr); code != exitUsage ||
		!strings.Contains(pinErr.String(), `no run "20990101T000000Z-000000" in the history`) {
		t.Errorf("soak pin of an unknown run = %d, want %d naming it:\n%s", code, exitUsage, pinErr.String())
	}

	jsonOut := filepath.Join(t.TempDir(), "third.json")
	_, out = soak("--json", jsonOut)
	if !strings.Contains(out, "compared with the previous run "+second) || !strings.Contains(out, "compared with the baseline run "+first) {
		t.Errorf("third run is not compared with %s (previous) and %s (baseline):\n%s", second, first, out)
	}
	b, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Comparisons []struct {
			Against, ID string
			Deltas      []struct{ Name string }
		}
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Comparisons) != 2 || rep.Comparisons[0].ID != second || rep.Comparisons[1].ID != first ||
		len(rep.Comparisons[1].Deltas) == 0 {
		t.Errorf("JSON comparisons = %+v, want previous %s and baseline %s with deltas", rep.Comparisons, second, first)
	}
}
