package rules

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
)

// e2eScale divides the rules' time for the end-to-end test: a minute of
// the real rules is a second, so the 1h/5m page compares a 1m and a 5s
// window and waits 2s.
const e2eScale = 60

// TestEndToEnd runs the real pipeline: the reference server as its own
// process, an imcanary daemon probing it, and a real Prometheus scraping
// the daemon every second and evaluating a time-scaled copy of the rules.
// With 5% of deliveries dropped the real-time completeness page fires
// (whether catch-up recovers the drops or they are lost, neither was
// pushed in time); against a clean target no SLO alert and no page fires
// in a longer time.
func TestEndToEnd(t *testing.T) {
	prometheus := lookPath(t, "prometheus")
	if testing.Short() {
		t.Skip("end-to-end test: builds imcanary and runs Prometheus (not with -short)")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot build imcanary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "imcanary")
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/imcanary")
	build.Dir = "../.."
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/imcanary: %v\n%s", err, b)
	}
	scaled, err := scaleRules(readRulesFile(t), e2eScale)
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, scaled, 0o644); err != nil {
		t.Fatal(err)
	}

	// The two runs are independent (their own ports, processes and
	// directories) and mostly wait, so they run side by side.
	t.Run("drop", func(t *testing.T) {
		t.Parallel()
		s := startStack(t, bin, prometheus, rules, "--drop", "0.05")
		// 5% not pushed is 50 times the budget: the 1h/5m pair, the
		// real-time page, passes its burn rate within seconds of the first
		// drops being settled (recovered by catch-up, or lost at
		// lost_after, 2s after they were sent), and the page waits its 2s.
		a, err := s.waitAlert(t, 60*time.Second, func(a alert) bool {
			return a.Labels["alertname"] == "ImcanaryRealtimeBudgetBurn" && a.Labels["severity"] == "page" && a.State == "firing"
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ImcanaryRealtimeBudgetBurn %s/%s (%s) firing %.1fs after the daemon was ready, %.1fs after Prometheus was: %s",
			a.Labels["long"], a.Labels["short"], a.Labels["kind"], time.Since(s.daemonReady).Seconds(), time.Since(s.promReady).Seconds(), a.Annotations["description"])
		if a.Labels["long"] != "1h" || a.Labels["short"] != "5m" {
			t.Errorf("ImcanaryRealtimeBudgetBurn pages at %s/%s, want only at 1h/5m", a.Labels["long"], a.Labels["short"])
		}
		// Which of the two the reference server's drops become is the
		// server's and the catch-up's business, not this test's: say it.
		for _, q := range []string{"imcanary:eventual_completeness_errors:ratio_rate1h", `sum by (kind) (rate(imcanary_deliveries_recovered_total{cohort="normal"}[1m])) / sum by (kind) (rate(imcanary_deliveries_expected_total{cohort="normal"}[1m]))`} {
			v, err := s.query(q)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s = %v", q, v)
		}
	})
	t.Run("clean", func(t *testing.T) {
		t.Parallel()
		s := startStack(t, bin, prometheus, rules)
		// Longer than the drop run needs, and enough for every window of
		// the pages (1m) to fill.
		const watch = 40 * time.Second
		deadline := time.Now().Add(watch)
		for time.Now().Before(deadline) {
			alerts, err := s.alerts()
			if err != nil {
				t.Fatal(err)
			}
			// What Alertmanager would do: a saturated prober (a loaded
			// test machine) holds back the SLO alerts of its target.
			saturated := map[string]bool{}
			for _, a := range alerts {
				if a.Labels["alertname"] == "ImcanaryProberSaturated" && a.State == "firing" {
					saturated[a.Labels["target"]] = true
				}
			}
			for _, a := range alerts {
				if a.State != "firing" {
					continue
				}
				switch {
				case a.Labels["slo"] == "true" && saturated[a.Labels["target"]]:
					t.Logf("%s %v fired while imcanary was saturated (Alertmanager would inhibit it): %s", a.Labels["alertname"], a.Labels, a.Annotations["description"])
				case a.Labels["slo"] == "true":
					t.Fatalf("%s %v firing against a clean target: %s", a.Labels["alertname"], a.Labels, a.Annotations["description"])
				case a.Labels["severity"] == "page":
					// Saturation holds back only the SLO alerts: a
					// page about logins or the canary would reach
					// someone.
					t.Fatalf("page %s %v firing against a clean target: %s", a.Labels["alertname"], a.Labels, a.Annotations["description"])
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		// Silence is only evidence if the rules saw data: the SLIs must
		// exist, at zero. The real-time one exists only if the daemon
		// exports imcanary_deliveries_recovered_total from the start.
		for _, q := range []string{
			"imcanary:realtime_completeness_errors:ratio_rate1h",
			"imcanary:eventual_completeness_errors:ratio_rate1h",
			"imcanary:latency_errors:ratio_rate1h",
			`sum by (target, kind) (imcanary_deliveries_recovered_total{cohort="normal"})`,
		} {
			v, err := s.query(q)
			if err != nil {
				t.Fatal(err)
			}
			if len(v) == 0 {
				t.Fatalf("%s: no samples after %v: the rules never saw the daemon's counters", q, watch)
			}
			for _, x := range v {
				if x.value != 0 {
					t.Errorf("%s%v = %v against a clean target, want 0", q, x.labels, x.value)
				}
			}
		}
		// And the login and canary alerts had theirs: the target
		// reachable, and the canary's next round due at most 10s ago (a
		// round due every 2s runs at most 1.5 × its 1s deadline, and is
		// scraped a second late; 10s is four rounds skipped in a row).
		for q, want := range map[string]string{
			"imcanary_target_reachable":                                       "1 (reachable)",
			"time() - imcanary_canary_next_round_timestamp_seconds < bool 10": "1 (rounds running)",
		} {
			v, err := s.query(q)
			if err != nil {
				t.Fatal(err)
			}
			if len(v) == 0 {
				t.Errorf("%s: no samples after %v: the daemon does not export it", q, watch)
			}
			for _, x := range v {
				if x.value != 1 {
					t.Errorf("%s%v = %v against a clean target, want %s", q, x.labels, x.value, want)
				}
			}
		}
		t.Logf("no SLO alert and no page fired in %v after Prometheus was ready (daemon ready %.1fs before)", watch, s.promReady.Sub(s.daemonReady).Seconds())
	})
}

// stack is one target, daemon and Prometheus.
type stack struct {
	prom        string // Prometheus's base URL
	daemonReady time.Time
	promReady   time.Time
}

// startStack starts the reference server (with targetArgs, its faults), a
// daemon probing it and a Prometheus scraping the daemon with the rules;
// it returns once all three answer. Everything listens on loopback ports
// of its own and is stopped when the test ends.
func startStack(t *testing.T, bin, prometheus, rules string, targetArgs ...string) *stack {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(randomHex(t)), 0o600); err != nil {
		t.Fatal(err)
	}

	targetAddr := freeAddr(t)
	target := start(t, dir, "target", bin, append([]string{"target", "--listen", targetAddr, "--secret-file", secret}, targetArgs...)...)
	waitFor(t, target, 10*time.Second, "the target to listen", func() bool {
		c, err := net.DialTimeout("tcp", targetAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// A small population sending fast: 10 users at 5 messages a second
	// owe about 125 deliveries a second (a group of 5 owes 4 per message),
	// so 5% drops are a few lost every second. lost_after 2s declares them
	// soon; the canary runs every 2s.
	daemonAddr := freeAddr(t)
	daemon := start(t, dir, "daemon", bin, "run",
		"--target.url", "ws://"+targetAddr+"/ws", "--target.secret_file", secret, "--target.name", "e2e",
		"--http.listen", daemonAddr, "--data_dir", filepath.Join(dir, "data"),
		"--population.users", "10", "--population.rate", "5", "--population.ramp", "0s",
		"--population.deadline", "1s", "--population.lost_after", "2s",
		"--canary.schedule", "@every 2s", "--canary.deadline", "1s", "--canary.jitter", "0s")
	s := &stack{}
	waitFor(t, daemon, 20*time.Second, "the daemon's population to be online", func() bool {
		return httpOK("http://" + daemonAddr + "/readyz")
	})
	s.daemonReady = time.Now()

	promAddr := freeAddr(t)
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: imcanary
    static_configs:
      - targets: [%q]
`, rules, daemonAddr), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := start(t, dir, "prometheus", prometheus,
		"--config.file", cfg, "--storage.tsdb.path", filepath.Join(dir, "tsdb"),
		"--web.listen-address", promAddr, "--log.level", "warn")
	s.prom = "http://" + promAddr
	waitFor(t, prom, 20*time.Second, "Prometheus to be ready", func() bool {
		return httpOK(s.prom + "/-/ready")
	})
	s.promReady = time.Now()
	return s
}

// alert is an alert as Prometheus's /api/v1/alerts shows it.
type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

func (s *stack) alerts() ([]alert, error) {
	var r struct {
		Data struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	return r.Data.Alerts, s.get("/api/v1/alerts", &r)
}

// waitAlert polls Prometheus's alerts until one matches, for at most d.
func (s *stack) waitAlert(t *testing.T, d time.Duration, match func(alert) bool) (alert, error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last []alert
	for time.Now().Before(deadline) {
		alerts, err := s.alerts()
		if err != nil {
			return alert{}, err
		}
		for _, a := range alerts {
			if match(a) {
				return a, nil
			}
		}
		last = alerts
		time.Sleep(250 * time.Millisecond)
	}
	return alert{}, fmt.Errorf("no matching alert within %v; alerts: %+v", d, last)
}

type sample struct {
	labels map[string]string
	value  float64
}

// query runs an instant query and returns its vector.
func (s *stack) query(q string) ([]sample, error) {
	var r struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := s.get("/api/v1/query?query="+url.QueryEscape(q), &r); err != nil {
		return nil, err
	}
	var out []sample
	for _, x := range r.Data.Result {
		str, _ := x.Value[1].(string)
		var v float64
		if _, err := fmt.Sscan(str, &v); err != nil {
			return nil, fmt.Errorf("%s: value %q: %w", q, str, err)
		}
		out = append(out, sample{x.Metric, v})
	}
	return out, nil
}

func (s *stack) get(path string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.prom+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// process is a child process the test started.
type process struct {
	name string
	log  string
	done chan struct{} // closed when it has exited
}

// start runs a command with its output in dir/NAME.log, and stops it when
// the test ends: SIGINT (imcanary and Prometheus shut down cleanly on it),
// then SIGKILL if it has not exited within 5 seconds. Cleanups run in
// reverse, so Prometheus stops before the daemon and the daemon before
// its target. A failed test shows the end of every log.
func start(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log (end):\n%s", name, tail(p.log, 30))
		}
	})
	return p
}

// waitFor polls ready until it holds, failing the test after d or as soon
// as p exits.
func waitFor(t *testing.T, p *process, d time.Duration, what string, ready func() bool) {
	t.Helper()
	testwait.Every(t, d, 100*time.Millisecond, what, func() bool {
		select {
		case <-p.done:
			t.Fatalf("waiting for %s: %s exited:\n%s", what, p.name, tail(p.log, 30))
		default:
		}
		return ready()
	})
}

func httpOK(u string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freeAddr returns a loopback address with a port that was free a moment
// ago: the programs under test take their address as a flag and do not
// report a port 0's choice.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func randomHex(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
