//go:build unix

package daemon

import (
	"context"
	"image"
	"image/png"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/browser"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestStatusPageInBrowser runs the daemon against a reference server made
// healthy, then lossy (2% of deliveries dropped), then killed, and opens
// the status page as served in headless Chromium at each stage: the
// verdict and its cause must be in the rendered page, it must load nothing
// and run nothing, and the verdict's colour must be on screen. With
// IMCANARYTEST_SCREENSHOTS=DIR the screenshots are kept there as
// status-healthy.png, status-degraded.png and status-down.png.
func TestStatusPageInBrowser(t *testing.T) {
	bin := browser.Find(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*browser.Budget)
	defer cancel()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, stopTarget := serveTarget(t, ln, nil)

	cfg := testConfig(t)
	cfg.Target.Name = "staging"
	cfg.Target.URL = "ws://" + ln.Addr().String() + "/ws"
	cfg.Canary = config.Canary{Schedule: "@every 2s", Deadline: time.Second, Users: 3, Messages: 1}
	cfg.Population.Backoff = config.Backoff{Initial: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// A reading a second, so that the charts have lines within the test.
	d.trend.every = time.Second
	base, _ := runDaemon(t, d)

	verdict := func(state, cause string) func() bool {
		return func() bool {
			var st Status
			getJSON(t, base+"/api/v1/status", &st)
			return st.Verdict.State == state && strings.Contains(strings.Join(st.Verdict.Causes, "\n"), cause)
		}
	}
	shots := os.Getenv("IMCANARYTEST_SCREENSHOTS")
	look := func(name, state, cause string, colour [3]int) {
		t.Helper()
		_, page := get(t, base+"/")
		file := filepath.Join(t.TempDir(), name+".html")
		if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		run := browser.Open(ctx, t, bin, file, "--dump-dom")
		dom := string(run.Stdout)
		for _, want := range []string{`id="verdict-state">` + state + `</div>`, cause, `<svg `} {
			if !strings.Contains(dom, want) {
				t.Errorf("%s: the rendered page lacks %q", name, want)
			}
		}
		if n := strings.Count(dom, "<svg "); n != 2 {
			t.Errorf("%s: the rendered page has %d charts, want 2", name, n)
		}
		browser.Check(t, run)

		png0 := filepath.Join(t.TempDir(), name+".png")
		if shots != "" {
			png0 = filepath.Join(shots, "status-"+name+".png")
		}
		run = browser.Open(ctx, t, bin, file, "--screenshot="+png0, "--window-size=1280,1800")
		browser.Check(t, run)
		f, err := os.Open(png0)
		if err != nil {
			t.Fatalf("%s: no screenshot: %v", name, err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("%s: decode screenshot: %v", name, err)
		}
		// The verdict's colour in the banner at the top: the style sheet
		// applied, and the page does not show trouble in green.
		if !browser.HasColour(img, image.Rect(0, 0, img.Bounds().Dx(), 260), colour[0], colour[1], colour[2]) {
			t.Errorf("%s: no %s verdict colour #%02x%02x%02x in the top of the screenshot", name, state, colour[0], colour[1], colour[2])
		}
	}

	testwait.For(t, 30*time.Second, "a healthy verdict with deliveries", func() bool {
		return verdict(VerdictHealthy, "all 20 sessions online")() && scrape(t, base)["imcanary_deliveries_total"] > 200
	})
	look("healthy", VerdictHealthy, "all 20 sessions online; every SLI at or above 99.9%", [3]int{0x1a, 0x7f, 0x37})

	srv.SetFaults(refserver.Faults{Drop: 0.02})
	// Loss is judged lost_after (4s here) after sending.
	testwait.For(t, 30*time.Second, "a degraded verdict for completeness", verdict(VerdictDegraded, "completeness"))
	look("degraded", VerdictDegraded, "completeness", [3]int{0xbc, 0x4c, 0x00})

	stopTarget()
	testwait.For(t, 20*time.Second, "a down verdict", verdict(VerdictDown, "target unreachable for"))
	look("down", VerdictDown, "connection refused", [3]int{0xcf, 0x22, 0x2e})
}
