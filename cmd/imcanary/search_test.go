package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/refserver"
)

// TestSoakSearch runs imcanary soak --profile for a profile with a
// search, against a server with no limit within its reach: two steps,
// the verdict, the JSON report, exit 0; and --html refused, as a search
// has no page yet.
func TestSoakSearch(t *testing.T) {
	url := startTarget(t, refserver.Faults{})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "imcanary.yaml")
	body := fmt.Sprintf(`
target: {url: %q}
data_dir: %q
soak:
  profiles:
    - name: reach
      users: 10
      rate: 5
      ramp: 200ms
      duration: 1s
      drain: 2s
      deadline: 1s
      search: {vary: rate, max: 10}
`, url, filepath.Join(dir, "data"))
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonOut := filepath.Join(dir, "search.json")
	var out, errOut bytes.Buffer
	if code := run([]string{"soak", "--config", cfg, "--profile", "reach", "--json", jsonOut}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d, want %d:\n%s%s", code, exitOK, out.String(), errOut.String())
	}
	for _, want := range []string{"step 5: pass", "step 10: pass", "no limit within reach: 10 messages per second per user, the most the search tries, passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(jsonOut)
	if err != nil || !bytes.Contains(b, []byte(`"result": "no_limit"`)) || !bytes.Contains(b, []byte(`"kind": "search"`)) {
		t.Errorf("JSON report %s, %v: want a search that found no limit", b, err)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"soak", "--config", cfg, "--profile", "reach", "--html", filepath.Join(dir, "x.html")}, &out, &errOut); code != exitUsage ||
		!strings.Contains(errOut.String(), "--html: a search's report is text and JSON only") {
		t.Errorf("--html for a search: exit %d, %s; want %d and why", code, errOut.String(), exitUsage)
	}
}
