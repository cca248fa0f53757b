package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// acrossConfig is the configuration of TestSoakAcrossShards: 402 users
// laid out across the shards in one group of all of them, ten talkers
// among listeners, and a loss threshold a 1% drop fails.
func acrossConfig(t *testing.T, url string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`
target: {url: %q}
data_dir: %q
population: {across_shards: true}
soak:
  profiles:
    - name: span
      users: 402
      groups: "1x402"
      behaviours:
        - {name: talker, share: 0.025, rate: 1}
        - {name: listener, share: 0.975, rate: 0}
      ramp: 1s
      duration: 12s
      drain: 2s
      deadline: 2s
      lost_after: 4s
      thresholds: {max_loss: 0.001, p99_delivery: 2s}
`, url, filepath.Join(dir, "data"))
	path := filepath.Join(dir, "imcanary.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSoakAcrossShards: four imcanary soak processes run shards 0/4 to
// 3/4 of one population laid out across them (population.across_shards):
// 402 users in one group that spans all four, against the reference
// server. A sender's shard counts owed the deliveries to every member,
// each receiving shard counts what its members get, and summed over the
// shards every delivery the server made or dropped is owed, each dropped
// one is lost and the rest delivered, exactly; on a clean server none is
// lost. The shards' reports merged pass on the clean server and fail the
// 0.1% loss threshold on the one that drops 1%.
func TestSoakAcrossShards(t *testing.T) {
	if testing.Short() {
		t.Skip("builds imcanary and runs four soak processes")
	}
	bin := binary(t)
	for _, tc := range []struct {
		name string
		drop float64
		want int
	}{{"clean", 0, exitOK}, {"drop 1%", 0.01, exitFail}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := refserver.New(refserver.Options{Faults: refserver.Faults{Drop: tc.drop}})
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
			cfg := acrossConfig(t, "ws://"+ln.Addr().String()+"/ws")

			// Whole seconds, at least two ahead: the processes
			// must load their configuration before it.
			at := time.Now().Add(3 * time.Second).Truncate(time.Second).UTC()
			if tc.drop > 0 {
				// The faults stop 5 s before the send phase ends
				// (the ramp phase of a run across shards ends 1 s
				// + 5 s after the start), so that a clean message
				// of its stream follows every drop and reveals it.
				off := time.AfterFunc(time.Until(at.Add(6*time.Second+7*time.Second)), func() { srv.SetFaults(refserver.Faults{}) })
				t.Cleanup(func() { off.Stop() })
			}
			// The JSON reports in one directory, which soak merge
			// reads; a history of its own for each process.
			dir, data := t.TempDir(), t.TempDir()
			var (
				procs sync.WaitGroup
				errs  [4]error
				outs  [4]bytes.Buffer
			)
			for i := range 4 {
				cmd := exec.Command(bin, "soak", "--config", cfg, "--profile", "span", "--shard", fmt.Sprintf("%d/4", i),
					"--start_at", at.Format(time.RFC3339), "--json", filepath.Join(dir, fmt.Sprintf("shard-%d.json", i)),
					"--data_dir", filepath.Join(data, fmt.Sprintf("shard-%d", i)), "--log.level=warn")
				cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
				cmd.WaitDelay = 5 * time.Second
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs.Go(func() { errs[i] = cmd.Wait() })
			}
			procs.Wait()
			var sum report.Deliveries
			for i := range 4 {
				// A shard's own verdict is one part of the run's:
				// only its exit code for a failed run says nothing.
				if code := exitCode(t, errs[i]); code != exitOK && code != exitFail {
					t.Fatalf("shard %d/4: soak exited %d:\n%s", i, code, outs[i].String())
				}
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("shard-%d.json", i)))
				if err != nil {
					t.Fatalf("shard %d/4: %v\n%s", i, err, outs[i].String())
				}
				r, err := report.ReadJSON(bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				d := r.Deliveries["all"]
				t.Logf("shard %d/4: %d users, %d groups; expected %d, delivered %d, lost %d, duplicate %d", i, r.Users.Configured, r.Users.Groups, d.Expected, d.Delivered, d.Lost, d.Duplicate)
				sum.Expected += d.Expected
				sum.Delivered += d.Delivered
				sum.Recovered += d.Recovered
				sum.Lost += d.Lost
				sum.Duplicate += d.Duplicate
			}
			st := srv.Stats()
			t.Logf("summed: expected %d, delivered %d, lost %d; the server made %d deliveries and dropped %d", sum.Expected, sum.Delivered, sum.Lost, st.Deliveries, st.Dropped)
			if sum.Expected < 10000 {
				t.Fatalf("%d deliveries expected, want tens of thousands", sum.Expected)
			}
			if sum.Lost != int64(st.Dropped) || sum.Delivered+sum.Lost != sum.Expected || sum.Duplicate+sum.Recovered != 0 {
				t.Errorf("summed over the shards: expected %d, delivered %d, lost %d, duplicate %d, recovered %d; want the %d the server dropped lost and the rest delivered, once",
					sum.Expected, sum.Delivered, sum.Lost, sum.Duplicate, sum.Recovered, st.Dropped)
			}
			if sum.Expected != int64(st.Deliveries+st.Dropped) {
				t.Errorf("%d expected, the server made %d deliveries and dropped %d: want every one owed", sum.Expected, st.Deliveries, st.Dropped)
			}
			var out, errOut bytes.Buffer
			if code := run([]string{"soak", "merge", dir}, &out, &errOut); code != tc.want {
				t.Errorf("soak merge = %d, want %d:\n%s%s", code, tc.want, out.String(), errOut.String())
			}
		})
	}
}
