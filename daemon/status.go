package daemon

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/report"
)

// Status is the state of the daemon as the status page and
// GET /api/v1/status show it. Its JSON field names are an interface: add
// fields, never rename or remove one.
type Status struct {
	Target   string `json:"target"`
	Protocol string `json:"protocol"`
	// URL is the target's URL without userinfo, query or fragment: the
	// page is unauthenticated and must never show a credential.
	URL        string           `json:"url"`
	Run        string           `json:"run"`
	Started    time.Time        `json:"started"`
	Population PopulationStatus `json:"population"`
	Canary     CanaryStatus     `json:"canary"`
	Soak       SoakStatus       `json:"soak"`
	SLIs       []SLI            `json:"slis"`
	// Verdict is the page's answer: healthy, degraded, down, saturated
	// or starting, and why.
	Verdict      Verdict          `json:"verdict"`
	Reachability ReachStatus      `json:"reachability"`
	Recent       RecentStatus     `json:"recent"`
	Saturation   SaturationStatus `json:"saturation"`
	// trend is the last hour's readings, for the page's charts.
	trend []trendPoint
}

// PopulationStatus is the background population's size and readiness.
type PopulationStatus struct {
	// Configured is the users; Sessions the sessions they keep online,
	// each user's devices; Online counts sessions.
	Configured int  `json:"configured"`
	Sessions   int  `json:"sessions"`
	Online     int  `json:"online"`
	Ready      bool `json:"ready"`
}

// CanaryStatus is the canary's schedule and its last rounds, newest first.
type CanaryStatus struct {
	Schedule string         `json:"schedule"`
	Enabled  bool           `json:"enabled"`
	Rounds   []report.Round `json:"rounds"`
	// Next is when the next round is due by the schedule (it starts up
	// to Jitter later); zero when the canary is off.
	Next   time.Time     `json:"next"`
	Jitter time.Duration `json:"jitter_ns"`
}

// SoakStatus is the configured soak profiles, the one running ("" when
// none is) and the last runs, newest first.
type SoakStatus struct {
	Profiles []string            `json:"profiles"`
	Running  string              `json:"running"`
	Runs     []report.RunSummary `json:"runs"`
	// Searches are the last searches for the server's limit, newest
	// first.
	Searches []report.SearchSummary `json:"searches"`
	// Schedules are the profiles' schedules and when each is next due,
	// in the order of Profiles.
	Schedules []ProfileSchedule `json:"schedules"`
}

// ProfileSchedule is one soak profile's schedule: Schedule empty (and
// Next zero) for a profile run only on demand.
type ProfileSchedule struct {
	Profile  string    `json:"profile"`
	Schedule string    `json:"schedule"`
	Next     time.Time `json:"next"`
}

// SLI is the delivery record of one source (background, canary, soak) and
// message kind since the daemon started.
type SLI struct {
	Source    string  `json:"source"`
	Kind      string  `json:"kind"`
	Expected  float64 `json:"expected"`
	Delivered float64 `json:"delivered"`
	Recovered float64 `json:"recovered"`
	Lost      float64 `json:"lost"`
	// InFlight is what is owed but neither delivered, recovered nor lost
	// yet: sent within lost_after, most of it on its way.
	InFlight float64 `json:"in_flight"`
	// Completeness is Delivered per settled delivery (delivered,
	// recovered or lost), null while none is settled: no data is not the
	// same as 0% or 100%. Per Expected, a healthy run read 99.2% on its
	// first page, the messages still in flight.
	Completeness *float64 `json:"completeness"`
	// UnderOneSecond is the fraction of deliveries that took at most a
	// second, null while nothing was delivered.
	UnderOneSecond *float64 `json:"under_one_second"`
}

// newSLI computes an SLI from counts: fast is how many of the delivered
// messages arrived within a second.
func newSLI(source, kind string, expected, delivered, recovered, lost, fast float64) SLI {
	s := SLI{Source: source, Kind: kind, Expected: expected, Delivered: delivered, Recovered: recovered, Lost: lost,
		// Counters are read one after another, so a delivery counted
		// after its expectation was read can make this negative.
		InFlight: max(0, expected-delivered-recovered-lost)}
	if settled := delivered + recovered + lost; settled > 0 {
		c := delivered / settled
		s.Completeness = &c
	}
	if delivered > 0 {
		f := min(fast/delivered, 1)
		s.UnderOneSecond = &f
	}
	return s
}

// statusSource is what the status handler asks for the live state on each
// request. Status must be safe to call from many goroutines.
type statusSource interface {
	Status() Status
}

const (
	// statusRecent is how many canary rounds and soak runs the status
	// shows: a screenful.
	statusRecent = 20
	// maxRunsLimit caps GET /api/v1/runs?limit=N, bounding the work one
	// request can ask for.
	maxRunsLimit = 1000
	// pageCSP allows the pages nothing but their own inline styles: they
	// load no script, font, image or style sheet.
	pageCSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
)

// statusHandler serves the status page, the stored reports and the JSON
// API.
type statusHandler struct {
	src   statusSource
	store *history.Store
	log   *slog.Logger
	mux   *http.ServeMux
}

// newStatusHandler serves:
//
//	GET /                          the status page
//	GET /runs/{id}/report.html     a soak run's report page
//	GET /api/v1/status             Status as JSON
//	GET /api/v1/runs?limit=N       {"runs": [...], "canary": [...]}
//	GET /api/v1/runs/{id}          a soak run's report as JSON
//	GET /searches/{id}/report.html a search's report page
//	GET /api/v1/searches/{id}      a search's report as JSON
//
// and answers 405 to any method but GET and HEAD. store may be nil when
// the daemon keeps no history; the canary rounds and soak runs in Status
// come from store when it is not. Server errors are logged to log.
func newStatusHandler(src statusSource, store *history.Store, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &statusHandler{src: src, store: store, log: log, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.page)
	h.mux.HandleFunc("GET /runs/{id}/report.html", h.reportPage)
	h.mux.HandleFunc("GET /api/v1/status", h.apiStatus)
	h.mux.HandleFunc("GET /api/v1/runs", h.apiRuns)
	h.mux.HandleFunc("GET /api/v1/runs/{id}", h.apiRun)
	h.mux.HandleFunc("GET /searches/{id}/report.html", h.searchPage)
	h.mux.HandleFunc("GET /api/v1/searches/{id}", h.apiSearch)
	// Anything else under /api/ is answered in JSON too, for clients that
	// parse every answer.
	h.mux.HandleFunc("GET /api/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, "no such endpoint")
	})
	return h
}

func (h *statusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Checked here rather than left to the mux so that every path,
	// unknown ones included, answers 405 alike, in JSON under /api/.
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		if isAPI(r) {
			writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		} else {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
		return
	}
	h.mux.ServeHTTP(w, r)
}

func isAPI(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/api/") }

// status is the source's status with the URL stripped and the history
// filled in from the store.
func (h *statusHandler) status() (Status, error) {
	st := h.src.Status()
	st.URL = probe.RedactURL(st.URL)
	if h.store != nil {
		rounds, err := h.store.CanaryRounds(statusRecent)
		if err != nil {
			return st, err
		}
		runs, err := h.store.Runs(statusRecent)
		if err != nil {
			return st, err
		}
		searches, err := h.store.Searches(statusRecent)
		if err != nil {
			return st, err
		}
		st.Canary.Rounds, st.Soak.Runs, st.Soak.Searches = rounds, runs, searches
	}
	// Empty lists, not null, so that clients need not tell them apart.
	st.Canary.Rounds = nonNil(truncate(st.Canary.Rounds, statusRecent))
	st.Soak.Runs = nonNil(truncate(st.Soak.Runs, statusRecent))
	st.Soak.Searches = nonNil(truncate(st.Soak.Searches, statusRecent))
	st.Soak.Profiles = nonNil(st.Soak.Profiles)
	st.SLIs = nonNil(st.SLIs)
	return st, nil
}

func truncate[T any](s []T, n int) []T { return s[:min(len(s), n)] }

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (h *statusHandler) page(w http.ResponseWriter, r *http.Request) {
	st, err := h.status()
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	// Rendered to a buffer first, so that a template error is a clean 500
	// rather than half a page.
	var buf bytes.Buffer
	now := time.Now()
	charts, err := statusCharts(st, now)
	if err != nil {
		h.serverError(w, r, fmt.Errorf("status page charts: %w", err))
		return
	}
	if err := statusPage.Execute(&buf, statusPageData{Status: st, Now: now, Charts: charts}); err != nil {
		h.serverError(w, r, fmt.Errorf("status page: %w", err))
		return
	}
	writeHTML(w, buf.Bytes())
}

// reportPage renders a soak run's page from its stored report on each
// request: the history keeps the JSON only, and the page is the one
// `imcanary soak --html` writes for the same run.
func (h *statusHandler) reportPage(w http.ResponseWriter, r *http.Request) {
	serveStored(h, w, r, (*history.Store).Soak, report.WriteHTML, false)
}

// searchPage renders a search's page from its stored report, as
// reportPage does a soak run's.
func (h *statusHandler) searchPage(w http.ResponseWriter, r *http.Request) {
	serveStored(h, w, r, (*history.Store).Search, report.WriteSearchHTML, false)
}

// apiSearch serves a search's report as `imcanary soak --json` writes it.
func (h *statusHandler) apiSearch(w http.ResponseWriter, r *http.Request) {
	serveStored(h, w, r, (*history.Store).Search, report.WriteSearchJSON, true)
}

// serveStored answers with the report of the request's id that load finds
// in the history, as write renders it: a page, or JSON for the API. A
// report not there is a 404 (in JSON under /api/), one that cannot be read
// or rendered a 500. Rendered to a buffer first, so that an error is a
// clean 500 rather than half an answer.
func serveStored[T any](h *statusHandler, w http.ResponseWriter, r *http.Request, load func(*history.Store, string) (T, error), write func(io.Writer, T) error, api bool) {
	notFound := func(msg string) {
		if api {
			writeJSONError(w, http.StatusNotFound, msg)
		} else {
			http.Error(w, msg, http.StatusNotFound)
		}
	}
	if h.store == nil {
		notFound(history.ErrNotFound.Error())
		return
	}
	rep, err := load(h.store, r.PathValue("id"))
	if errors.Is(err, history.ErrNotFound) {
		notFound(err.Error())
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := write(&buf, rep); err != nil {
		h.serverError(w, r, fmt.Errorf("%s: %w", r.URL.Path, err))
		return
	}
	if api {
		setJSONHeaders(w)
		w.Write(buf.Bytes())
		return
	}
	writeHTML(w, buf.Bytes())
}

func (h *statusHandler) apiStatus(w http.ResponseWriter, r *http.Request) {
	st, err := h.status()
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	h.writeJSON(w, r, st)
}

// runsResponse is the answer to GET /api/v1/runs.
type runsResponse struct {
	Runs   []report.RunSummary `json:"runs"`
	Canary []report.Round      `json:"canary"`
}

func (h *statusHandler) apiRuns(w http.ResponseWriter, r *http.Request) {
	limit := statusRecent
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > maxRunsLimit {
			writeJSONError(w, http.StatusBadRequest,
				fmt.Sprintf("limit: %q: want a whole number from 1 to %d", q, maxRunsLimit))
			return
		}
		limit = n
	}
	resp := runsResponse{Runs: []report.RunSummary{}, Canary: []report.Round{}}
	if h.store != nil {
		var err error
		if resp.Runs, err = h.store.Runs(limit); err != nil {
			h.serverError(w, r, err)
			return
		}
		if resp.Canary, err = h.store.CanaryRounds(limit); err != nil {
			h.serverError(w, r, err)
			return
		}
	}
	h.writeJSON(w, r, resp)
}

// apiRun serves a soak run's report exactly as `imcanary soak` writes it.
func (h *statusHandler) apiRun(w http.ResponseWriter, r *http.Request) {
	serveStored(h, w, r, (*history.Store).Soak, report.WriteJSON, true)
}

// serverError logs err, the one place it is logged, and answers 500 with
// it: the page is for the operators who would otherwise read the log.
func (h *statusHandler) serverError(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Error("status request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	if isAPI(r) {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func (h *statusHandler) writeJSON(w http.ResponseWriter, r *http.Request, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	setJSONHeaders(w)
	w.Write(append(b, '\n'))
}

func setJSONHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	setJSONHeaders(w)
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeHTML(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", pageCSP)
	w.Write(b)
}

// statusPageData is what the status page template renders.
type statusPageData struct {
	Status
	Now time.Time
	// Charts are the last hour's completeness and latency, as inline SVG.
	Charts []template.HTML
}

// statusPage is the status page: inline styles, no script, no external
// URL, and relative links so that it works behind a proxy under a path
// prefix. It refreshes itself every 15 seconds.
var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"time":    pageTime,
	"ratio":   pageRatio,
	"loss":    pageLoss,
	"latency": pageLatency,
	"slowest": slowest,
	"count":   count,
	"length":  pageLength,
	"class":   resultClass,
	// value is a search's knee or first failing value, "-" for none.
	"value": func(v float64) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	},
	"reasons":   canaryReasons,
	"join":      func(s []string) string { return strings.Join(s, ", ") },
	"objective": func(v float64) string { return percent(v) },
	// judged colours a ratio against the objective: "good" at or above
	// it, "bad" below, nothing when there is no figure.
	"judged": func(v *float64, objective float64) string {
		switch {
		case v == nil:
			return ""
		case *v < objective:
			return "bad"
		}
		return "good"
	},
	"span": ago,
	"seconds": func(v *float64) string {
		if v == nil {
			return "—"
		}
		return pageLatency(time.Duration(*v * float64(time.Second)))
	},
	"failures": func(m map[string]float64) string {
		s, _ := strings.CutSuffix(failureSummary(m), ")")
		if _, rest, ok := strings.Cut(s, "("); ok {
			return rest
		}
		return s
	},
}).Parse(statusPageHTML))

// statusPageHTML is the status page: an html/template, its style inline.
//
//go:embed status.html
var statusPageHTML string

// pageTime prints an instant in UTC to the second, "—" when unset.
func pageTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// pageRatio prints a ratio such as completeness as a percentage to three
// decimals, rounded down so that 99.9996% never reads as 100%; "—" when
// unknown.
func pageRatio(v *float64) string {
	if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
		return "—"
	}
	if *v <= 0 {
		return "0%"
	}
	// The nudge keeps a ratio that is exactly representable in decimal
	// (0.995) from flooring a step down through binary rounding.
	return pagePercent(math.Floor(*v*1e5+1e-6) / 1e3)
}

// pageLoss prints a loss ratio as a percentage to three decimals, rounded
// up so that a message lost in a million never reads as 0%.
func pageLoss(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	if v <= 0 {
		return "0%"
	}
	return pagePercent(math.Ceil(v*1e5-1e-6) / 1e3)
}

func pagePercent(p float64) string {
	s := strconv.FormatFloat(p, 'f', 3, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "%"
}

// pageLength prints how long a run took to the second, without the zero
// tails of time.Duration.String ("10m", not "10m0s"); "—" for a run that
// never wrote its end.
func pageLength(start, end time.Time) string {
	if start.IsZero() || end.Before(start) {
		return "—"
	}
	s := end.Sub(start).Round(time.Second).String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

// pageLatency prints a latency to the millisecond, "—" when there is
// none (nothing was delivered).
func pageLatency(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	if d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// slowest is the slowest delivery of a canary round.
func slowest(c report.Round) time.Duration {
	var d time.Duration
	for _, ch := range c.Checks {
		d = max(d, ch.MaxLatency)
	}
	return d
}

// resultClass maps a result to a style; results come from files on disk,
// so only known ones get a class.
func resultClass(result string) string {
	switch result {
	case "pass", "found", "no_limit":
		return "pass"
	case "fail", "aborted", "below_start":
		return "fail"
	case "inconclusive":
		// Neither: the prober was saturated when a threshold was missed.
		return "inconclusive"
	}
	return ""
}

// canaryReasons lists why a round's checks failed: "direct: late, no_ack;
// group: not_delivered".
func canaryReasons(c report.Round) string {
	var parts []string
	for _, ch := range c.Checks {
		if len(ch.Reasons) > 0 {
			parts = append(parts, ch.Kind+": "+strings.Join(ch.Reasons, ", "))
		} else if !ch.Pass {
			parts = append(parts, ch.Kind+": failed")
		}
	}
	return strings.Join(parts, "; ")
}
