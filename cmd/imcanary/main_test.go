package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/imcanary/imcanary/refserver"
)

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("population: {users: 10}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("population: {users: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		want    int
		wantOut string // in stdout or stderr
	}{
		{[]string{"config", "check", good}, exitOK, "good.yaml: ok"},
		{[]string{"config", "check", bad}, exitUsage, "population.users: 0: must be at least 1"},
		{[]string{"config", "check", filepath.Join(dir, "missing.yaml")}, exitUsage, "missing.yaml"},
		{[]string{"config"}, exitUsage, "want: config check [FILE]"},
		{[]string{"config", "chek", good}, exitUsage, `unknown config command "chek"`},
		{[]string{"bogus"}, exitUsage, `unknown command "bogus"`},
		{[]string{"run", "--population.users=0"}, exitUsage, "population.users"},
		{[]string{"run", "--log.level=loud"}, exitUsage, "--log.level"},
		{[]string{"refserver", "--drop=2"}, exitUsage, "drop"},
		// The old name still works, and says it is deprecated.
		{[]string{"target", "--drop=2"}, exitUsage, `the command "target" is deprecated: use "imcanary refserver"`},
		{[]string{"help"}, exitOK, "Usage:"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		got := run(tt.args, &out, &errOut)
		all := out.String() + errOut.String()
		if got != tt.want || !strings.Contains(all, tt.wantOut) {
			t.Errorf("run(%q) = %d, output %q; want %d and output containing %q", tt.args, got, all, tt.want, tt.wantOut)
		}
	}
}

// startTarget serves a reference server with faults on loopback for the
// command tests; it accepts any token.
func startTarget(t *testing.T, f refserver.Faults) string {
	t.Helper()
	_, url := startServer(t, refserver.Options{Faults: f})
	return url
}

// startServer runs a reference server of opts on a loopback port until
// the test ends, and returns it and its WebSocket URL.
func startServer(t *testing.T, opts refserver.Options) (*refserver.Server, string) {
	t.Helper()
	srv, err := refserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return srv, "ws://" + ln.Addr().String() + "/ws"
}

func soakConfig(t *testing.T, url string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`
target: {url: %q}
data_dir: %q
canary: {deadline: 500ms, users: 3}
soak:
  profiles:
    - name: smoke
      users: 20
      rate: 20
      ramp: 200ms
      duration: 2s
      drain: 3s
      deadline: 1s
      thresholds: {max_loss: 0.001, p99_delivery: 1s}
`, url, filepath.Join(dir, "data"))
	path := filepath.Join(dir, "imcanary.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSoakAndCanaryExitCodes runs the one-shot commands as a pipeline
// would: against a clean target they exit 0, against one that drops 2% of
// deliveries they exit 1, and a profile that does not exist exits 2.
func TestSoakAndCanaryExitCodes(t *testing.T) {
	clean := soakConfig(t, startTarget(t, refserver.Faults{}))
	lossy := soakConfig(t, startTarget(t, refserver.Faults{Drop: 0.02}))
	dropAll := soakConfig(t, startTarget(t, refserver.Faults{Drop: 1}))
	jsonOut := filepath.Join(t.TempDir(), "report.json")
	tests := []struct {
		name    string
		args    []string
		want    int
		wantOut string
	}{
		{"clean soak passes", []string{"soak", "--config", clean, "--profile", "smoke", "--json", jsonOut}, exitOK, "PASS"},
		{"lossy soak fails", []string{"soak", "--config", lossy, "--profile", "smoke"}, exitFail, "FAIL"},
		{"unknown profile", []string{"soak", "--config", clean, "--profile", "nope"}, exitUsage, `no soak profile "nope"`},
		{"no profile", []string{"soak", "--config", clean}, exitUsage, "--profile is required"},
		{"canary passes", []string{"canary", "--once", "--config", clean}, exitOK, "pass"},
		{"canary fails", []string{"canary", "--once", "--config", dropAll}, exitFail, "not_delivered"},
		{"canary without --once", []string{"canary", "--config", clean}, exitUsage, "--once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			got := run(tt.args, &out, &errOut)
			all := out.String() + errOut.String()
			if got != tt.want || !strings.Contains(all, tt.wantOut) {
				t.Errorf("run(%q) = %d, want %d with %q in output:\n%s", tt.args, got, tt.want, tt.wantOut, all)
			}
		})
	}
	b, err := os.ReadFile(jsonOut)
	if err != nil || !bytes.Contains(b, []byte(`"result": "pass"`)) {
		t.Errorf("--json wrote %q (%v), want a report with result pass", b, err)
	}
}

// built is the imcanary binary the process-level tests run, built once.
var built struct {
	once      sync.Once
	dir, path string
	out       []byte
	err       error
}

func TestMain(m *testing.M) {
	// As main does, for the tests that call run.
	setVersion()
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binary builds imcanary, once per test run, for the tests that run it as
// a process of its own.
func binary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "imcanary-test-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "imcanary")
		built.out, built.err = exec.Command("go", "build", "-o", built.path, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.path
}
