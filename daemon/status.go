package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
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
		st.Canary.Rounds, st.Soak.Runs = rounds, runs
	}
	// Empty lists, not null, so that clients need not tell them apart.
	st.Canary.Rounds = nonNil(truncate(st.Canary.Rounds, statusRecent))
	st.Soak.Runs = nonNil(truncate(st.Soak.Runs, statusRecent))
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
	if h.store == nil {
		http.Error(w, history.ErrNotFound.Error(), http.StatusNotFound)
		return
	}
	rep, err := h.store.Soak(r.PathValue("id"))
	if errors.Is(err, history.ErrNotFound) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	// Rendered to a buffer first, so that an error is a clean 500 rather
	// than half a page.
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rep); err != nil {
		h.serverError(w, r, fmt.Errorf("report page of run %s: %w", rep.ID, err))
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

func (h *statusHandler) apiRun(w http.ResponseWriter, r *http.Request) {
	if h.store == nil {
		writeJSONError(w, http.StatusNotFound, history.ErrNotFound.Error())
		return
	}
	rep, err := h.store.Soak(r.PathValue("id"))
	if errors.Is(err, history.ErrNotFound) {
		writeJSONError(w, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	// report.WriteJSON, so that the API serves a report exactly as
	// `imcanary soak` writes it.
	var buf bytes.Buffer
	if err := report.WriteJSON(&buf, rep); err != nil {
		h.serverError(w, r, err)
		return
	}
	setJSONHeaders(w)
	w.Write(buf.Bytes())
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
	"time":      pageTime,
	"ratio":     pageRatio,
	"loss":      pageLoss,
	"latency":   pageLatency,
	"slowest":   slowest,
	"count":     count,
	"length":    pageLength,
	"class":     resultClass,
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

const statusPageHTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="15">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>imcanary: {{.Target}}: {{.Verdict.State}}</title>
<style>
:root{color-scheme:light dark}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:75em;padding:0 1em}
h1{font-size:1.4em;margin:0 0 .2em}
h2{font-size:1.1em;margin:1.8em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #8884}
table{border-collapse:collapse;width:100%}
th,td{padding:.25em .6em;text-align:left;border-bottom:1px solid #8883;vertical-align:top}
th{font-weight:600}
.n{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#1a7f37;font-weight:600}
.fail{color:#cf222e;font-weight:600}
.inconclusive{color:#8250df;font-weight:600}
.muted{color:#888}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em;margin:.8em 0}
dt{color:#888}
dd{margin:0}
code{font:13px ui-monospace,SFMono-Regular,Menlo,monospace}
.verdict{border-radius:6px;padding:.8em 1em;margin:.8em 0 1em;border:1px solid;border-left-width:8px}
.verdict .state{font-size:1.5em;font-weight:700;text-transform:uppercase;letter-spacing:.04em}
.verdict p{margin:.3em 0 0;font-size:1.05em}
.verdict ul{margin:.4em 0 0;padding-left:1.3em}
.v-healthy{border-color:#1a7f37;background:#1a7f3714}.v-healthy .state{color:#1a7f37}
.v-degraded{border-color:#bc4c00;background:#bc4c0014}.v-degraded .state{color:#bc4c00}
.v-down{border-color:#cf222e;background:#cf222e14}.v-down .state{color:#cf222e}
.v-saturated{border-color:#8250df;background:#8250df14}.v-saturated .state{color:#8250df}
.v-starting{border-color:#6e7781;background:#6e778114}.v-starting .state{color:#6e7781}
.good{color:#1a7f37}
.bad{color:#cf222e;font-weight:600}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));gap:1em;margin-top:1em}
figure{margin:0;border:1px solid #8884;border-radius:6px;padding:8px 8px 2px}
figcaption{font-weight:600;margin:0 0 2px 4px}
svg{display:block;width:100%;height:auto}
svg text{font-size:11px;fill:#6e7781}
svg .legend text{font-size:12px;fill:currentColor}
svg .ref text{font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg .empty{font-size:16px}
</style>
</head>
<body>
<h1>imcanary: {{.Target}}</h1>
<p class="muted">At {{time .Now}}; refreshes every 15 seconds. JSON: <a href="api/v1/status">status</a>, <a href="api/v1/runs">runs</a>; <a href="metrics">metrics</a>.</p>
<section class="verdict v-{{.Verdict.State}}" id="verdict" aria-label="verdict">
<div class="state" id="verdict-state">{{.Verdict.State}}</div>
<p id="verdict-cause">{{.Verdict.Cause}}</p>
{{if gt (len .Verdict.Causes) 1}}<ul>{{range $i, $c := .Verdict.Causes}}{{if $i}}<li>{{$c}}</li>{{end}}{{end}}</ul>{{end}}
</section>
<dl>
<dt>Target</dt><dd>{{.Target}} ({{.Protocol}})</dd>
<dt>URL</dt><dd>{{with .URL}}<code>{{.}}</code>{{else}}—{{end}}</dd>
<dt>Reachable</dt><dd>{{with .Reachability}}{{if not .Known}}<span class="muted">not yet known: no connect attempt has ended</span>{{else if .Reachable}}<span class="good">yes</span>, since {{time .Since}}{{if not .LastFailure.IsZero}}<span class="muted">; last failure {{time .LastFailure}}: {{.Cause}}</span>{{end}}{{else}}<span class="bad">no</span>, since {{time .Since}}: {{.Cause}}{{end}}{{end}}</dd>
<dt>Population</dt><dd><span class="{{if lt .Population.Online .Population.Sessions}}bad{{else}}good{{end}}">{{.Population.Online}} of {{.Population.Sessions}} sessions online</span>
<span class="muted">— {{if not .Population.Ready}}imcanary not ready yet (/readyz answers 503){{else if lt .Population.Online .Population.Sessions}}/readyz still answers 200: it says imcanary itself is ready (every user has logged in once), not that the target is{{else}}imcanary ready (every user has logged in once; /readyz answers 200){{end}}</span></dd>
<dt>Prober</dt><dd>{{if .Saturation.Saturated}}<span class="bad">saturated</span> since {{time .Saturation.Since}}: {{join .Saturation.Causes}}{{else}}<span class="good">not saturated</span>{{end}}</dd>
<dt>Run</dt><dd><code>{{.Run}}</code>, started {{time .Started}}</dd>
</dl>

<h2>Last {{span .Recent.Window}}</h2>
<p class="muted">Judged as the alert rules judge: real-time completeness counts a delivery lost, late or recovered by catch-up as bad, eventual completeness only one lost, latency one over 1s; objective {{objective .Recent.Objective}}. Loss is judged {{span .Recent.LostAfter}} after sending, so the losses of the last {{span .Recent.LostAfter}} are not counted yet.</p>
{{if .Recent.SLIs}}<table id="recent">
<thead><tr><th>source</th><th>kind</th><th class="n">owed</th><th class="n">delivered</th><th class="n">recovered</th><th class="n">lost</th><th class="n">late</th><th class="n">duplicate</th><th class="n">reordered</th><th class="n">real-time</th><th class="n">eventual</th><th class="n">within 1s</th><th class="n">p99</th></tr></thead>
<tbody>
{{range .Recent.SLIs}}<tr><td>{{.Source}}</td><td>{{.Kind}}</td><td class="n">{{count .Expected}}</td><td class="n">{{count .Delivered}}</td><td class="n">{{count .Recovered}}</td><td class="n">{{count .Lost}}</td><td class="n">{{count .Late}}</td><td class="n">{{count .Duplicate}}</td><td class="n">{{count .Reordered}}</td><td class="n {{judged .Completeness $.Recent.Objective}}">{{ratio .Completeness}}</td><td class="n {{judged .Eventual $.Recent.Objective}}">{{ratio .Eventual}}</td><td class="n {{judged .Latency $.Recent.Objective}}">{{ratio .Latency}}</td><td class="n">{{seconds .P99}}</td></tr>
{{end}}</tbody>
</table>{{end}}
<p>{{with .Recent}}{{count .Connects}} connect attempts{{with .Failures}}, failed: {{failures .}}{{else}}, none failed{{end}}.{{end}}</p>
{{with .Charts}}<div class="charts">{{range .}}{{.}}{{end}}</div>{{end}}

<h2>Delivery since start</h2>
{{if .SLIs}}<table>
<thead><tr><th>source</th><th>kind</th><th class="n">owed</th><th class="n">delivered</th><th class="n">recovered</th><th class="n">lost</th><th class="n" title="owed, and neither delivered, recovered nor lost yet: sent within lost_after">in flight</th><th class="n" title="delivered per delivery settled (delivered, recovered or lost): what is in flight is left out until it settles">delivered of settled</th><th class="n">within 1s</th></tr></thead>
<tbody>
{{range .SLIs}}<tr><td>{{.Source}}</td><td>{{.Kind}}</td><td class="n">{{count .Expected}}</td><td class="n">{{count .Delivered}}</td><td class="n">{{count .Recovered}}</td><td class="n">{{count .Lost}}</td><td class="n">{{count .InFlight}}</td><td class="n">{{ratio .Completeness}}</td><td class="n">{{ratio .UnderOneSecond}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="muted">No deliveries measured yet.</p>{{end}}

<h2>Canary</h2>
<p>{{if .Canary.Enabled}}Schedule <code>{{.Canary.Schedule}}</code>; next round due {{time .Canary.Next}}{{if .Canary.Jitter}} (starting up to {{span .Canary.Jitter}} later){{end}}.{{else}}Disabled.{{end}}</p>
{{if .Canary.Rounds}}<table>
<thead><tr><th>time</th><th>result</th><th>checks</th><th class="n">slowest</th><th>reasons</th></tr></thead>
<tbody>
{{range .Canary.Rounds}}<tr><td>{{time .Start}}</td><td class="{{class .Result}}">{{.Result}}</td><td>{{range $i, $c := .Checks}}{{if $i}}, {{end}}{{$c.Kind}} {{$c.Delivered}}/{{$c.Expected}}{{end}}</td><td class="n">{{latency (slowest .)}}</td><td>{{reasons .}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="muted">No canary rounds yet.</p>{{end}}

<h2>Soak</h2>
{{if .Soak.Schedules}}<table>
<thead><tr><th>profile</th><th>schedule</th><th>next run due</th></tr></thead>
<tbody>
{{range .Soak.Schedules}}<tr><td><code>{{.Profile}}</code>{{if eq .Profile $.Soak.Running}} <strong>(running)</strong>{{end}}</td><td>{{with .Schedule}}<code>{{.}}</code>{{else}}<span class="muted">on demand</span>{{end}}</td><td>{{time .Next}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p>Profiles: none configured.</p>{{end}}
<p>{{if .Soak.Running}}Running: <code>{{.Soak.Running}}</code>.{{else}}None running.{{end}}</p>
{{if .Soak.Runs}}<table>
<thead><tr><th>run</th><th>target</th><th>profile</th><th>result</th><th>start</th><th class="n">length</th><th class="n">loss</th><th class="n">p99 delivery</th><th>json</th></tr></thead>
<tbody>
{{range .Soak.Runs}}<tr><td><a href="runs/{{.ID}}/report.html"><code>{{.ID}}</code></a></td><td>{{.Target}}</td><td>{{.Profile}}</td><td class="{{class .Result}}">{{.Result}}</td><td>{{time .Start}}</td><td class="n">{{length .Start .End}}</td><td class="n">{{loss .LossRatio}}</td><td class="n">{{latency .P99Delivery}}</td><td><a href="api/v1/runs/{{.ID}}">json</a></td></tr>
{{end}}</tbody>
</table>{{else}}<p class="muted">No soak runs yet.</p>{{end}}
</body>
</html>
`

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
	case "pass":
		return "pass"
	case "fail", "aborted":
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
