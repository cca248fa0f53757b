package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/refserver"
)

// TestTwoShards runs two imcanary processes as shards 0/2 and 1/2 of one
// target. Each must keep its own users online under its own names, label
// every series with its shard, and count its half of the cross-shard
// canary: the sender what the server acknowledged, the receiver what
// arrived. Summed over the shards, as the recording rules do, expected and
// delivered must then agree, with nothing lost or duplicated.
func TestTwoShards(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two daemons")
	}
	bin := binary(t)
	url := startTarget(t, refserver.Faults{})
	const users = 10
	var addrs [2]string
	for i := range 2 {
		addrs[i] = freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		cmd := exec.CommandContext(ctx, bin, "run",
			"--shard", fmt.Sprintf("%d/2", i),
			"--target.url", url, "--http.listen", addrs[i], "--data_dir", t.TempDir(),
			fmt.Sprintf("--population.users=%d", users), "--population.rate=2", "--population.ramp=0s",
			"--population.deadline=1s", "--population.lost_after=2s",
			"--canary.schedule=@every 1s", "--canary.jitter=0s", "--canary.deadline=1s", "--canary.users=4",
			"--log.level=warn")
		cmd.Env = append(os.Environ(), "IMCANARY_TARGET_SECRET=shard-test")
		cmd.Stderr = &prefixWriter{t: t, prefix: fmt.Sprintf("shard %d: ", i)}
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(6 * time.Second):
				cancel()
				<-done
			}
			cancel()
		})
	}

	// Converge: the canary runs every second, so a scrape may catch a
	// message between its ack and its delivery; the sums must agree at a
	// quiet moment, and both shards must have run several rounds.
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("what the shards last disagreed on: %s", last)
		}
	}()
	testwait.Every(t, 30*time.Second, 300*time.Millisecond, "the shards to agree", func() bool {
		var s [2]map[string]*dto.MetricFamily
		var err error
		for i := range 2 {
			if s[i], err = scrape(addrs[i]); err != nil {
				last = err.Error()
				return false
			}
		}
		var ok bool
		ok, last = checkShards(t, s, users)
		return ok
	})
}

// checkShards reports whether two shards' scrapes show what TestTwoShards
// wants, or what is still missing. Violations that cannot converge fail the
// test at once.
func checkShards(t *testing.T, s [2]map[string]*dto.MetricFamily, users int) (bool, string) {
	t.Helper()
	var expected, delivered, rounds float64
	for i := range 2 {
		shard := fmt.Sprint(i)
		for _, name := range []string{"imcanary_sessions_online", "go_goroutines", "process_open_fds", "imcanary_probe_saturated"} {
			f := s[i][name]
			if f == nil || len(f.Metric) == 0 {
				return false, fmt.Sprintf("shard %d: no %s yet", i, name)
			}
			for _, m := range f.Metric {
				if l := label(m, "shard"); l != shard {
					t.Fatalf("shard %d: %s has shard label %q, want %q", i, name, l, shard)
				}
			}
		}
		if n := value(s[i], "imcanary_sessions_online", "source", "background"); n != float64(users) {
			return false, fmt.Sprintf("shard %d: %v of %d background users online", i, n, users)
		}
		for _, name := range []string{"imcanary_deliveries_lost_total", "imcanary_deliveries_duplicate_total"} {
			if n := value(s[i], name, "source", "canary"); n != 0 {
				t.Fatalf("shard %d: %s{source=canary} = %v, want 0", i, name, n)
			}
		}
		// Four canary users receive one direct and three group streams
		// each, and user 0 one more: the other shard's.
		if n := value(s[i], "imcanary_ledger_streams", "source", "canary"); n != 17 {
			return false, fmt.Sprintf("shard %d: the canary ledger tracks %v streams, want 4×4 of its own and 1 from the other shard", i, n)
		}
		// The ring measures the other shard's clock through the
		// target; both run on this machine's, so the offset must be
		// zero within its uncertainty.
		peer := fmt.Sprint(1 - i)
		if value(s[i], "imcanary_clock_offset_samples_total", "peer_shard", peer) < 2 {
			return false, fmt.Sprintf("shard %d: fewer than 2 clock exchanges with shard %s yet", i, peer)
		}
		if off, unc := value(s[i], "imcanary_clock_offset_seconds", "peer_shard", peer), value(s[i], "imcanary_clock_offset_uncertainty_seconds", "peer_shard", peer); off > unc+1e-6 || -off > unc+1e-6 {
			t.Fatalf("shard %d: shard %s's clock offset %v ± %v s, want 0 within the uncertainty (one clock)", i, peer, off, unc)
		}
		expected += value(s[i], "imcanary_deliveries_expected_total", "source", "canary", "kind", "direct")
		delivered += value(s[i], "imcanary_deliveries_total", "source", "canary", "kind", "direct")
		rounds += value(s[i], "imcanary_canary_rounds_total", "kind", "direct", "result", "pass")
	}
	if rounds < 6 {
		return false, fmt.Sprintf("%v passed direct canary rounds over both shards, want at least 6", rounds)
	}
	// Each round sends 4 direct messages within the shard and 1 across.
	if expected < 5*rounds-2 {
		return false, fmt.Sprintf("expected %v direct canary deliveries over %v rounds, want 5 a round (4 in the shard, 1 across)", expected, rounds)
	}
	if expected != delivered {
		return false, fmt.Sprintf("summed over shards: %v direct canary deliveries expected, %v delivered", expected, delivered)
	}
	return true, ""
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value sums the counters or gauges of family name whose labels match the
// name/value pairs given, over every other label.
func value(fams map[string]*dto.MetricFamily, name string, kv ...string) float64 {
	var sum float64
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(kv); i += 2 {
			if label(m, kv[i]) != kv[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum
}

// prefixWriter logs a child process's stderr through t, line by line.
type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(b), nil
}
