package main

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/refserver"
	"github.com/imcanary/imcanary/report"
)

// acrossConfig is the configuration of TestSoakAcrossShards: users laid
// out across the shards in one group of all of them, about ten talkers
// among listeners, and a loss threshold a 1% drop fails.
func acrossConfig(t *testing.T, url string, users int) string {
	return acrossConfigWith(t, url, users)
}

// acrossConfigWith is acrossConfig with more keys of the profile, each
// "key: value".
func acrossConfigWith(t *testing.T, url string, users int, more ...string) string {
	t.Helper()
	dir := t.TempDir()
	// The talkers' share: ten of them, however many listen, so that the
	// group's deliveries grow with its size and not with its square.
	talkers := 10 / float64(users)
	cfg := fmt.Sprintf(`
target: {url: %q}
data_dir: %q
population: {across_shards: true}
soak:
  profiles:
    - name: span
      users: %d
      groups: "1x%d"
      behaviours:
        - {name: talker, share: %g, rate: 1}
        - {name: listener, share: %g, rate: 0}
      ramp: 1s
      duration: 12s
      drain: 2s
      deadline: 2s
      lost_after: 4s
      thresholds: {max_loss: 0.001, p99_delivery: 2s}
      %s
`, url, filepath.Join(dir, "data"), users, users, talkers, 1-talkers, strings.Join(more, "\n      "))
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
	// 402: two of the direct pairs cross a shard's edge. More (such as
	// 4002, a group of 4,002 spanning the four shards) by the variable,
	// to measure; CI runs 402.
	users := 402
	if s := os.Getenv("IMCANARYTEST_ACROSS_USERS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 8 || n > 16000 {
			t.Fatalf("IMCANARYTEST_ACROSS_USERS=%q: want a number of users from 8 to 16000", s)
		}
		users = n
	}
	bin := binary(t)
	for _, tc := range []struct {
		name string
		drop float64
		want int
		more []string
	}{
		{"clean", 0, exitOK, nil},
		{"drop 1%", 0.01, exitFail, nil},
		// A fifth of the users log in 8 s after the start, 2 s into
		// the send phase, and are pushed what they missed by the
		// reference server's offline backlog: owed, across the
		// shards as in one process.
		{"late logins, drop 1%", 0.01, exitFail, []string{"late_logins: 0.2", "late_after: 8s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A frame big enough for the group's creation, which
			// names every member: at 4,002 members, past the default
			// 64 KiB.
			srv, url := startServer(t, refserver.Options{Faults: refserver.Faults{Drop: tc.drop}, MaxFrame: 4 << 20})
			cfg := acrossConfigWith(t, url, users, tc.more...)

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
			var (
				sum     report.Deliveries
				unacked int64
			)
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
				t.Logf("shard %d/4: %d users (%d logged in), %d groups; expected %d, delivered %d, lost %d, duplicate %d", i, r.Users.Configured, r.Users.LoggedIn, r.Users.Groups, d.Expected, d.Delivered, d.Lost, d.Duplicate)
				sum.Expected += d.Expected
				sum.Delivered += d.Delivered
				sum.Recovered += d.Recovered
				sum.Lost += d.Lost
				sum.Duplicate += d.Duplicate
				unacked += r.Messages.Unacked + r.Messages.WriteErrors
				for _, n := range r.Messages.Rejected {
					unacked += n
				}
			}
			st := srv.Stats()
			t.Logf("summed: expected %d, delivered %d, lost %d; the server made %d deliveries and dropped %d", sum.Expected, sum.Delivered, sum.Lost, st.Deliveries, st.Dropped)
			if sum.Expected < 10000 {
				t.Fatalf("%d deliveries expected, want tens of thousands; shard 0/4 said:\n%s", sum.Expected, outs[0].String())
			}
			// Nothing is in flight at the end: every drop was
			// followed by a message of its stream, and the drain
			// outlasted lost_after.
			if sum.Delivered+sum.Recovered+sum.Lost != sum.Expected || sum.Duplicate != 0 {
				t.Errorf("summed over the shards: expected %d, delivered %d, lost %d, duplicate %d, recovered %d; want every owed delivery delivered or lost, once",
					sum.Expected, sum.Delivered, sum.Lost, sum.Duplicate, sum.Recovered)
			}
			// Every delivery the server made or dropped was owed,
			// and every one it dropped is lost, but those of a
			// message whose ack never came within the deadline: its
			// sender wrote it off, and its deliveries are unowed,
			// counted neither delivered nor lost.
			made := int64(st.Deliveries + st.Dropped)
			switch {
			case unacked == 0 && (sum.Expected != made || sum.Lost != int64(st.Dropped)):
				t.Errorf("%d expected and %d lost; the server made %d deliveries and dropped %d: want every one owed, the dropped lost", sum.Expected, sum.Lost, st.Deliveries, st.Dropped)
			case sum.Expected > made || sum.Lost > int64(st.Dropped):
				t.Errorf("%d expected and %d lost; the server made %d deliveries and dropped %d, %d messages unacknowledged: want no more owed than made, nor lost than dropped",
					sum.Expected, sum.Lost, st.Deliveries, st.Dropped, unacked)
			}
			if users != 402 {
				// A size measured by hand: its verdict is the
				// machine's as much as the server's.
				return
			}
			var out, errOut bytes.Buffer
			if code := run([]string{"soak", "merge", dir}, &out, &errOut); code != tc.want {
				t.Errorf("soak merge = %d, want %d:\n%s%s", code, tc.want, out.String(), errOut.String())
			}
		})
	}
}

// TestSoakAcrossShardsMatchesOne: the merged report of three soak shards
// of one population laid out across them says what one process running
// the same population says. Both run at once, each against a reference
// server of its own that drops 1% of deliveries (until 5 s before the send
// phase ends): the same users, logged in, and group; about as many
// deliveries owed (the send phase is as long); each its own server's
// drops lost, at about the same ratio; and the same verdict, threshold by
// threshold: a fail, on the merged sums as in the one process.
func TestSoakAcrossShardsMatchesOne(t *testing.T) {
	if testing.Short() {
		t.Skip("builds imcanary and runs four soak processes")
	}
	const users = 300
	bin := binary(t)
	type side struct {
		srv    *refserver.Server
		shards int
		dir    string
		procs  []*exec.Cmd
		outs   []*bytes.Buffer
	}
	at := time.Now().Add(3 * time.Second).Truncate(time.Second).UTC()
	runs := []*side{{shards: 1}, {shards: 3}}
	for _, r := range runs {
		var url string
		r.srv, url = startServer(t, refserver.Options{Faults: refserver.Faults{Drop: 0.01}, MaxFrame: 4 << 20})
		cfg := acrossConfig(t, url, users)
		r.dir = t.TempDir()
		// The send phase ends 12 s after the ramp's end: 1 s after
		// the start for one process, 1 s + 5 s for shards across.
		sendEnd := at.Add(13 * time.Second)
		if r.shards > 1 {
			sendEnd = sendEnd.Add(5 * time.Second)
		}
		srv := r.srv
		off := time.AfterFunc(time.Until(sendEnd.Add(-5*time.Second)), func() { srv.SetFaults(refserver.Faults{}) })
		t.Cleanup(func() { off.Stop() })
		for i := range r.shards {
			args := []string{"soak", "--config", cfg, "--profile", "span", "--start_at", at.Format(time.RFC3339),
				"--json", filepath.Join(r.dir, fmt.Sprintf("shard-%d.json", i)),
				"--data_dir", filepath.Join(t.TempDir(), "data"), "--log.level=warn"}
			if r.shards > 1 {
				args = append(args, "--shard", fmt.Sprintf("%d/%d", i, r.shards))
			}
			cmd := exec.Command(bin, args...)
			out := new(bytes.Buffer)
			cmd.Stdout, cmd.Stderr = out, out
			cmd.WaitDelay = 5 * time.Second
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			r.procs, r.outs = append(r.procs, cmd), append(r.outs, out)
		}
	}
	var reports [2]*report.Soak
	for k, r := range runs {
		var shards []*report.Soak
		for i, cmd := range r.procs {
			if code := exitCode(t, cmd.Wait()); code != exitOK && code != exitFail {
				t.Fatalf("%d shard(s), shard %d: soak exited %d:\n%s", r.shards, i, code, r.outs[i].String())
			}
			b, err := os.ReadFile(filepath.Join(r.dir, fmt.Sprintf("shard-%d.json", i)))
			if err != nil {
				t.Fatalf("%d shard(s), shard %d: %v\n%s", r.shards, i, err, r.outs[i].String())
			}
			rep, err := report.ReadJSON(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			shards = append(shards, rep)
		}
		reports[k] = shards[0]
		if r.shards > 1 {
			var out, errOut bytes.Buffer
			mergedJSON := filepath.Join(t.TempDir(), "merged.json")
			if code := run([]string{"soak", "merge", "--json", mergedJSON, r.dir}, &out, &errOut); code != exitFail {
				t.Errorf("soak merge = %d, want %d (a fail):\n%s%s", code, exitFail, out.String(), errOut.String())
			}
			b, err := os.ReadFile(mergedJSON)
			if err != nil {
				t.Fatalf("soak merge --json: %v\n%s", err, errOut.String())
			}
			if reports[k], err = report.ReadJSON(bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
	}
	one, merged := reports[0], reports[1]
	for k, r := range reports {
		d, st := r.Deliveries["all"], runs[k].srv.Stats()
		t.Logf("%d shard(s): %d users (%d logged in), %d groups; expected %d, delivered %d, lost %d (%.3f%%), server dropped %d; p50 %v, p99 %v; %s",
			runs[k].shards, r.Users.Configured, r.Users.LoggedIn, r.Users.Groups, d.Expected, d.Delivered, d.Lost,
			100*float64(d.Lost)/float64(max(1, d.Expected)), st.Dropped, r.Latency["delivery_group"].P50, r.Latency["delivery_group"].P99, r.Result)
		if d.Lost != int64(st.Dropped) {
			t.Errorf("%d shard(s): %d lost, the server dropped %d: want each drop lost", runs[k].shards, d.Lost, st.Dropped)
		}
	}
	if one.Users.Configured != merged.Users.Configured || one.Users.LoggedIn != merged.Users.LoggedIn || one.Users.Groups != merged.Users.Groups {
		t.Errorf("users: one process %+v, merged %+v: want the same users, logged in, and groups", one.Users, merged.Users)
	}
	d1, dm := one.Deliveries["all"], merged.Deliveries["all"]
	if r := float64(dm.Expected) / float64(d1.Expected); r < 0.9 || r > 1.1 {
		t.Errorf("expected: one process %d, merged %d: want within 10%%", d1.Expected, dm.Expected)
	}
	// Each lost count is a Poisson count of about a hundred: the two
	// differ by more than four standard deviations of their difference
	// (the square root of their sum) one time in 15,000.
	if diff, sd := math.Abs(float64(d1.Lost-dm.Lost)), math.Sqrt(float64(d1.Lost+dm.Lost)); d1.Lost == 0 || diff > 4*sd {
		t.Errorf("lost: one process %d, merged %d: want within 4 standard deviations (%.0f) of each other", d1.Lost, dm.Lost, 4*sd)
	}
	if one.Result != merged.Result || one.Result != metrics.ResultFail {
		t.Errorf("result: one process %q, merged %q: want both %q", one.Result, merged.Result, metrics.ResultFail)
	}
	verdicts := func(r *report.Soak) map[string]bool {
		m := map[string]bool{}
		for _, th := range r.Thresholds {
			m[th.Name] = th.Pass
		}
		return m
	}
	if v1, vm := verdicts(one), verdicts(merged); !maps.Equal(v1, vm) {
		t.Errorf("thresholds: one process %v, merged %v: want the same, each judged alike", v1, vm)
	}
}
