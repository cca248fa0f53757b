package daemon

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
)

func TestSizedMemoryLimit(t *testing.T) {
	idle := config.Config{Population: config.Population{Users: 19000, GroupSize: 5, LostAfter: 10 * time.Second}}
	busy := idle
	busy.Population.Rate = 2
	for _, tc := range []struct {
		name     string
		cfg      config.Config
		sessions int
		want     int64
	}{
		{"no sessions", config.Config{}, 0, memBase},
		{"idle sessions", idle, 19000, memBase + 19000*memPerSession},
		// 19,000 users × 2/s × 2.5 recipients on average × 10 s.
		{"deliveries in flight", busy, 19000, memBase + 19000*memPerSession + 950000*memPerInflight},
	} {
		if got := sizedMemoryLimit(tc.cfg, tc.sessions); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The budget the performance goal sets: 12 KiB of resident memory
	// per session over the prober's own.
	if per := (sizedMemoryLimit(idle, 19000) - 20<<20) / 19000; per > 12<<10 {
		t.Errorf("limit allows %d bytes per idle session, over the 12 KiB budget", per)
	}
}

func TestMemoryTuner(t *testing.T) {
	const mib = 1 << 20
	var reading memReading
	var sets []int64
	tu := &memoryTuner{sized: func() int64 { return 200 * mib }, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		read: func() memReading { return reading },
		set:  func(n int64) int64 { sets = append(sets, n); return 0 }}

	// Sessions as estimated: 90 MiB fixed (stacks), 80 MiB live heap.
	reading = memReading{Total: 190 * mib, HeapSlack: 100 * mib, HeapLive: 80 * mib}
	tu.tune()
	if len(sets) != 1 || sets[0] != 200*mib {
		t.Fatalf("limits set %v, want the sized 200 MiB", sets)
	}
	// A protocol heavier than estimated: the limit leaves a quarter of
	// the live heap as room, not a collector that never stops.
	reading = memReading{Total: 300 * mib, HeapSlack: 170 * mib, HeapLive: 160 * mib}
	tu.tune()
	if want := int64(130*mib + 200*mib + 8*mib); len(sets) != 2 || sets[1] != want {
		t.Fatalf("limits set %v, want %d last (fixed + 1.25 × live + 8 MiB)", sets, want)
	}
	// Small moves change nothing.
	reading.HeapLive += mib
	tu.tune()
	if len(sets) != 2 {
		t.Errorf("limits set %v after a 1 MiB change, want no new one", sets)
	}
	// Once what was live is gone, back to the sized limit.
	reading = memReading{Total: 150 * mib, HeapSlack: 60 * mib, HeapLive: 40 * mib}
	tu.tune()
	if len(sets) != 3 || sets[2] != 200*mib {
		t.Errorf("limits set %v, want the sized 200 MiB again", sets)
	}
}

func TestMemoryTunerLeavesGOMEMLIMIT(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	if tu := newMemoryTuner(func() int64 { return 100 << 20 }, slog.New(slog.NewTextHandler(io.Discard, nil))); tu != nil {
		t.Error("a tuner was made although GOMEMLIMIT is set: the operator's limit must stand")
	}
}

// readMemory reads what the runtime reports: a process has a live heap
// (once a collection has measured it) and maps more than it.
func TestReadMemory(t *testing.T) {
	runtime.GC()
	r := readMemory()
	if r.HeapLive <= 0 || r.Total <= r.HeapLive || r.HeapSlack <= 0 || r.HeapSlack > r.Total {
		t.Errorf("reading %+v: want 0 < live < total and 0 < slack <= total", r)
	}
}
