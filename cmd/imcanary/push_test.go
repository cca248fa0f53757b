package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// pushgatewayBinary returns Debian's Pushgateway, or $PUSHGATEWAY. It
// skips the test where there is none, except in CI, where a missing
// binary is a broken .ci/run.
func pushgatewayBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PUSHGATEWAY")
	if bin == "" {
		bin = "/usr/bin/prometheus-pushgateway"
	}
	path, err := exec.LookPath(bin)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("prometheus-pushgateway not installed: .ci/run must install it")
	}
	t.Skipf("prometheus-pushgateway not installed (%v): apt-get install prometheus-pushgateway, or set PUSHGATEWAY to its binary, to run the push test", err)
	return ""
}

// startPushgateway runs a Pushgateway of its own on a loopback port,
// keeping nothing on disk, and returns its URL once it is ready. It stops
// with the test.
func startPushgateway(t *testing.T) string {
	t.Helper()
	bin := pushgatewayBinary(t)
	// The port is found free and then handed over: another process may
	// take it in between, which the start then reports.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--web.listen-address="+addr, "--persistence.file=")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var wg sync.WaitGroup
	// Exits when the gateway does: at the cleanup's kill, or earlier if
	// it fails to start.
	wg.Go(func() { _ = cmd.Wait(); close(exited) })
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		wg.Wait()
	})
	url := "http://" + addr
	// Ready when /-/ready answers 200.
	testwait.Every(t, time.Minute, 20*time.Millisecond, "the pushgateway to be ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus-pushgateway exited before it was ready:\n%s", logs.String())
		default:
		}
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url
}

// gatewayMetrics scrapes the gateway's /metrics.
func gatewayMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse the gateway's /metrics: %v\n%s", err, b)
	}
	return fams
}

// pushed returns the value of the series name with exactly the labels
// want among its own (the gateway adds instance=""), and whether there is
// one.
func pushed(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if match {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestPushGateway runs imcanary soak and imcanary canary --once with
// --push.gateway against a real Pushgateway: their final metrics are on
// the gateway under their job and grouping labels, a failed run keeps the
// last success an earlier run pushed, the exit codes are the verdicts',
// and a gateway that is not there exits 3 for a passing run and leaves a
// failed one's exit 1.
func TestPushGateway(t *testing.T) {
	gw := startPushgateway(t)
	clean := soakConfig(t, startTarget(t, refserver.Faults{}))
	lossy := soakConfig(t, startTarget(t, refserver.Faults{Drop: 0.02}))
	// A closed port: the push is refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := "http://" + ln.Addr().String()
	ln.Close()

	runCmd := func(args ...string) (int, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	soakGroup := map[string]string{"job": pushJobSoak, "profile": "smoke"}

	code, out := runCmd("soak", "--config", clean, "--profile", "smoke", "--push.gateway", gw)
	if code != exitOK || !strings.Contains(out, "PASS") {
		t.Fatalf("clean soak with --push.gateway = %d, want %d:\n%s", code, exitOK, out)
	}
	fams := gatewayMetrics(t, gw)
	if v, ok := pushed(fams, "imcanary_soak_last_run_success", soakGroup); !ok || v != 1 {
		t.Errorf("imcanary_soak_last_run_success%v = %v (present %v), want 1", soakGroup, v, ok)
	}
	success, ok := pushed(fams, "imcanary_soak_last_success_timestamp_seconds", soakGroup)
	if !ok || success <= 0 {
		t.Errorf("imcanary_soak_last_success_timestamp_seconds%v = %v (present %v), want the run's end", soakGroup, success, ok)
	}
	if _, ok := pushed(fams, "imcanary_soak_last_run_latency_seconds", map[string]string{"job": pushJobSoak, "stage": "delivery_direct", "percentile": "p99"}); !ok {
		t.Error("no delivery_direct p99 pushed")
	}
	// The gateway's own record of the push, which Prometheus alerts on
	// for a job that stopped pushing.
	if _, ok := pushed(fams, "push_time_seconds", soakGroup); !ok {
		t.Errorf("no push_time_seconds%v on the gateway", soakGroup)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "run" || l.GetName() == "id" || strings.Contains(l.GetValue(), "ws://") {
					t.Errorf("%s has label %s=%q: no run ids or URLs in grouping labels", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}

	// A failed run replaces the run's series and keeps the last success.
	code, out = runCmd("soak", "--config", lossy, "--profile", "smoke", "--push.gateway", gw)
	if code != exitFail || !strings.Contains(out, "FAIL") {
		t.Fatalf("lossy soak with --push.gateway = %d, want %d:\n%s", code, exitFail, out)
	}
	fams = gatewayMetrics(t, gw)
	if v, ok := pushed(fams, "imcanary_soak_last_run_success", soakGroup); !ok || v != 0 {
		t.Errorf("after a failed run, imcanary_soak_last_run_success = %v (present %v), want 0", v, ok)
	}
	// Fail, or inconclusive when the loaded machine saturated the prober:
	// either way one result, and not pass.
	var results float64
	for _, res := range []string{"pass", "fail", "inconclusive", "aborted"} {
		v, ok := pushed(fams, "imcanary_soak_last_run_result", map[string]string{"job": pushJobSoak, "result": res})
		if !ok {
			t.Errorf(`no imcanary_soak_last_run_result{result=%q} after a failed run`, res)
		}
		if res == "pass" && v != 0 {
			t.Errorf(`after a failed run, imcanary_soak_last_run_result{result="pass"} = %v, want 0`, v)
		}
		results += v
	}
	if results != 1 {
		t.Errorf("after a failed run, imcanary_soak_last_run_result sums to %v, want one result", results)
	}
	if v, ok := pushed(fams, "imcanary_soak_last_success_timestamp_seconds", soakGroup); !ok || v != success {
		t.Errorf("after a failed run, last success = %v (present %v), want the passing run's %v kept", v, ok, success)
	}

	code, out = runCmd("canary", "--once", "--config", clean, "--push.gateway", gw)
	if code != exitOK {
		t.Fatalf("canary --once with --push.gateway = %d, want %d:\n%s", code, exitOK, out)
	}
	fams = gatewayMetrics(t, gw)
	if v, ok := pushed(fams, "imcanary_canary_last_round_success", map[string]string{"job": pushJobCanary}); !ok || v != 1 {
		t.Errorf("imcanary_canary_last_round_success{job=%q} = %v (present %v), want 1", pushJobCanary, v, ok)
	}
	if _, ok := pushed(fams, "imcanary_canary_last_round_check_success", map[string]string{"job": pushJobCanary, "kind": "direct"}); !ok {
		t.Error("no direct check pushed for the canary round")
	}

	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"passing soak, no gateway", []string{"soak", "--config", clean, "--profile", "smoke", "--push.gateway", nothing}, exitPush},
		{"failing soak, no gateway", []string{"soak", "--config", lossy, "--profile", "smoke", "--push.gateway", nothing}, exitFail},
		{"passing canary, no gateway", []string{"canary", "--once", "--config", clean, "--push.gateway", nothing}, exitPush},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runCmd(tc.args...)
			if code != tc.want || !strings.Contains(out, "push to the Pushgateway failed") {
				t.Errorf("run(%q) = %d, want %d and the push's error:\n%s", tc.args, code, tc.want, out)
			}
		})
	}
}

// TestPushGatewayFlag: a gateway URL that cannot work, or that carries a
// password, is refused before anything runs.
func TestPushGatewayFlag(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:9091", "want an http:// or https:// URL"},
		{"http://", "no host"},
		{"http://user:hunter2@127.0.0.1:9091", "credentials in the URL are refused"},
	} {
		var out, errOut bytes.Buffer
		code := run([]string{"soak", "--profile", "smoke", "--push.gateway", tc.url}, &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "hunter2") {
			t.Errorf("--push.gateway %q = %d, %q; want %d naming %q, never the password", tc.url, code, errOut.String(), exitUsage, tc.want)
		}
	}
}
