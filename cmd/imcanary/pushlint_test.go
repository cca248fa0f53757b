package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/imcanary/imcanary/report"
)

// TestPushedMetricsLint: what a push sends passes promtool check metrics,
// for a soak run and a canary round, so the names follow the conventions.
func TestPushedMetricsLint(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed: .ci/run must install it")
		}
		t.Skipf("promtool not installed (%v): apt-get install prometheus", err)
	}
	start := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	soak := &report.Soak{
		Profile: report.Profile{Name: "smoke"}, Result: "pass", Start: start, End: start.Add(time.Minute),
		Deliveries: map[string]report.Deliveries{"all": {Expected: 10, Delivered: 10}},
		Latency:    map[string]report.Percentiles{"delivery_direct": {Count: 10, P50: time.Millisecond, P95: 2 * time.Millisecond, P99: 3 * time.Millisecond, Max: 4 * time.Millisecond}},
	}
	round := &report.Round{Result: "pass", Start: start, End: start.Add(time.Second),
		Checks: []report.Check{{Kind: "direct", Pass: true, Expected: 1, Delivered: 1, MaxLatency: time.Millisecond}}}
	for name, gather := range map[string]func() ([]byte, error){
		"soak":   func() ([]byte, error) { return encode(soakPushRegistry(soak).Gather) },
		"canary": func() ([]byte, error) { return encode(canaryPushRegistry(round).Gather) },
	} {
		b, err := gather()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics on the %s push: %v\n%s\n%s", name, err, out, b)
		}
	}
}

func encode(gather func() ([]*dto.MetricFamily, error)) ([]byte, error) {
	fams, err := gather()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}
