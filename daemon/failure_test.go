package daemon

import (
	"context"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/protocols"
	"github.com/imcanary/imcanary/refserver"
)

// failureConfig is testConfig with short backoffs, so that a failing
// target is retried several times a second, and logging to a buffer.
func failureConfig(t *testing.T, url string) (config.Config, *syncBuf, *slog.Logger) {
	cfg := testConfig(t)
	cfg.Target.URL = url
	cfg.Canary.Schedule = ""
	cfg.Population.Backoff = config.Backoff{Initial: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	logs := &syncBuf{}
	return cfg, logs, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// serveTarget runs a reference server with secret on ln until the test
// ends or the returned stop is called, which returns once it has stopped.
func serveTarget(t *testing.T, ln net.Listener, secret []byte) (srv *refserver.Server, stop func()) {
	srv, err := refserver.New(refserver.Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return srv, stop
}

// TestFailuresSayWhy provokes each way a target can refuse imcanary from
// the start and checks what the on-call engineer sees: the reason on
// /metrics (with the failed attempts counted, provisioning included), the
// target unreachable, one log line that says why, and a status page whose
// verdict is down with that cause.
func TestFailuresSayWhy(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, cfg *config.Config) string // returns the URL
		reason string
		cause  string // in the log line and the page's cause
	}{
		{"closed port", func(t *testing.T, _ *config.Config) string {
			return "ws://" + closedPort(t) + "/ws"
		}, "refused", "connection refused"},
		{"HTTP 404 on upgrade", func(t *testing.T, _ *config.Config) string {
			srv := httptest.NewServer(http.NotFoundHandler())
			t.Cleanup(srv.Close)
			return "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws"
		}, "http_4xx", "the WebSocket upgrade was answered HTTP 404 Not Found"},
		{"wrong secret", func(t *testing.T, cfg *config.Config) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = serveTarget(t, ln, []byte("the target's own secret"))
			cfg.Target.SecretFile = filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(cfg.Target.SecretFile, []byte("a wrong secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return "ws://" + ln.Addr().String() + "/ws"
		}, "unauthorized", `unauthorized: the target closed the login with 4001 "bad token"`},
		{"TLS certificate not trusted", func(t *testing.T, _ *config.Config) string {
			up := websocket.Upgrader{}
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c, err := up.Upgrade(w, r, nil); err == nil {
					c.Close()
				}
			}))
			// Each refused handshake is a line on the server's log.
			srv.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
			srv.StartTLS()
			t.Cleanup(srv.Close)
			return "wss" + strings.TrimPrefix(srv.URL, "https") + "/ws"
		}, "tls", "TLS handshake failed (tls: failed to verify certificate: x509: certificate signed by unknown authority)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, logs, log := failureConfig(t, "")
			cfg.Target.URL = tt.setup(t, &cfg)
			reg := prometheus.NewPedanticRegistry()
			d, err := New(cfg, log, reg)
			if err != nil {
				t.Fatal(err)
			}
			base, stop := runDaemon(t, d)
			key := `imcanary_session_connect_failures_total{reason="` + tt.reason + `"}`
			testwait.For(t, 10*time.Second, key+" > 2", func() bool { return scrape(t, base)[key] > 2 })
			// The target is judged unreachable once its failures have
			// lasted a while; the attempts go on after that, and the log
			// must still hold one line, not one per attempt.
			testwait.For(t, 10*time.Second, "the target judged unreachable", func() bool { return len(grepLines(logs.String(), "target unreachable")) > 0 })
			n := scrape(t, base)[key]
			testwait.For(t, 10*time.Second, "more attempts", func() bool { return scrape(t, base)[key] > n+3 })
			m := scrape(t, base)
			if m["imcanary_target_reachable"] != 0 {
				t.Errorf("imcanary_target_reachable = %v, want 0", m["imcanary_target_reachable"])
			}
			var st Status
			getJSON(t, base+"/api/v1/status", &st)
			if st.Verdict.State != VerdictDown || !strings.Contains(st.Verdict.Cause, tt.cause) {
				t.Errorf("verdict = %s %q, want down with %q", st.Verdict.State, st.Verdict.Cause, tt.cause)
			}
			_, page := get(t, base+"/")
			if !strings.Contains(page, `<div class="state" id="verdict-state">down</div>`) {
				t.Errorf("status page does not show the verdict down:\n%s", page)
			}
			stop()
			// Compared once the attempts have stopped: a scrape while
			// they go on may fall between an attempt's two counts.
			got := gathered(t, reg, "imcanary_session_connect_failures_total", "reason", tt.reason)
			fails := gathered(t, reg, "imcanary_session_connects_total", "result", "failure")
			if got != fails || got < 3 {
				t.Errorf("%s = %v, but connects_total{result=failure} = %v: every failure must have this reason", key, got, fails)
			}
			lines := grepLines(logs.String(), "target unreachable")
			// slog's text handler quotes the message: quotes in it are
			// escaped.
			logged := strings.ReplaceAll(tt.cause, `"`, `\"`)
			if len(lines) != 1 || !strings.Contains(lines[0], logged) || !strings.Contains(lines[0], "0 of 20 online") {
				t.Errorf("log has %d \"target unreachable\" lines %q, want one saying %q and \"0 of 20 online\"", len(lines), lines, tt.cause)
			}
			t.Logf("%s", lines)
		})
	}
}

// TestTargetKilledMidRun kills a healthy target under a running daemon and
// brings it back on the same address: the log says so twice, once down with
// the reason and once back with how long it was away, the page says down
// while it is, and the population comes back whole.
func TestTargetKilledMidRun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, stopTarget := serveTarget(t, ln, nil)
	cfg, logs, log := failureConfig(t, "ws://"+addr+"/ws")
	d, err := New(cfg, log, prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, stop := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "/readyz 200", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })
	var st Status
	getJSON(t, base+"/api/v1/status", &st)
	if st.Verdict.State != VerdictHealthy && st.Verdict.State != VerdictStarting {
		t.Errorf("verdict before the kill = %s %q, want healthy", st.Verdict.State, st.Verdict.Cause)
	}

	killed := time.Now()
	stopTarget()
	testwait.For(t, 10*time.Second, "the verdict down, target unreachable", func() bool {
		getJSON(t, base+"/api/v1/status", &st)
		return st.Verdict.State == VerdictDown && !st.Reachability.Reachable
	})
	if !strings.Contains(st.Verdict.Cause, "connection refused") {
		t.Errorf("verdict while killed = %q, want the cause connection refused", st.Verdict.Cause)
	}
	if c, _ := get(t, base+"/readyz"); c != 200 {
		t.Errorf("/readyz while the target is down = %d, want 200: readiness is about imcanary itself", c)
	}
	// Several reconnects refused after the line, each of which must not
	// log again.
	testwait.For(t, 10*time.Second, "the target unreachable in the log", func() bool {
		return len(grepLines(logs.String(), "target unreachable")) > 0
	})
	refused := scrape(t, base)["imcanary_session_connect_failures_total"]
	testwait.For(t, 10*time.Second, "more refused reconnects", func() bool {
		return scrape(t, base)["imcanary_session_connect_failures_total"] > refused+3
	})

	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	_, _ = serveTarget(t, ln2, nil)
	testwait.For(t, 20*time.Second, "the target back in the log", func() bool {
		return len(grepLines(logs.String(), "target back")) > 0
	})
	away := time.Since(killed)
	testwait.For(t, 10*time.Second, "20 sessions online", func() bool {
		return scrape(t, base)[`imcanary_sessions_online{source="background"}`] == 20
	})
	stop()
	down, back := grepLines(logs.String(), "target unreachable"), grepLines(logs.String(), "target back")
	if len(down) != 1 || !strings.Contains(down[0], "connection refused") {
		t.Errorf("log has \"target unreachable\" lines %q, want exactly one saying connection refused", down)
	}
	if len(back) != 1 || !strings.Contains(back[0], "of 20 online") {
		t.Errorf("log has \"target back\" lines %q, want exactly one with the count online", back)
	}
	// The time away it reports is at most what this test measured from
	// the kill to the line.
	if len(back) == 1 {
		i := strings.Index(back[0], "target back after ")
		var d time.Duration
		if i >= 0 {
			f := strings.Fields(back[0][i+len("target back after "):])
			if len(f) > 0 {
				// "12s;" or "5s–12s": the upper bound.
				_, upper, _ := strings.Cut(strings.TrimSuffix(f[0], ";"), "–")
				if upper == "" {
					upper = strings.TrimSuffix(f[0], ";")
				}
				d, _ = time.ParseDuration(upper)
			}
		}
		if d <= 0 || d > away+time.Second {
			t.Errorf("%q: time away %v, want above 0 and at most the %v measured", back[0], d, away.Round(time.Second))
		}
	}
	t.Logf("%s\n%s", down, back)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// TestRequestHeaders: every request to the target carries imcanary's
// User-Agent and the configured target.headers, a credential read from its
// value_file among them, which then appears nowhere imcanary writes.
func TestRequestHeaders(t *testing.T) {
	const credential = "proxy-credential-7f3a9c"
	var mu sync.Mutex
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	cfg, logs, log := failureConfig(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws")
	file := filepath.Join(t.TempDir(), "proxy-token")
	if err := os.WriteFile(file, []byte(credential+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Target.Headers = []config.Header{{Name: "X-Environment", Value: "staging"}, {Name: "X-Proxy-Auth", ValueFile: file}}
	d, err := New(cfg, log, prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, stop := runDaemon(t, d)
	key := `imcanary_session_connect_failures_total{reason="unauthorized"}`
	testwait.For(t, 10*time.Second, key, func() bool { return scrape(t, base)[key] > 0 })
	_, status := get(t, base+"/api/v1/status")
	_, page := get(t, base+"/")
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("the target saw no request")
	}
	for _, h := range seen {
		if ua := h.Get("User-Agent"); ua != protocols.UserAgent() || !strings.HasPrefix(ua, "imcanary/") {
			t.Errorf("User-Agent = %q, want %q", ua, protocols.UserAgent())
		}
		if h.Get("X-Environment") != "staging" || h.Get("X-Proxy-Auth") != credential {
			t.Errorf("request headers %v lack the configured X-Environment and X-Proxy-Auth", h)
		}
	}
	for what, s := range map[string]string{"log": logs.String(), "status": status, "page": page} {
		if strings.Contains(s, credential) {
			t.Errorf("the %s shows the header's credential", what)
		}
	}
}

// gathered returns the sum of the samples of name in reg whose label has
// value.
func gathered(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
