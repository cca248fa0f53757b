package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestRunAcrossShardsRestart runs the background population of three
// daemons laid out across them (population.across_shards), as the
// StatefulSet example does: 30 users in one group that spans the three,
// with direct pairs across the shards' edges, on a clean reference server.
// Then it kills one shard (SIGKILL, as an evicted pod) and starts it again,
// as a rolling update does to every pod, its users logging in over a ramp.
// Nothing was missing from the server, so no shard may count a delivery
// lost, late, recovered or duplicated, before the restart or after: what
// the others sent while the shard was down, or before its devices logged
// in again, is not owed to the new process, whose ledger began after it.
// And the restarted shard must count deliveries again, from the others'
// senders and its own.
func TestRunAcrossShardsRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three daemons, one of them twice")
	}
	const (
		shards   = 3
		users    = 30
		perShard = users / shards
	)
	ds := startAcrossDaemons(t, shards, users)
	sh, start := ds.procs, ds.start
	scrapeAll := func() ([shards]map[string]*dto.MetricFamily, error) {
		var s [shards]map[string]*dto.MetricFamily
		all, err := ds.scrape()
		copy(s[:], all)
		return s, err
	}
	bg := func(s map[string]*dto.MetricFamily, name string) float64 {
		return value(s, name, "source", "background")
	}
	// quiet fails the test if any shard counted what a clean server
	// cannot cause.
	quiet := func(when string, s [shards]map[string]*dto.MetricFamily) {
		t.Helper()
		for i := range shards {
			for _, name := range []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_late_total",
				"imcanary_deliveries_recovered_total", "imcanary_deliveries_duplicate_total"} {
				if n := bg(s[i], name); n != 0 {
					t.Errorf("%s: shard %d: %s{source=background} = %v on a clean server, want 0", when, i, name, n)
				}
			}
		}
	}
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	}()
	// online waits until every shard has its slice online, and shard i
	// has counted at least want deliveries; it returns the scrape.
	online := func(i int, want float64) [shards]map[string]*dto.MetricFamily {
		var s [shards]map[string]*dto.MetricFamily
		testwait.Every(t, 60*time.Second, 300*time.Millisecond, "the shards online and delivering", func() bool {
			var err error
			if s, err = scrapeAll(); err != nil {
				last = err.Error()
				return false
			}
			for j := range shards {
				if n := bg(s[j], "imcanary_sessions_online"); n != perShard {
					last = fmt.Sprintf("shard %d: %v of its %d users online", j, n, perShard)
					return false
				}
			}
			if n := bg(s[i], "imcanary_deliveries_total"); n < want {
				last = fmt.Sprintf("shard %d: %v deliveries, want %v", i, n, want)
				return false
			}
			return true
		})
		return s
	}

	// Every shard owes and receives: a third of each group message's
	// deliveries are each shard's.
	s := online(1, 200)
	quiet("before the restart", s)
	for i := range shards {
		if n := bg(s[i], "imcanary_deliveries_expected_total"); n == 0 {
			t.Fatalf("shard %d owes no delivery: its users send nothing", i)
		}
	}

	if err := sh[1].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = sh[1].cmd.Wait()
	// Down for longer than lost_after, so that the others' messages to
	// its users outlive any hold.
	time.Sleep(5 * time.Second)
	start(1)
	s = online(1, 200)
	// Twice lost_after more, so that every gap the restart could leave
	// is judged.
	time.Sleep(2 * 4 * time.Second)
	if s, err := scrapeAll(); err != nil {
		t.Fatal(err)
	} else {
		quiet("after the restart", s)
		for i := range shards {
			t.Logf("shard %d: expected %v, delivered %v, ignored as stale %v", i,
				bg(s[i], "imcanary_deliveries_expected_total"), bg(s[i], "imcanary_deliveries_total"),
				value(s[i], "imcanary_deliveries_ignored_total", "reason", "stale"))
		}
	}

	// Once the ring has measured every other shard's clock (three
	// shards: each is the others' neighbour), every latency from
	// another shard is corrected and observed, none untrusted.
	testwait.Every(t, 30*time.Second, 300*time.Millisecond, "every shard's clock measured", func() bool {
		var err error
		if s, err = scrapeAll(); err != nil {
			last = err.Error()
			return false
		}
		for i := range shards {
			for j := range shards {
				if j != i && value(s[i], "imcanary_clock_offset_samples_total", "peer_shard", fmt.Sprint(j)) < 2 {
					last = fmt.Sprintf("shard %d: fewer than 2 clock exchanges with shard %d", i, j)
					return false
				}
			}
		}
		return true
	})
	// An exchange a moment old may still be the only one since the
	// restart: two more rounds.
	time.Sleep(2 * time.Second)
	before, err := scrapeAll()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	after, err := scrapeAll()
	if err != nil {
		t.Fatal(err)
	}
	const untrusted = "imcanary_cross_shard_latency_untrusted_total"
	for i := range shards {
		// The series exists only where the background population
		// corrects by the ring's clocks: at zero, it says so.
		if f := after[i][untrusted]; f == nil || !slices.ContainsFunc(f.Metric, func(m *dto.Metric) bool { return label(m, "source") == "background" }) {
			t.Fatalf("shard %d: no %s{source=background}: the background population does not take the ring's clocks", i, untrusted)
		}
	}
	for i := range shards {
		u0, u1 := bg(before[i], untrusted), bg(after[i], untrusted)
		d0, d1 := bg(before[i], "imcanary_deliveries_total"), bg(after[i], "imcanary_deliveries_total")
		t.Logf("shard %d: %v latencies untrusted before the clocks were known; %v deliveries since, %v untrusted", i, u0, d1-d0, u1-u0)
		if d1 <= d0 || u1 != u0 {
			t.Errorf("shard %d: %v deliveries and %v untrusted latencies in 3 s with every clock known: want deliveries, none untrusted", i, d1-d0, u1-u0)
		}
	}
}

// acrossDaemons is a population of users users laid out across shards
// imcanary daemons (imcanary run), in one group of all of them, on a clean
// reference server: a StatefulSet's shards on loopback.
type acrossDaemons struct {
	t      *testing.T
	bin    string
	url    string
	users  int
	extra  []string
	procs  []acrossDaemon
	shards int
}

type acrossDaemon struct {
	addr, data string
	cmd        *exec.Cmd
}

// startAcrossDaemons starts the shards, with extra flags; they stop with
// the test. With users 0 the population's size and groups are left to the
// configuration file, which extra then names, so that a reload can change
// them.
func startAcrossDaemons(t *testing.T, shards, users int, extra ...string) *acrossDaemons {
	t.Helper()
	ds := &acrossDaemons{t: t, bin: binary(t), url: startTarget(t, refserver.Faults{}), users: users, extra: extra,
		procs: make([]acrossDaemon, shards), shards: shards}
	for i := range shards {
		ds.procs[i].addr, ds.procs[i].data = freeAddr(t), filepath.Join(t.TempDir(), "data")
		ds.start(i)
	}
	t.Cleanup(func() {
		for i := range shards {
			_ = ds.procs[i].cmd.Process.Signal(os.Interrupt)
		}
		for i := range shards {
			done := make(chan struct{})
			go func() { _ = ds.procs[i].cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = ds.procs[i].cmd.Process.Kill()
				<-done
			}
		}
	})
	return ds
}

// start starts shard i, again after it ended.
func (ds *acrossDaemons) start(i int) {
	t, p := ds.t, &ds.procs[i]
	args := append([]string{"run",
		"--shard", fmt.Sprintf("%d/%d", i, ds.shards),
		"--target.url", ds.url, "--http.listen", p.addr, "--data_dir", p.data,
		"--population.across_shards=true",
		"--population.rate=0.3", "--population.ramp=3s",
		"--population.deadline=2s", "--population.lost_after=4s",
		// The canary ring measures the shards' clocks, by which the
		// background population corrects the latencies of other
		// shards' senders; the bound is wide, since this machine may
		// be loaded.
		"--canary.schedule=@every 1s", "--canary.jitter=0s", "--canary.deadline=1s", "--canary.users=2",
		"--canary.max_clock_uncertainty=5s", "--log.level=warn"}, ds.extra...)
	if ds.users > 0 {
		args = append(args, fmt.Sprintf("--population.users=%d", ds.users), fmt.Sprintf("--population.groups=1x%d", ds.users))
	}
	cmd := exec.Command(ds.bin, args...)
	cmd.Env = append(os.Environ(), "IMCANARY_TARGET_SECRET=across-test")
	cmd.Stderr = &prefixWriter{t: t, prefix: fmt.Sprintf("shard %d: ", i)}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd = cmd
}

// scrape scrapes every shard.
func (ds *acrossDaemons) scrape() ([]map[string]*dto.MetricFamily, error) {
	s := make([]map[string]*dto.MetricFamily, ds.shards)
	for i := range s {
		var err error
		if s[i], err = scrape(ds.procs[i].addr); err != nil {
			return s, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return s, nil
}

// TestRunAcrossShardsChurn: the three daemons of TestRunAcrossShardsRestart
// with session churn (population.session_lifetime): every device logs out
// and back in every few seconds, missing what was sent meanwhile, which
// the server's offline backlog and catch-up give back to it. Over
// several lost_after periods nothing is lost or duplicated, in any shard,
// though the devices that miss what other shards' senders sent are told
// so only by the marks in the messages.
func TestRunAcrossShardsChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three daemons")
	}
	ds := startAcrossDaemons(t, 3, 30, "--population.session_lifetime=4s")
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	}()
	var s []map[string]*dto.MetricFamily
	testwait.Every(t, 60*time.Second, 300*time.Millisecond, "churn in every shard, and deliveries", func() bool {
		var err error
		if s, err = ds.scrape(); err != nil {
			last = err.Error()
			return false
		}
		for i := range s {
			if n := value(s[i], "imcanary_session_disconnects_total", "source", "background", "reason", "churn"); n < 10 {
				last = fmt.Sprintf("shard %d: %v sessions churned", i, n)
				return false
			}
			if n := value(s[i], "imcanary_deliveries_total", "source", "background"); n < 300 {
				last = fmt.Sprintf("shard %d: %v deliveries", i, n)
				return false
			}
		}
		return true
	})
	// Every gap the churn opened up to now is judged by then.
	time.Sleep(2 * 4 * time.Second)
	s, err := ds.scrape()
	if err != nil {
		t.Fatal(err)
	}
	for i := range s {
		bg := func(name string) float64 { return value(s[i], name, "source", "background") }
		t.Logf("shard %d: %v churned; expected %v, delivered %v, recovered %v, late %v, lost %v, duplicate %v", i,
			value(s[i], "imcanary_session_disconnects_total", "source", "background", "reason", "churn"),
			bg("imcanary_deliveries_expected_total"), bg("imcanary_deliveries_total"), bg("imcanary_deliveries_recovered_total"),
			bg("imcanary_deliveries_late_total"), bg("imcanary_deliveries_lost_total"), bg("imcanary_deliveries_duplicate_total"))
		for _, name := range []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_duplicate_total"} {
			if n := bg(name); n != 0 {
				t.Errorf("shard %d: %s{source=background} = %v on a clean server, want 0", i, name, n)
			}
		}
	}
}

// TestRunAcrossShardsResize: two daemons of one population of 20 users
// laid out across them, each reloaded (SIGHUP) with 40: the population
// grows by a block of 20 users, itself laid out across the shards in a
// group of its own that spans them, each shard logging in 10 more.
// Nothing is lost, late or duplicated on a clean server, before the
// resize or after, and the new block's users deliver.
func TestRunAcrossShardsResize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two daemons")
	}
	cfg := filepath.Join(t.TempDir(), "imcanary.yaml")
	write := func(users int) {
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf("population: {users: %d, groups: \"1x20\"}\n", users)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(20)
	ds := startAcrossDaemons(t, 2, 0, "--config", cfg)
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	}()
	online := func(perShard float64, deliveries float64) []map[string]*dto.MetricFamily {
		var s []map[string]*dto.MetricFamily
		testwait.Every(t, 60*time.Second, 300*time.Millisecond, fmt.Sprintf("%v users online in each shard, delivering", perShard), func() bool {
			var err error
			if s, err = ds.scrape(); err != nil {
				last = err.Error()
				return false
			}
			for i := range s {
				if n := value(s[i], "imcanary_sessions_online", "source", "background"); n != perShard {
					last = fmt.Sprintf("shard %d: %v online", i, n)
					return false
				}
				if n := value(s[i], "imcanary_deliveries_total", "source", "background"); n < deliveries {
					last = fmt.Sprintf("shard %d: %v deliveries", i, n)
					return false
				}
			}
			return true
		})
		return s
	}
	quiet := func(when string, s []map[string]*dto.MetricFamily) {
		t.Helper()
		for i := range s {
			for _, name := range []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_late_total", "imcanary_deliveries_duplicate_total"} {
				if n := value(s[i], name, "source", "background"); n != 0 {
					t.Errorf("%s: shard %d: %s{source=background} = %v on a clean server, want 0", when, i, name, n)
				}
			}
		}
	}
	s := online(10, 100)
	quiet("before the resize", s)
	before := make([]float64, len(s))
	for i := range s {
		before[i] = value(s[i], "imcanary_deliveries_total", "source", "background")
	}
	write(40)
	for i := range ds.procs {
		if err := ds.procs[i].cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	// Twice what was delivered before: the new block's group of 20
	// delivers as much again as the first.
	s = online(20, 2*before[0]+100)
	time.Sleep(2 * 4 * time.Second)
	if s, err := ds.scrape(); err != nil {
		t.Fatal(err)
	} else {
		quiet("after the resize", s)
		for i := range s {
			t.Logf("shard %d: expected %v, delivered %v (%v before the resize), recovered %v", i,
				value(s[i], "imcanary_deliveries_expected_total", "source", "background"),
				value(s[i], "imcanary_deliveries_total", "source", "background"), before[i],
				value(s[i], "imcanary_deliveries_recovered_total", "source", "background"))
		}
	}
}
