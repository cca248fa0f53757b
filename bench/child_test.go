package bench

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/saturation"
)

// TestChildEnv: workers get the bench's environment less IMCANARY_*, and
// their share of the cores unless the user chose a GOMAXPROCS.
func TestChildEnv(t *testing.T) {
	t.Setenv("IMCANARY_SHARD", "2/3")
	t.Setenv("GOMAXPROCS", "")
	env := childEnv(1)
	if slices.Contains(env, "IMCANARY_SHARD=2/3") {
		t.Error("IMCANARY_SHARD passed to a worker")
	}
	if !slices.Contains(env, "GOMAXPROCS=1") {
		t.Errorf("no GOMAXPROCS=1 in %v", env)
	}
	if env := childEnv(0); slices.ContainsFunc(env, func(kv string) bool { return kv == "GOMAXPROCS=1" }) {
		t.Error("GOMAXPROCS set for a single prober, want the runtime's own")
	}
	t.Setenv("GOMAXPROCS", "4")
	if env := childEnv(1); slices.Contains(env, "GOMAXPROCS=1") || !slices.Contains(env, "GOMAXPROCS=4") {
		t.Errorf("the user's GOMAXPROCS=4 not kept: %v", env)
	}
}

// TestTailKeepsSaturation: the last line in which a prober listed its
// saturation causes is kept however many lines follow, for the step's
// report; the line that says the saturation ended does not replace it.
func TestTailKeepsSaturation(t *testing.T) {
	tail := &tailBuffer{}
	log := slog.New(slog.NewTextHandler(tail, nil))
	if got := tail.lastSaturated(); got != "" {
		t.Fatalf("lastSaturated() = %q before any line, want none", got)
	}
	log.Warn(saturation.LogSaturated, "causes", []string{"ports"}, slog.Group("ports", "used", 25500))
	log.Info(saturation.LogCausesChanged, "causes", []string{"ports", "sched_latency"}, slog.Group("sched_latency", "p99_at_least", "0.05s"))
	log.Info("prober no longer saturated", "causes", []string{"ports", "sched_latency"})
	for i := range 2 * tailLines {
		log.Info("something else", "i", i)
	}
	got := tail.lastSaturated()
	if !strings.Contains(got, saturation.LogCausesChanged) || !strings.Contains(got, "sched_latency.p99_at_least=0.05s") {
		t.Errorf("lastSaturated() = %q, want the causes-changed line with its figures", got)
	}
	log.Warn(saturation.LogSaturated, "causes", []string{"ports"}, "detail", strings.Repeat("x", 2*maxSaturatedLine))
	if n := len(tail.lastSaturated()); n != maxSaturatedLine {
		t.Errorf("a long saturation line kept at %d bytes, want %d", n, maxSaturatedLine)
	}
}
