package bench

import (
	"slices"
	"testing"
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
