package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/imcanary/imcanary/config"
)

// The Go runtime's soft memory limit, sized from the sessions the
// configuration holds.
//
// Why: by default a collection starts when the heap (with stacks) has grown
// to twice what the last one left live. A process of 19,000 idle sessions
// keeps about 9.5 KiB live per session (a 4 KiB read-loop stack, 4 KiB of
// connection, buffers and ledger state, runtime overhead) and so settles at
// 16 KiB of resident memory per session, most of it room for garbage that
// idle sessions hardly make. A limit a little above what the sessions need
// makes the collector run before that room is taken, and the scavenger
// returns the rest to the system.
//
// The limit never forces the collector to run all the time: it is raised to
// stay a quarter of the live heap above what is live (see memoryFloor), so a
// protocol whose sessions weigh more than the estimate, or a burst of
// messages in flight, costs a little more memory, not a collector that eats
// the CPU and makes the prober's own numbers lie. GOMEMLIMIT, when set, is
// the operator's and is left alone.
const (
	// memBase is what a prober holds before its sessions: 20 MiB
	// measured (imcanary bench's baseline), with room for reports and
	// HTTP scrapes.
	memBase = 24 << 20
	// memPerSession is the estimate for one session: 9.5 KiB measured
	// live (BenchmarkSessionMemory) and room for its garbage.
	memPerSession = 11 << 10
	// memPerInflight is the ledger's cost of one delivery expected and
	// not yet resolved, generously.
	memPerInflight = 256
	// memRetune is how often the floor is checked, and readiness before
	// the first limit.
	memRetune = time.Second
)

// sizedMemoryLimit returns the memory limit for cfg: the sessions of every
// population that may run at once (sessions), and the deliveries in flight
// at the background population's rate over its lost_after.
func sizedMemoryLimit(cfg config.Config, sessions int) int64 {
	p := cfg.Population
	fanout := 1.0
	if p.GroupSize > 1 {
		// Sends alternate direct (1 recipient) and group (size-1).
		fanout = float64(p.GroupSize) / 2
	}
	// Each recipient device is owed its own copy.
	inflight := float64(p.Users) * p.Rate * fanout * float64(max(p.Devices, 1)) * p.LostAfter.Seconds()
	return memBase + int64(sessions)*memPerSession + int64(inflight)*memPerInflight
}

// memReading is what the floor is computed from, in bytes.
type memReading struct {
	// Total is every byte the runtime has mapped and not released: close
	// to the resident set.
	Total int64
	// HeapSlack is the heap's objects, free and unused space: the part a
	// collection can shrink.
	HeapSlack int64
	// HeapLive is the heap the last collection left live.
	HeapLive int64
}

// memoryFloor is the lowest limit that leaves the collector room: the
// runtime's fixed part (stacks, metadata), the live heap and a quarter of it
// more, and 8 MiB.
func memoryFloor(r memReading) int64 {
	fixed := max(r.Total-r.HeapSlack, 0)
	return fixed + r.HeapLive + r.HeapLive/4 + 8<<20
}

// readMemory reads r from runtime/metrics.
func readMemory() memReading {
	s := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(s[i].Value.Uint64())
	}
	return memReading{
		Total:     v(0) - v(1),
		HeapSlack: v(2) + v(3) + v(4),
		HeapLive:  v(5),
	}
}

// memoryTuner keeps the runtime's memory limit at the sized value, raised
// to the floor when what is live needs more.
type memoryTuner struct {
	sized func() int64
	log   *slog.Logger
	read  func() memReading
	set   func(int64) int64
	cur   int64
}

// newMemoryTuner returns nil when GOMEMLIMIT is set: the operator's limit
// stands.
func newMemoryTuner(sized func() int64, log *slog.Logger) *memoryTuner {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
		return nil
	}
	return &memoryTuner{sized: sized, log: log, read: readMemory, set: debug.SetMemoryLimit}
}

// tune sets the limit once.
func (t *memoryTuner) tune() {
	sized := t.sized()
	limit := max(sized, memoryFloor(t.read()))
	// Small moves are not worth a log line or a change of pace.
	if t.cur != 0 && abs(limit-t.cur) < t.cur/16 {
		return
	}
	t.set(limit)
	if t.cur == 0 || limit > t.cur {
		t.log.Info("memory limit", "bytes", limit, "sized", sized)
	}
	t.cur = limit
}

// TuneMemory keeps the Go runtime's memory limit at sized (see
// Daemon.MemoryLimit), raised when what is live needs more room, until ctx
// ends. With GOMEMLIMIT set it only logs that limit. It sets process-wide
// state, so it is the command's to call, not the Daemon's.
//
// The limit is first set once ready() is true: a ramp makes garbage at the
// pace of its logins, and a collector held to the limit then would slow the
// ramp for memory that is returned minutes later anyway.
func TuneMemory(ctx context.Context, sized func() int64, ready func() bool, log *slog.Logger) {
	if t := newMemoryTuner(sized, log); t != nil {
		t.run(ctx, ready)
	}
}

// run tunes the limit until ctx ends.
func (t *memoryTuner) run(ctx context.Context, ready func() bool) {
	tick := time.NewTicker(memRetune)
	defer tick.Stop()
	for {
		if t.cur != 0 || ready() {
			t.tune()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
