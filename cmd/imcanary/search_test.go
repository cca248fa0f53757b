package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/refserver"
)

// TestSoakSearch runs imcanary soak --profile for a profile with a
// search, against a server with no limit within its reach: two steps,
// the verdict, the JSON report, exit 0; then, with the first pinned, a
// second search compared with it twice over, and its HTML page.
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
	var first struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &first); err != nil || first.ID == "" {
		t.Fatalf("JSON report without an id: %v", err)
	}
	if !strings.Contains(out.String(), `compared with the previous search: none: no earlier search of profile "reach"`) {
		t.Errorf("the first search does not say it has nothing to be compared with:\n%s", out.String())
	}

	// Pinned, the first search is the baseline of the next, which is
	// also compared with it as the previous search, and has a page.
	out.Reset()
	if code := run([]string{"soak", "pin", "--config", cfg, first.ID}, &out, &errOut); code != exitOK ||
		!strings.Contains(out.String(), "pinned "+first.ID+" (no_limit") {
		t.Fatalf("soak pin %s: exit %d, %s%s", first.ID, code, out.String(), errOut.String())
	}
	out.Reset()
	page := filepath.Join(dir, "search.html")
	if code := run([]string{"soak", "--config", cfg, "--profile", "reach", "--html", page}, &out, &errOut); code != exitOK {
		t.Fatalf("second search: exit %d:\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"compared with the previous search " + first.ID, "compared with the baseline search " + first.ID} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("second search's output lacks %q:\n%s", want, out.String())
		}
	}
	html, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(html, []byte("<title>NO LIMIT · search reach · ")) || bytes.Count(html, []byte("<svg ")) != 3 {
		t.Errorf("--html page (%d bytes, %v): want a search page with its three charts", len(html), err)
	}
}
