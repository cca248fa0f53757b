package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/bench"
)

// TestBenchQuick runs `imcanary bench --quick --json` as a user would, on a
// machine that may be busy with other tests. It asserts only what a busy
// machine cannot change: the run completes, every figure is there and
// positive, and the throughput ratio is the two clients' figures of this
// very run divided. Whether the figures meet their goals is for the full
// run to show, not for CI to flake on.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a bench of targets and probers")
	}
	bin := binary(t)
	// Under a minute on an idle machine; the bound is for a loaded one.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--quick", "--json")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &prefixWriter{t: t, prefix: "bench: "}
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("imcanary bench --quick --json: %v\n%s", err, stdout.String())
	}
	t.Logf("imcanary bench --quick took %v", time.Since(start).Round(time.Second))
	var r bench.Report
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("report: %v", err)
	}

	if r.Version != bench.ReportVersion || r.Mode != "quick" || r.Seconds <= 0 {
		t.Errorf("version %d, mode %q, %v s; want %d, quick, a duration", r.Version, r.Mode, r.Seconds, bench.ReportVersion)
	}
	if r.Stop.Reason != "steps_done" && r.Stop.Reason != "saturated" {
		t.Errorf("stop = %+v, want steps_done or saturated", r.Stop)
	}
	positive := func(name string, v float64) {
		t.Helper()
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	m := r.Machine
	positive("machine.cores", float64(m.Cores))
	positive("machine.mem_available_bytes", float64(m.MemAvailableBytes))
	positive("machine.file_limit", float64(m.FileLimit))

	tp := r.Throughput
	if tp.Rounds < 1 || tp.Connections < 1 {
		t.Errorf("throughput: %d rounds of %d connections, want at least 1 of 1", tp.Rounds, tp.Connections)
	}
	for name, c := range map[string]bench.Client{"bare": tp.Bare, "imcanary": tp.Imcanary} {
		positive("throughput."+name+".deliveries", c.Deliveries)
		positive("throughput."+name+".cpu_seconds", c.CPUSeconds)
		positive("throughput."+name+".wall_seconds", c.WallSeconds)
		positive("throughput."+name+".deliveries_per_core_second", c.DeliveriesPerCoreSecond)
		if got := c.Deliveries / c.CPUSeconds; math.Abs(got-c.DeliveriesPerCoreSecond) > 1e-9*got {
			t.Errorf("throughput.%s: %v deliveries per core-second, but %v / %v = %v", name, c.DeliveriesPerCoreSecond, c.Deliveries, c.CPUSeconds, got)
		}
	}
	// The ratio is this run's two figures divided: side by side, not
	// against a number measured elsewhere.
	positive("throughput.ratio", tp.Ratio)
	if want := tp.Imcanary.DeliveriesPerCoreSecond / tp.Bare.DeliveriesPerCoreSecond; math.Abs(tp.Ratio-want) > 1e-9*want {
		t.Errorf("throughput.ratio = %v, want imcanary over bare of the same run, %v", tp.Ratio, want)
	}

	positive("baseline.rss_bytes", float64(r.Baseline.RSSBytes))
	positive("logins.sessions", float64(r.Logins.Sessions))
	positive("logins.logins_per_second", r.Logins.LoginsPerSecond)
	positive("logins.cpu_seconds_per_login", r.Logins.CPUSecondsPerLogin)
	positive("logins.target_cpu_seconds_per_login", r.Logins.TargetCPUSecondsPerLogin)
	n := r.Noise
	positive("noise.sessions", float64(n.Sessions))
	positive("noise.deliveries_per_second", n.DeliveriesPerSecond)
	positive("noise.deliveries_per_core_second", n.DeliveriesPerCoreSecond)
	positive("noise.bytes_per_session", n.BytesPerSession)
	if len(r.Steps) == 0 {
		t.Fatal("no session steps")
	}
	for i, st := range r.Steps {
		if st.Online != st.Sessions || st.Sessions != st.SessionsPerProcess*st.Processes {
			t.Errorf("step %d: %d of %d sessions online (%d × %d)", i+1, st.Online, st.Sessions, st.SessionsPerProcess, st.Processes)
		}
		positive("step logins_per_second", st.LoginsPerSecond)
		positive("step rss_bytes", float64(st.RSSBytes))
		positive("step cpu_cores", st.CPUCores)
	}
	// A few hundred sessions over the baseline prober's are within the
	// spread of two processes' resident sets on a busy machine; a
	// thousand are not.
	if last := r.Steps[len(r.Steps)-1]; last.SessionsPerProcess >= 1000 {
		positive("last step bytes_per_session", last.BytesPerSession)
	}
	p := r.Plan
	positive("plan.sessions_per_process", float64(p.SessionsPerProcess))
	positive("plan.deliveries_per_core_second", p.DeliveriesPerCoreSecond)
	positive("plan.memory_sessions", float64(p.MemorySessions))
	if p.Config.Shards < 1 || p.Config.Users != 100 {
		t.Errorf("plan.config = %+v, want at least 1 shard for the default 100 users", p.Config)
	}
}

func TestBenchUsage(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    int
		wantOut string
	}{
		{[]string{"bench", "--steps", "10,x"}, exitUsage, "--steps"},
		{[]string{"bench", "--processes", "0"}, exitUsage, "processes 0: want 1 to 250"},
		{[]string{"bench", "--rate", "-1"}, exitUsage, "rate -1"},
		{[]string{"bench", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"bench", "bare-reader"}, exitUsage, "--url is required"},
		{[]string{"bench", "--help"}, exitOK, "capacity plan"},
	} {
		var out, errOut bytes.Buffer
		got := run(tc.args, &out, &errOut)
		all := out.String() + errOut.String()
		if got != tc.want || !strings.Contains(all, tc.wantOut) {
			t.Errorf("run(%q) = %d, output %q; want %d and output containing %q", tc.args, got, all, tc.want, tc.wantOut)
		}
	}
}
