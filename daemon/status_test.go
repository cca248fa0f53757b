package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/report"
)

// fakeStatus is a statusSource that returns a fixed Status.
type fakeStatus struct{ st Status }

func (f *fakeStatus) Status() Status { return f.st }

var statusEpoch = time.Date(2026, 11, 30, 3, 15, 0, 0, time.UTC)

func ptr(v float64) *float64 { return &v }

func testStatus() Status {
	return Status{
		Target:     "staging",
		Protocol:   "embedded",
		URL:        "wss://canary:hunter2@im.example.com:8443/ws?token=s3cret#frag",
		Run:        "3f9a1c2b",
		Started:    statusEpoch.Add(-time.Hour),
		Population: PopulationStatus{Configured: 100, Sessions: 100, Online: 98, Ready: true},
		Canary:     CanaryStatus{Schedule: "@every 1m", Enabled: true},
		Soak: SoakStatus{Profiles: []string{"smoke", "peak"}, Running: "peak", Schedules: []ProfileSchedule{
			{Profile: "smoke", Schedule: "@hourly", Next: statusEpoch.Add(45 * time.Minute)},
			{Profile: "peak"},
		}},
		SLIs: []SLI{
			newSLI("background", "direct", 1010, 995, 3, 2, 990),
			newSLI("canary", "group", 0, 0, 0, 0, 0),
		},
		Verdict: Verdict{State: VerdictDegraded, Cause: "98 of 100 sessions online",
			Causes: []string{"98 of 100 sessions online", "background direct completeness 99.5% over the last 5m0s (objective 99.9%)"}},
		Recent: RecentStatus{Window: 5 * time.Minute, Objective: 0.999, LostAfter: 30 * time.Second, Connects: 12,
			Failures: map[string]float64{"timeout": 2},
			SLIs: []WindowSLI{{Source: "background", Kind: "direct", Expected: 200, Delivered: 199, Lost: 1,
				Completeness: ptr(0.995), Latency: ptr(1), P99: ptr(0.042)}}},
	}
}

// statusFixture is a status handler over a real store holding runs soak
// runs and rounds canary rounds, served by an httptest server.
type statusFixture struct {
	srv   *httptest.Server
	store *history.Store
	dir   string
	ids   []string // soak run ids, oldest first
	// reports are the runs as they were saved, in the order of ids.
	reports []*report.Soak
	logs    *bytes.Buffer
}

func newStatusFixture(t *testing.T, st Status, runs, rounds int) *statusFixture {
	t.Helper()
	f := &statusFixture{dir: t.TempDir(), logs: &bytes.Buffer{}}
	var err error
	f.store, err = history.Open(f.dir, history.Options{Now: func() time.Time { return statusEpoch }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		start := statusEpoch.Add(time.Duration(i-runs) * time.Hour)
		r := &report.Soak{
			ID: report.NewRunID(start), Kind: "soak", Target: st.Target, Result: "pass",
			Profile: report.Profile{Name: "smoke", Users: 10, Duration: time.Minute},
			Start:   start, End: start.Add(10 * time.Minute),
			Deliveries: map[string]report.Deliveries{"all": {Expected: 100, Delivered: 100}},
		}
		if i == runs-1 {
			r.Result = "fail"
		}
		if err := f.store.SaveSoak(r); err != nil {
			t.Fatal(err)
		}
		f.ids = append(f.ids, r.ID)
		f.reports = append(f.reports, r)
	}
	for i := range rounds {
		c := &report.Round{
			ID: fmt.Sprint("round", i), Kind: "canary", Target: st.Target, Result: "pass",
			Start: statusEpoch.Add(time.Duration(i) * time.Minute),
			Checks: []report.Check{
				{Kind: "direct", Pass: true, Expected: 1, Delivered: 1, MaxLatency: 30 * time.Millisecond},
				{Kind: "group", Pass: true, Expected: 4, Delivered: 4, MaxLatency: 45 * time.Millisecond},
			},
		}
		if i == rounds-1 {
			c.Result = "fail"
			c.Checks[1] = report.Check{Kind: "group", Expected: 4, Delivered: 3, Reasons: []string{"not_delivered", "late"}}
		}
		if err := f.store.SaveCanary(c); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(f.logs, nil))
	f.srv = httptest.NewServer(newStatusHandler(&fakeStatus{st}, f.store, log))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *statusFixture) do(t *testing.T, method, path string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestStatusEndpoints(t *testing.T) {
	f := newStatusFixture(t, testStatus(), 3, 5)
	newest := f.ids[len(f.ids)-1]
	const (
		html = "text/html; charset=utf-8"
		js   = "application/json"
		text = "text/plain; charset=utf-8"
	)
	tests := []struct {
		method, path string
		wantCode     int
		wantType     string
		wantBody     []string // substrings
	}{
		{"GET", "/", 200, html, []string{
			"<title>imcanary: staging: degraded</title>", `<meta http-equiv="refresh" content="15">`,
			`href="runs/` + newest + `/report.html"`, `href="api/v1/runs/` + newest + `"`,
			"98 of 100 sessions online", "ready", "<code>@every 1m</code>", "<code>peak</code> <strong>(running)</strong>",
			"group: not_delivered, late", "99.9%", "—", `<td class="n">10m</td>`,
			`<section class="verdict v-degraded"`, `<div class="state" id="verdict-state">degraded</div>`,
			`<p id="verdict-cause">98 of 100 sessions online</p>`, "<li>background direct completeness 99.5% over the last 5m0s (objective 99.9%)</li>",
			`<td class="n bad">99.5%</td>`, `<td class="n good">100%</td>`, "42ms", "12 connect attempts, failed: timeout 2.",
			"<span class=\"muted\">on demand</span>", "2026-11-30 04:00:00 UTC", "<td>staging</td><td>smoke</td>",
		}},
		{"HEAD", "/", 200, html, nil},
		{"GET", "/runs/" + newest + "/report.html", 200, html, []string{"<html"}},
		{"HEAD", "/runs/" + newest + "/report.html", 200, html, nil},
		{"GET", "/runs/missing/report.html", 404, text, []string{"run not found"}},
		{"GET", "/runs/..%2F..%2Fetc/report.html", 404, text, nil},
		{"GET", "/runs/" + newest + "/other.html", 404, text, nil},
		{"GET", "/api/v1/status", 200, js, []string{`"target": "staging"`, `"completeness": null`}},
		{"GET", "/api/v1/runs", 200, js, []string{`"runs": [`, `"canary": [`}},
		{"GET", "/api/v1/runs?limit=1", 200, js, []string{newest}},
		{"GET", "/api/v1/runs?limit=1000", 200, js, nil},
		{"GET", "/api/v1/runs?limit=0", 400, js, []string{`"error"`, "limit"}},
		{"GET", "/api/v1/runs?limit=-3", 400, js, []string{`"error"`}},
		{"GET", "/api/v1/runs?limit=1001", 400, js, []string{`"error"`}},
		{"GET", "/api/v1/runs?limit=ten", 400, js, []string{`"error"`, `\"ten\"`}},
		{"GET", "/api/v1/runs/" + newest, 200, js, []string{`"id": "` + newest + `"`}},
		{"GET", "/api/v1/runs/missing", 404, js, []string{`{"error":"run not found"}`}},
		{"GET", "/api/v1/runs/a%2Fb", 404, js, []string{`"error"`}},
		{"GET", "/api/v1/runs/..", 404, js, nil},
		{"GET", "/api/v2/status", 404, js, []string{`"error"`}},
		{"GET", "/nope", 404, text, nil},
		{"POST", "/", 405, text, nil},
		{"PUT", "/nope", 405, text, nil},
		{"POST", "/api/v1/status", 405, js, []string{`"error"`}},
		{"DELETE", "/api/v1/runs/" + newest, 405, js, []string{`"error"`}},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			resp, body := f.do(t, tt.method, tt.path)
			if resp.StatusCode != tt.wantCode {
				t.Errorf("%s %s = %d, want %d; body %s", tt.method, tt.path, resp.StatusCode, tt.wantCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != tt.wantType {
				t.Errorf("%s %s Content-Type = %q, want %q", tt.method, tt.path, ct, tt.wantType)
			}
			if tt.wantCode == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s Allow = %q, want %q", tt.method, tt.path, resp.Header.Get("Allow"), "GET, HEAD")
			}
			if tt.method == "HEAD" && len(body) != 0 {
				t.Errorf("HEAD %s has a %d-byte body, want none", tt.path, len(body))
			}
			for _, s := range tt.wantBody {
				if !bytes.Contains(body, []byte(s)) {
					t.Errorf("%s %s body lacks %q:\n%s", tt.method, tt.path, s, body)
				}
			}
			if tt.wantType == js && len(body) > 0 && !json.Valid(body) {
				t.Errorf("%s %s body is not JSON: %s", tt.method, tt.path, body)
			}
		})
	}
	if f.logs.Len() != 0 {
		t.Errorf("logged without a server error:\n%s", f.logs)
	}
}

func TestStatusJSON(t *testing.T) {
	f := newStatusFixture(t, testStatus(), 22, 25)
	resp, body := f.do(t, "GET", "/api/v1/status")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /api/v1/status = %d, want 200: %s", resp.StatusCode, body)
	}
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("decoding /api/v1/status: %v\n%s", err, body)
	}
	want := testStatus()
	if st.Target != want.Target || st.Protocol != want.Protocol || st.Run != want.Run ||
		!st.Started.Equal(want.Started) || st.Population != want.Population {
		t.Errorf("status = %+v, want %+v", st, want)
	}
	if want := "wss://im.example.com:8443/ws"; st.URL != want {
		t.Errorf("status URL = %q, want %q", st.URL, want)
	}
	if got := len(st.Canary.Rounds); got != statusRecent || st.Canary.Rounds[0].ID != "round24" || st.Canary.Rounds[19].ID != "round5" {
		t.Errorf("status canary rounds = %d, first %q, want %d from round24 down", got, st.Canary.Rounds[0].ID, statusRecent)
	}
	if got := len(st.Soak.Runs); got != statusRecent || st.Soak.Runs[0].ID != f.ids[21] || st.Soak.Runs[0].Result != "fail" {
		t.Errorf("status soak runs = %d, first %+v, want %d from %s", got, st.Soak.Runs[0], statusRecent, f.ids[21])
	}
	if len(st.SLIs) != 2 || st.SLIs[0].Completeness == nil || *st.SLIs[0].Completeness != 0.995 || st.SLIs[0].InFlight != 10 ||
		*st.SLIs[0].UnderOneSecond != 990.0/995 || st.SLIs[1].Completeness != nil || st.SLIs[1].UnderOneSecond != nil {
		t.Errorf("status SLIs = %+v, want completeness 0.995 of the settled with 10 in flight, then null", st.SLIs)
	}
	for _, secret := range []string{"hunter2", "s3cret", "canary:hunter2", "frag"} {
		if bytes.Contains(body, []byte(secret)) {
			t.Errorf("/api/v1/status shows %q:\n%s", secret, body)
		}
		if _, page := f.do(t, "GET", "/"); bytes.Contains(page, []byte(secret)) {
			t.Errorf("status page shows %q", secret)
		}
	}
}

func TestStatusRunsJSON(t *testing.T) {
	f := newStatusFixture(t, testStatus(), 25, 30)
	tests := []struct {
		query      string
		runs, rnds int
	}{
		{"", statusRecent, statusRecent},
		{"?limit=3", 3, 3},
		{"?limit=26", 25, 26},
		{"?limit=1000", 25, 30},
	}
	for _, tt := range tests {
		resp, body := f.do(t, "GET", "/api/v1/runs"+tt.query)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /api/v1/runs%s = %d, want 200: %s", tt.query, resp.StatusCode, body)
		}
		var got runsResponse
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("decoding /api/v1/runs%s: %v", tt.query, err)
		}
		if len(got.Runs) != tt.runs || len(got.Canary) != tt.rnds {
			t.Errorf("GET /api/v1/runs%s = %d runs, %d rounds, want %d and %d", tt.query, len(got.Runs), len(got.Canary), tt.runs, tt.rnds)
			continue
		}
		if got.Runs[0].ID != f.ids[24] || got.Canary[0].ID != "round29" {
			t.Errorf("GET /api/v1/runs%s starts with %q and %q, want %q and round29", tt.query, got.Runs[0].ID, got.Canary[0].ID, f.ids[24])
		}
	}

	resp, body := f.do(t, "GET", "/api/v1/runs/"+f.ids[3])
	if resp.StatusCode != 200 {
		t.Fatalf("GET /api/v1/runs/%s = %d, want 200: %s", f.ids[3], resp.StatusCode, body)
	}
	rep, err := report.ReadJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("GET /api/v1/runs/%s: report.ReadJSON = %v", f.ids[3], err)
	}
	if rep.ID != f.ids[3] || rep.Profile.Name != "smoke" {
		t.Errorf("GET /api/v1/runs/%s = report %q profile %q, want %q profile smoke", f.ids[3], rep.ID, rep.Profile.Name, f.ids[3])
	}
	// The page is the one WriteHTML writes for the run as it was saved,
	// which is what the history stored as its page before it kept the
	// JSON only.
	var page bytes.Buffer
	if err := report.WriteHTML(&page, f.reports[3]); err != nil {
		t.Fatal(err)
	}
	if _, body := f.do(t, "GET", "/runs/"+f.ids[3]+"/report.html"); !bytes.Equal(body, page.Bytes()) {
		t.Errorf("GET /runs/%s/report.html differs from WriteHTML of the run saved", f.ids[3])
	}
}

// TestStatusPreviousReleasePages serves the history of a data_dir that
// the previous release wrote, report pages included (history's fixture,
// made by that release's own store): every run's page, rendered from its
// JSON now, is byte for byte the page that release stored beside it.
func TestStatusPreviousReleasePages(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("..", "history", "testdata", "datadir-a58460c"))); err != nil {
		t.Fatal(err)
	}
	store, err := history.Open(dir, history.Options{Now: func() time.Time { return statusEpoch }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newStatusHandler(&fakeStatus{testStatus()}, store, nil))
	t.Cleanup(srv.Close)
	pages, err := filepath.Glob(filepath.Join(dir, "runs", "*.html"))
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, path := range pages {
		id := strings.TrimSuffix(filepath.Base(path), ".html")
		if _, err := os.Stat(filepath.Join(dir, "runs", id+".json")); err != nil {
			continue // a page without its run: nothing to serve
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want = []byte(strings.NewReplacer(report.PageChanges...).Replace(string(want)))
		resp, err := srv.Client().Get(srv.URL + "/runs/" + id + "/report.html")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
			t.Errorf("GET /runs/%s/report.html = %d, %d bytes; want 200 and the %d bytes the previous release stored, with report.PageChanges made", id, resp.StatusCode, len(got), len(want))
		}
		served++
	}
	if served < 4 {
		t.Errorf("served %d pages of the previous release, want its 4", served)
	}
}

func TestStatusPageEscapes(t *testing.T) {
	st := testStatus()
	st.Target = `<script>alert("t")</script>`
	st.Protocol = `"><img src=x>`
	st.Soak.Profiles = []string{"<b>p</b>"}
	st.Soak.Running = "<b>p</b>"
	st.SLIs = []SLI{newSLI("<i>src</i>", "direct", 1, 1, 0, 0, 1)}
	f := newStatusFixture(t, st, 1, 1)
	_, body := f.do(t, "GET", "/")
	for _, raw := range []string{"<script>", "<img", "<b>", "<i>"} {
		if bytes.Contains(body, []byte(raw)) {
			t.Errorf("status page contains %q unescaped", raw)
		}
	}
	for _, esc := range []string{"&lt;script&gt;", "&lt;img src=x&gt;", "&lt;b&gt;p&lt;/b&gt;", "&lt;i&gt;src&lt;/i&gt;"} {
		if !bytes.Contains(body, []byte(esc)) {
			t.Errorf("status page lacks %q", esc)
		}
	}
	// No script and nothing loaded from elsewhere.
	for _, s := range []string{"<script", "http://", "https://", "<link", "@import", "url("} {
		if bytes.Contains(body, []byte(s)) {
			t.Errorf("status page contains %q", s)
		}
	}
}

// TestStatusReadiness: /readyz tells whether imcanary has ramped, not
// whether the target is up, and the page must not read as if all were
// well while every session is down.
func TestStatusReadiness(t *testing.T) {
	tests := []struct {
		name          string
		ready         bool
		online        int
		want, notWant string
	}{
		{"ramping", false, 40, "not ready yet (/readyz answers 503)", "answers 200"},
		{"whole", true, 100, "imcanary ready (every user has logged in once; /readyz answers 200)", "not that the target is"},
		{"target down", true, 0, "/readyz still answers 200: it says imcanary itself is ready (every user has logged in once), not that the target is", "imcanary ready ("},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := testStatus()
			st.Population.Ready, st.Population.Online = tt.ready, tt.online
			f := newStatusFixture(t, st, 0, 0)
			_, body := f.do(t, "GET", "/")
			if !bytes.Contains(body, []byte(tt.want)) || bytes.Contains(body, []byte(tt.notWant)) {
				t.Errorf("with %d of 100 online, ready %v, the page's population line is %q; want %q and not %q",
					tt.online, tt.ready, population(body), tt.want, tt.notWant)
			}
		})
	}
}

// population returns the page's population line.
func population(body []byte) string {
	_, after, _ := bytes.Cut(body, []byte("<dt>Population</dt>"))
	line, _, _ := bytes.Cut(after, []byte("</dd>"))
	return string(line)
}

func TestStatusServerError(t *testing.T) {
	f := newStatusFixture(t, testStatus(), 1, 1)
	// A history that can no longer be read.
	if err := os.RemoveAll(filepath.Join(f.dir, "runs")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, wantType string
	}{
		{"/", "text/plain; charset=utf-8"},
		{"/api/v1/status", "application/json"},
		{"/api/v1/runs", "application/json"},
	}
	for _, tt := range tests {
		f.logs.Reset()
		resp, body := f.do(t, "GET", tt.path)
		if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != tt.wantType {
			t.Errorf("GET %s = %d %q, want 500 %q", tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), tt.wantType)
		}
		if tt.wantType == "application/json" {
			var e struct{ Error string }
			if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
				t.Errorf("GET %s body = %s, want {\"error\": …}", tt.path, body)
			}
		}
		if n := strings.Count(f.logs.String(), "err="); n != 1 {
			t.Errorf("GET %s logged %d errors, want 1:\n%s", tt.path, n, f.logs)
		}
	}
}

func TestStatusWithoutStore(t *testing.T) {
	st := testStatus()
	st.Canary.Rounds = make([]report.Round, 30)
	srv := httptest.NewServer(newStatusHandler(&fakeStatus{st}, nil, nil))
	defer srv.Close()
	tests := []struct {
		path     string
		wantCode int
		wantBody string
	}{
		{"/", 200, "No soak runs yet."},
		{"/api/v1/runs", 200, `"runs": []`},
		{"/api/v1/runs/x", 404, `"error"`},
		{"/runs/x/report.html", 404, "run not found"},
	}
	for _, tt := range tests {
		resp, err := srv.Client().Get(srv.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.wantCode || !bytes.Contains(body, []byte(tt.wantBody)) {
			t.Errorf("GET %s = %d %s, want %d with %q", tt.path, resp.StatusCode, body, tt.wantCode, tt.wantBody)
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/api/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got Status
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Canary.Rounds) != statusRecent || got.Soak.Runs == nil {
		t.Errorf("status without a store: %d rounds, runs %v, want %d rounds and an empty list", len(got.Canary.Rounds), got.Soak.Runs, statusRecent)
	}
}

func TestNewSLI(t *testing.T) {
	tests := []struct {
		expected, delivered, recovered, lost, fast float64
		completeness, under                        *float64
		inFlight                                   float64
	}{
		{0, 0, 0, 0, 0, nil, nil, 0},
		// Nothing settled yet: in flight, not 0%.
		{10, 0, 0, 0, 0, nil, nil, 10},
		{10, 5, 0, 5, 5, ptr(0.5), ptr(1), 0},
		{4, 4, 0, 0, 1, ptr(1), ptr(0.25), 0},
		// A healthy run's messages on their way are not missing.
		{1000, 992, 0, 0, 992, ptr(1), ptr(1), 8},
		{1000, 990, 5, 5, 990, ptr(0.99), ptr(1), 0},
		// Counters read a moment apart.
		{4, 5, 0, 0, 6, ptr(1), ptr(1), 0},
	}
	eq := func(a, b *float64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
	str := func(p *float64) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	for _, tt := range tests {
		s := newSLI("background", "direct", tt.expected, tt.delivered, tt.recovered, tt.lost, tt.fast)
		if !eq(s.Completeness, tt.completeness) || !eq(s.UnderOneSecond, tt.under) || s.InFlight != tt.inFlight {
			t.Errorf("newSLI(%+v) = completeness %s, under 1s %s, in flight %v, want %s, %s and %v", tt,
				str(s.Completeness), str(s.UnderOneSecond), s.InFlight, str(tt.completeness), str(tt.under), tt.inFlight)
		}
	}
}

func TestPageLength(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{1500 * time.Millisecond, "2s"},
		{10 * time.Minute, "10m"},
		{time.Hour, "1h"},
		{time.Hour + 30*time.Second, "1h0m30s"},
		{-time.Second, "—"},
	}
	for _, tt := range tests {
		if got := pageLength(statusEpoch, statusEpoch.Add(tt.d)); got != tt.want {
			t.Errorf("pageLength(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
	if got := pageLength(time.Time{}, statusEpoch); got != "—" {
		t.Errorf("pageLength(zero start) = %q, want —", got)
	}
}

func TestPagePercent(t *testing.T) {
	ratio := []struct {
		in   *float64
		want string
	}{
		{nil, "—"},
		{ptr(0), "0%"},
		{ptr(1), "100%"},
		{ptr(0.5), "50%"},
		{ptr(0.995), "99.5%"},
		{ptr(0.99995), "99.995%"},
		{ptr(0.9999996), "99.999%"},
		{ptr(0.123456), "12.345%"},
	}
	for _, tt := range ratio {
		if got := pageRatio(tt.in); got != tt.want {
			t.Errorf("pageRatio(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
	loss := []struct {
		in   float64
		want string
	}{
		{0, "0%"},
		{0.001, "0.1%"},
		{0.000001, "0.001%"},
		{0.0123, "1.23%"},
		{1, "100%"},
	}
	for _, tt := range loss {
		if got := pageLoss(tt.in); got != tt.want {
			t.Errorf("pageLoss(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
