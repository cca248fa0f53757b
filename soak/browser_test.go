//go:build unix

package soak

// The HTML report opened in a real browser: Debian's headless Chromium
// renders it from a file, dumps the DOM and takes a screenshot, and its
// logs and NetLog show whether the page raised an error or asked the
// network for anything.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// renderBrowserBudget bounds the whole browser test, every Chromium run in
// it included. A run takes about seven seconds on a CI machine (most of it
// start-up), so this leaves room for a slow one without letting a hung
// browser hold CI.
const renderBrowserBudget = 60 * time.Second

// renderChromium returns the browser to run, skipping the test where there
// is none, except in CI, where a missing browser is a broken .ci/run.
func renderChromium(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CHROMIUM")
	if bin == "" {
		bin = "/usr/bin/chromium"
	}
	path, err := exec.LookPath(bin)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not installed: .ci/run must install it")
	}
	t.Skipf("chromium not installed (%v): apt-get install chromium, or set CHROMIUM to a Chromium binary, to run the browser test", err)
	return ""
}

// renderBrowserRun is what one Chromium run left behind.
type renderBrowserRun struct {
	stdout, stderr []byte
	netlog         string // path of the NetLog JSON file
}

// renderRunChromium opens page (a local file) in headless Chromium with
// the extra arguments, and returns its output. Chromium runs in a process
// group of its own, so that its helpers (zygote, GPU and renderer
// processes) are killed with it on timeout and once it has exited.
func renderRunChromium(ctx context.Context, t *testing.T, bin, page string, extra ...string) renderBrowserRun {
	t.Helper()
	dir := t.TempDir()
	run := renderBrowserRun{netlog: filepath.Join(dir, "netlog.json")}
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"),
		"--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000",
		// Chromium still reaches for its update and sign-in servers
		// despite the flags above. No host resolves, so nothing leaves
		// the machine; the NetLog records each attempt all the same.
		"--host-resolver-rules=MAP * ~NOTFOUND",
		"--log-net-log=" + run.netlog,
	}
	args = append(args, extra...)
	args = append(args, (&url.URL{Scheme: "file", Path: page}).String())

	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Dir = dir
	// A home of its own keeps Chromium's caches and crash reports out of
	// the user's.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_CACHE_HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Output pipes held open by a stray helper must not hold Wait.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	pgid := cmd.Process.Pid
	err := cmd.Wait()
	// Helpers that outlived the browser go with their group. The group
	// cannot have been reused yet: its members keep the id in use, and
	// with none left this finds nothing (ESRCH).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	run.stdout, run.stderr = stdout.Bytes(), stderr.Bytes()
	if ctx.Err() != nil {
		t.Fatalf("chromium did not finish within %v; stderr:\n%s", renderBrowserBudget, renderTail(run.stderr, 30))
	}
	if err != nil {
		t.Fatalf("chromium %s: %v; stderr:\n%s", strings.Join(extra, " "), err, renderTail(run.stderr, 30))
	}
	return run
}

// renderBrowserProblems lists what the page did wrong in a run: script
// errors and console messages (the report has no script, so any message
// is a fault), failed loads of http(s) URLs, and every request for a
// non-file URL that the page made, from the NetLog. The hosts Chromium
// asked for itself are returned apart, as own, for the log.
func renderBrowserProblems(run renderBrowserRun) (problems, own []string) {
	for _, line := range strings.Split(string(run.stderr), "\n") {
		switch {
		case strings.Contains(line, "Uncaught"), strings.Contains(line, ":CONSOLE"): // INFO:CONSOLE, ERROR:CONSOLE
			problems = append(problems, "console: "+line)
		case strings.Contains(line, "net::") && (strings.Contains(line, "http://") || strings.Contains(line, "https://")):
			problems = append(problems, "network error: "+line)
		}
	}

	raw, err := os.ReadFile(run.netlog)
	if err != nil {
		return append(problems, fmt.Sprintf("netlog: %v", err)), own
	}
	var nl struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int            `json:"type"`
			Params map[string]any `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &nl); err != nil {
		return append(problems, fmt.Sprintf("netlog: %v", err)), own
	}
	start, ok := nl.Constants.LogEventTypes["URL_REQUEST_START_JOB"]
	if !ok {
		return append(problems, "netlog: no URL_REQUEST_START_JOB event type; has the format changed?"), own
	}
	for _, e := range nl.Events {
		if e.Type != start {
			continue
		}
		u, _ := e.Params["url"].(string)
		if u == "" || renderLocalURL(u) {
			continue
		}
		// The page's own requests carry the file:// page as their top
		// frame; Chromium's background requests carry none.
		nik, _ := e.Params["network_isolation_key"].(string)
		sfc, _ := e.Params["site_for_cookies"].(string)
		if strings.HasPrefix(nik, "file://") || strings.Contains(sfc, "site=file://") {
			problems = append(problems, "request from the page: "+u)
		} else if pu, err := url.Parse(u); err == nil && !slices.Contains(own, pu.Scheme+"://"+pu.Host) {
			own = append(own, pu.Scheme+"://"+pu.Host)
		}
	}
	return problems, own
}

func renderLocalURL(u string) bool {
	for _, p := range []string{"file:", "data:", "about:", "blob:", "chrome:", "chrome-extension:", "devtools:"} {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

func TestReportInBrowser(t *testing.T) {
	bin := renderChromium(t)
	ctx, cancel := context.WithTimeout(t.Context(), renderBrowserBudget)
	defer cancel()

	page := filepath.Join(t.TempDir(), "report.html")
	var b bytes.Buffer
	if err := WriteHTML(&b, renderTestReport()); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("dom", func(t *testing.T) {
		run := renderRunChromium(ctx, t, bin, page, "--dump-dom")
		dom := string(run.stdout)
		if n := strings.Count(dom, "<svg "); n != 4 {
			t.Errorf("dumped DOM has %d <svg> elements, want 4 (%d bytes of DOM)", n, len(dom))
		}
		for _, want := range []string{
			`aria-label="verdict FAIL">FAIL</div>`, "Delivery latency over time", "Sessions online", "<polyline",
		} {
			if !strings.Contains(dom, want) {
				t.Errorf("dumped DOM lacks %q", want)
			}
		}
		renderCheckRun(t, run)
	})

	// The drill and saturation sections, and the shaded bands, render as
	// the page's own elements.
	t.Run("drill dom", func(t *testing.T) {
		drill := filepath.Join(t.TempDir(), "drill.html")
		var b bytes.Buffer
		if err := WriteHTML(&b, renderDrillReport()); err != nil {
			t.Fatalf("WriteHTML: %v", err)
		}
		if err := os.WriteFile(drill, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		run := renderRunChromium(ctx, t, bin, drill, "--dump-dom")
		dom := string(run.stdout)
		if n := strings.Count(dom, "<svg "); n != 4 {
			t.Errorf("dumped DOM has %d <svg> elements, want 4 (%d bytes of DOM)", n, len(dom))
		}
		for _, want := range []string{
			`aria-label="verdict INCONCLUSIVE">INCONCLUSIVE</div>`, "Slow-reader drill", "imcanary saturated",
			"disconnected as slow consumers (close 4008)", `<rect class="saturated"`,
		} {
			if !strings.Contains(dom, want) {
				t.Errorf("dumped DOM lacks %q", want)
			}
		}
		renderCheckRun(t, run)
	})

	t.Run("screenshot", func(t *testing.T) {
		shot := filepath.Join(t.TempDir(), "report.png")
		run := renderRunChromium(ctx, t, bin, page, "--screenshot="+shot, "--window-size=1280,2400")
		renderCheckRun(t, run)
		f, err := os.Open(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v; stderr:\n%s", err, renderTail(run.stderr, 20))
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("decode screenshot: %v", err)
		}
		if w := img.Bounds().Dx(); w != 1280 {
			t.Errorf("screenshot width = %d, want 1280", w)
		}
		if n := renderColours(img); n < 8 {
			t.Errorf("screenshot has %d distinct colours in its samples, want a rendered page (≥ 8)", n)
		}
		// The FAIL badge is red: the style sheet was applied.
		if !renderHasColour(img, image.Rect(0, 0, img.Bounds().Dx(), 300), 0xcf, 0x22, 0x2e) {
			t.Errorf("no verdict red (#cf222e) in the top 300 pixels of the screenshot")
		}
		if dst := os.Getenv("SOAK_REPORT_PNG"); dst != "" {
			raw, err := os.ReadFile(shot)
			if err == nil {
				err = os.WriteFile(dst, raw, 0o644)
			}
			if err != nil {
				t.Errorf("copy screenshot to SOAK_REPORT_PNG: %v", err)
			}
		}
	})

	// The checks above pass vacuously if Chromium stops logging what they
	// look for. A page that does everything the report must not do shows
	// that they still see it.
	t.Run("checks see a bad page", func(t *testing.T) {
		if testing.Short() {
			t.Skip("one more browser run; skipped with -short")
		}
		bad := filepath.Join(t.TempDir(), "bad.html")
		const html = `<!DOCTYPE html><html><head>` +
			`<link rel="stylesheet" href="https://fonts.example.invalid/a.css"></head>` +
			`<body><img src="http://127.0.0.1:9/x.png">` +
			`<script>console.error("boom"); undefinedFunction();</script></body></html>`
		if err := os.WriteFile(bad, []byte(html), 0o644); err != nil {
			t.Fatal(err)
		}
		run := renderRunChromium(ctx, t, bin, bad, "--dump-dom")
		problems, _ := renderBrowserProblems(run)
		joined := strings.Join(problems, "\n")
		for _, want := range []string{"Uncaught", "boom", "fonts.example.invalid", "127.0.0.1:9"} {
			if !strings.Contains(joined, want) {
				t.Errorf("problems found in a bad page lack %q; found:\n%s", want, joined)
			}
		}
	})
}

// renderCheckRun fails t for every problem the page caused in run.
func renderCheckRun(t *testing.T, run renderBrowserRun) {
	t.Helper()
	problems, own := renderBrowserProblems(run)
	for _, p := range problems {
		t.Error(p)
	}
	if len(own) > 0 {
		t.Logf("chromium's own requests (not the page's; none resolved): %s", strings.Join(own, ", "))
	}
}

// renderColours counts the distinct colours on a grid of sample points.
func renderColours(img image.Image) int {
	b := img.Bounds()
	seen := map[[3]uint32]bool{}
	for y := b.Min.Y; y < b.Max.Y; y += max(1, b.Dy()/120) {
		for x := b.Min.X; x < b.Max.X; x += max(1, b.Dx()/64) {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
		}
	}
	return len(seen)
}

// renderHasColour reports whether some pixel in area is within a small
// distance of the colour, allowing for anti-aliasing and colour profiles.
func renderHasColour(img image.Image, area image.Rectangle, r0, g0, b0 int) bool {
	area = area.Intersect(img.Bounds())
	for y := area.Min.Y; y < area.Max.Y; y += 2 {
		for x := area.Min.X; x < area.Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			if renderAbs(int(r>>8)-r0) <= 12 && renderAbs(int(g>>8)-g0) <= 12 && renderAbs(int(b>>8)-b0) <= 12 {
				return true
			}
		}
	}
	return false
}

func renderAbs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// renderTail returns the last n lines of a log, for failure messages.
func renderTail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
