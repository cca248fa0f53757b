//go:build unix

// Package browser opens the pages imcanary writes and serves (the soak
// report, the status page) in a real browser for their tests: Debian's
// headless Chromium renders a page from a file, dumps the DOM or takes a
// screenshot, and its logs and NetLog show whether the page raised an error
// or asked the network for anything. It is test support: nothing in the
// binary imports it.
package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
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

// Budget bounds a whole browser test, every Chromium run in it included. A
// run takes about seven seconds on a CI machine (most of it start-up), so
// this leaves room for a slow one without letting a hung browser hold CI.
const Budget = 60 * time.Second

// Find returns the browser to run, skipping the test where there is none,
// except in CI, where a missing browser is a broken .ci/run.
func Find(t testing.TB) string {
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

// Run is what one Chromium run left behind.
type Run struct {
	Stdout, Stderr []byte
	NetLog         string // path of the NetLog JSON file
}

// Open opens page (a local file) in headless Chromium with the extra
// arguments, and returns its output. Chromium runs in a process group of
// its own, so that its helpers (zygote, GPU and renderer processes) are
// killed with it on timeout and once it has exited.
func Open(ctx context.Context, t testing.TB, bin, page string, extra ...string) Run {
	t.Helper()
	dir := t.TempDir()
	run := Run{NetLog: filepath.Join(dir, "netlog.json")}
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"),
		"--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000",
		// Chromium still reaches for its update and sign-in servers
		// despite the flags above. No host resolves, so nothing leaves
		// the machine; the NetLog records each attempt all the same.
		"--host-resolver-rules=MAP * ~NOTFOUND",
		"--log-net-log=" + run.NetLog,
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
	run.Stdout, run.Stderr = stdout.Bytes(), stderr.Bytes()
	if ctx.Err() != nil {
		t.Fatalf("chromium did not finish within its budget; stderr:\n%s", Tail(run.Stderr, 30))
	}
	if err != nil {
		t.Fatalf("chromium %s: %v; stderr:\n%s", strings.Join(extra, " "), err, Tail(run.Stderr, 30))
	}
	return run
}

// Problems lists what the page did wrong in a run: script
// errors and console messages (the report has no script, so any message
// is a fault), failed loads of http(s) URLs, and every request for a
// non-file URL that the page made, from the NetLog. The hosts Chromium
// asked for itself are returned apart, as own, for the log.
func (run Run) Problems() (problems, own []string) {
	for _, line := range strings.Split(string(run.Stderr), "\n") {
		switch {
		case strings.Contains(line, "Uncaught"), strings.Contains(line, ":CONSOLE"): // INFO:CONSOLE, ERROR:CONSOLE
			problems = append(problems, "console: "+line)
		case strings.Contains(line, "net::") && (strings.Contains(line, "http://") || strings.Contains(line, "https://")):
			problems = append(problems, "network error: "+line)
		}
	}

	raw, err := os.ReadFile(run.NetLog)
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
		if u == "" || localURL(u) {
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

func localURL(u string) bool {
	for _, p := range []string{"file:", "data:", "about:", "blob:", "chrome:", "chrome-extension:", "devtools:"} {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

// Check fails t for every problem the page caused in run.
func Check(t testing.TB, run Run) {
	t.Helper()
	problems, own := run.Problems()
	for _, p := range problems {
		t.Error(p)
	}
	if len(own) > 0 {
		t.Logf("chromium's own requests (not the page's; none resolved): %s", strings.Join(own, ", "))
	}
}

// Colours counts the distinct colours on a grid of sample points.
func Colours(img image.Image) int {
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

// HasColour reports whether some pixel in area is within a small
// distance of the colour, allowing for anti-aliasing and colour profiles.
func HasColour(img image.Image, area image.Rectangle, r0, g0, b0 int) bool {
	area = area.Intersect(img.Bounds())
	for y := area.Min.Y; y < area.Max.Y; y += 2 {
		for x := area.Min.X; x < area.Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			if abs(int(r>>8)-r0) <= 12 && abs(int(g>>8)-g0) <= 12 && abs(int(b>>8)-b0) <= 12 {
				return true
			}
		}
	}
	return false
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// Tail returns the last n lines of a log, for failure messages.
func Tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
