package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestKilledMidSoak stops the daemon in the middle of a soak run, first
// with SIGTERM, which it answers by ending and saving the run as aborted
// within its shutdown timeout, then with SIGKILL, after which nothing of it
// runs: the history stays readable, and the next start records the run as
// aborted, with a note saying how it ended.
func TestKilledMidSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon twice")
	}
	bin := binary(t)
	url := startTarget(t, refserver.Faults{})
	dir := t.TempDir()
	cfgFile := filepath.Join(t.TempDir(), "imcanary.yaml")
	write := func(schedule string) {
		cfg := fmt.Sprintf(`
target: {url: %q}
data_dir: %q
population: {users: 4, rate: 1, ramp: 0s}
canary: {schedule: ""}
soak:
  profiles:
    - {name: long, schedule: %q, users: 4, group_size: 2, rate: 2, ramp: 0s, duration: 5m, drain: 1s}
`, url, dir, schedule)
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func() (*exec.Cmd, string) {
		addr := freeAddr(t)
		cmd := exec.Command(bin, "run", "--config", cfgFile, "--http.listen", addr, "--log.level=warn")
		cmd.Env = append(os.Environ(), "IMCANARY_TARGET_SECRET=crash-test")
		cmd.Stderr = &prefixWriter{t: t, prefix: "imcanary: "}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, "http://" + addr
	}
	getJSON := func(url string, v any) error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: %s", resp.Status, b)
		}
		return json.Unmarshal(b, v)
	}

	type runList struct {
		Runs []struct {
			ID      string `json:"id"`
			Profile string `json:"profile"`
			Result  string `json:"result"`
		} `json:"runs"`
	}
	notes := func(base, id string) string {
		var rep struct {
			Notes []string `json:"notes"`
		}
		if err := getJSON(base+"/api/v1/runs/"+id, &rep); err != nil {
			t.Fatal(err)
		}
		return strings.Join(rep.Notes, " ")
	}
	runSoakAndSignal := func(sig syscall.Signal) time.Duration {
		write("@every 1s")
		cmd, base := start()
		testwait.For(t, 30*time.Second, "the soak run to start", func() bool {
			var st struct {
				Soak struct {
					Running string `json:"running"`
				} `json:"soak"`
			}
			return getJSON(base+"/api/v1/status", &st) == nil && st.Soak.Running == "long"
		})
		time.Sleep(500 * time.Millisecond)
		sent := time.Now()
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		return time.Since(sent)
	}

	// SIGTERM: the daemon ends the run itself, saves it and exits within
	// its shutdown timeout.
	took := runSoakAndSignal(syscall.SIGTERM)
	t.Logf("exited %v after SIGTERM", took)
	if took > 6*time.Second {
		t.Errorf("exit took %v after SIGTERM, want within the 5 s shutdown timeout", took)
	}
	write("")
	restarted, base := start()
	var got runList
	testwait.For(t, 30*time.Second, "the API after the restart", func() bool { return getJSON(base+"/api/v1/runs", &got) == nil })
	if len(got.Runs) != 1 || got.Runs[0].Result != "aborted" || !strings.Contains(notes(base, got.Runs[0].ID), "stopped before its end") {
		t.Fatalf("runs after SIGTERM = %+v, want the run, aborted and saved by the daemon itself", got.Runs)
	}
	termID := got.Runs[0].ID
	// One daemon on a data_dir at a time: the next holds it after this
	// one (see history.Acquire).
	_ = restarted.Process.Signal(syscall.SIGTERM)
	_ = restarted.Wait()

	// SIGKILL: nothing runs after the signal; the next start takes over
	// the lock the killed one could not release, finds the run's mark and
	// records it.
	runSoakAndSignal(syscall.SIGKILL)
	write("")
	_, base = start()
	testwait.For(t, 30*time.Second, "the API after the restart", func() bool { return getJSON(base+"/api/v1/runs", &got) == nil })
	if len(got.Runs) != 2 {
		t.Fatalf("runs after SIGKILL = %+v, want 2", got.Runs)
	}
	killed := got.Runs[0]
	if killed.ID == termID {
		killed = got.Runs[1]
	}
	if killed.Result != "aborted" || killed.Profile != "long" {
		t.Fatalf("killed run = %+v, want it aborted", killed)
	}
	if n := notes(base, killed.ID); !strings.Contains(n, "stopped during this run") {
		t.Errorf("notes = %q, want one saying the process stopped during the run", n)
	}
	resp, err := http.Get(base + "/runs/" + killed.ID + "/report.html")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("report page: %v %v, want 200", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestSIGHUPReloads edits the configuration file of a running daemon and
// sends SIGHUP: the population grows to the new size; a broken file is
// then refused and the daemon runs on.
func TestSIGHUPReloads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := binary(t)
	url := startTarget(t, refserver.Faults{})
	cfgFile := filepath.Join(t.TempDir(), "imcanary.yaml")
	write := func(body string) {
		if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := func(users int) string {
		return fmt.Sprintf("target: {url: %q}\ndata_dir: %q\npopulation: {users: %d, rate: 1, ramp: 0s}\ncanary: {schedule: \"\"}\n", url, t.TempDir(), users)
	}
	write(conf(4))
	addr := freeAddr(t)
	cmd := exec.Command(bin, "run", "--config", cfgFile, "--http.listen", addr, "--log.level=warn")
	cmd.Env = append(os.Environ(), "IMCANARY_TARGET_SECRET=hup-test")
	cmd.Stderr = &prefixWriter{t: t, prefix: "imcanary: "}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	metric := func(name string) float64 {
		fams, err := scrape(addr)
		if err != nil {
			return -1
		}
		return value(fams, name)
	}
	waitHUP := func(what string, cond func() bool) {
		t.Helper()
		testwait.For(t, 20*time.Second, what, cond)
	}
	waitHUP("4 sessions online", func() bool { return metric("imcanary_sessions_online") == 4 })
	// The data_dir differs between calls of conf: keep the first.
	first, _ := os.ReadFile(cfgFile)
	write(strings.Replace(string(first), "users: 4", "users: 7", 1))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitHUP("7 sessions online after SIGHUP", func() bool {
		return metric("imcanary_sessions_online") == 7 && metric("imcanary_config_last_reload_successful") == 1
	})
	write("population: {users: [\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitHUP("the broken file refused", func() bool { return metric("imcanary_config_last_reload_successful") == 0 })
	if n := metric("imcanary_sessions_online"); n != 7 {
		t.Errorf("%v sessions online after a refused reload, want the 7 running", n)
	}
}
