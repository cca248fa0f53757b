//go:build unix

package report

// The HTML report opened in a real browser (see internal/browser).

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/internal/browser"
)

func TestReportInBrowser(t *testing.T) {
	bin := browser.Find(t)
	ctx, cancel := context.WithTimeout(t.Context(), browser.Budget)
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
		run := browser.Open(ctx, t, bin, page, "--dump-dom")
		dom := string(run.Stdout)
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
		browser.Check(t, run)
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
		run := browser.Open(ctx, t, bin, drill, "--dump-dom")
		dom := string(run.Stdout)
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
		browser.Check(t, run)
	})

	t.Run("screenshot", func(t *testing.T) {
		shot := filepath.Join(t.TempDir(), "report.png")
		run := browser.Open(ctx, t, bin, page, "--screenshot="+shot, "--window-size=1280,2400")
		browser.Check(t, run)
		f, err := os.Open(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v; stderr:\n%s", err, browser.Tail(run.Stderr, 20))
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("decode screenshot: %v", err)
		}
		if w := img.Bounds().Dx(); w != 1280 {
			t.Errorf("screenshot width = %d, want 1280", w)
		}
		if n := browser.Colours(img); n < 8 {
			t.Errorf("screenshot has %d distinct colours in its samples, want a rendered page (≥ 8)", n)
		}
		// The FAIL badge is red: the style sheet was applied.
		if !browser.HasColour(img, image.Rect(0, 0, img.Bounds().Dx(), 300), 0xcf, 0x22, 0x2e) {
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
		run := browser.Open(ctx, t, bin, bad, "--dump-dom")
		problems, _ := run.Problems()
		joined := strings.Join(problems, "\n")
		for _, want := range []string{"Uncaught", "boom", "fonts.example.invalid", "127.0.0.1:9"} {
			if !strings.Contains(joined, want) {
				t.Errorf("problems found in a bad page lack %q; found:\n%s", want, joined)
			}
		}
	})
}
