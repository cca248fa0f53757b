package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The garbage collector's pace for a process that holds many idle sessions.
//
// Why: an idle prober allocates little (a ping, a pong and a timer per
// session and heartbeat: well under a megabyte a second at 19,000 sessions)
// but holds much, a live heap and a goroutine stack per session, all of
// which every collection marks. What a collection costs is set by what is
// held; how often one runs, by the room left for garbage. A soft memory
// limit set near what is held leaves that room to chance: when the sessions
// weigh more than it assumed, the room shrinks to nothing and collections
// follow one another (measured 2026-12-04 with the limit imcanary used to
// set: 165 collections a minute and 0.6 of a core for 19,000 idle sessions,
// 87% of it the collector, worse with a larger GOMAXPROCS). So imcanary
// sets no memory limit. It sets GOGC, which keeps the room a share of what
// is held: the runtime's heap goal is the live heap plus (live heap +
// stacks + globals) × GOGC/100, so the collector's work per byte allocated
// stays bounded by that share whatever the sessions weigh.
//
// The share is Go's default of 100 while what is held is small, and falls
// as it grows so that the room stays paceRoom, down to paceMinPercent: a
// large idle prober holds a tenth more than it needs instead of twice as
// much, and collects about once a minute.
const (
	// paceRoom is the room for garbage aimed at. 19,000 idle sessions
	// allocate about 175 KB/s (2026-12-06), so it is 45 s of theirs, a
	// collection of 0.08 s of CPU each; 16 MiB, before, kept about
	// 480 B more RSS a session for 0.1 µs less CPU a session-second.
	paceRoom = 8 << 20
	// paceSpan is how long the room is to last at the rate the process
	// allocates, once its population is online: a busy prober's room
	// grows with its garbage, up to Go's default pace, instead of
	// collecting every second or two. 10,000 sessions at 20,000
	// deliveries/s collected 18 times a minute with 16 MiB of room and
	// 36-39 with 8 (GC share 6% against 10-14%, 2026-12-06).
	paceSpan = 45 * time.Second
	// paceRateWeight is the weight of each second's allocation in the
	// rate: an average over about half a minute, so that one burst does
	// not swing the pace.
	paceRateWeight = 1.0 / 30
	// paceMinPercent is the least GOGC set: ten times Go's default pace
	// of collection per byte allocated at the most. Little for a prober,
	// whose delivery path allocates nothing; and a fifth, tried first,
	// left 19,000 idle sessions at 12.5 KiB each (2026-12-04).
	paceMinPercent = 10
	// paceEvery is how often the pace is checked, and readiness before
	// the first.
	paceEvery = time.Second
)

// gcPercent is the GOGC for a process whose collections mark held bytes
// (live heap, stacks and globals) and that allocates rate bytes a second
// (0 while it ramps: see PaceCollector).
func gcPercent(held int64, rate float64) int {
	if held <= 0 {
		return 100
	}
	room := max(int64(paceRoom), int64(rate*paceSpan.Seconds()))
	p := (100*room + held - 1) / held
	return int(min(max(p, paceMinPercent), 100))
}

// readAllocs reads how many bytes the process has allocated in all.
func readAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// readHeld reads what the last collection marked: the live heap, the
// goroutine stacks and the globals.
func readHeld() int64 {
	s := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}
	metrics.Read(s)
	var held int64
	for _, x := range s {
		if x.Value.Kind() == metrics.KindUint64 {
			held += int64(x.Value.Uint64())
		}
	}
	return held
}

// pacer keeps GOGC at gcPercent of what is held.
type pacer struct {
	log  *slog.Logger
	read func() int64
	set  func(int) int
	free func()
	cur  int
	// allocs reads the bytes allocated in all; rate is their average
	// per second once the population is online, 0 before (metered).
	allocs  func() uint64
	metered bool
	last    uint64
	rate    float64
}

// newPacer returns nil when GOGC is set: the operator's pace stands. A
// GOMEMLIMIT is the operator's too, and the runtime applies it.
func newPacer(log *slog.Logger) *pacer {
	if lim := os.Getenv("GOMEMLIMIT"); lim != "" {
		log.Info("memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
	}
	if v := os.Getenv("GOGC"); v != "" {
		log.Info("collector's pace from GOGC", "gogc", v)
		return nil
	}
	return &pacer{log: log, read: readHeld, set: debug.SetGCPercent, free: debug.FreeOSMemory, allocs: readAllocs, cur: 100}
}

// pace sets GOGC once, when it has moved enough to matter.
func (p *pacer) pace() {
	if p.metered {
		now := p.allocs()
		p.rate += (float64(now-p.last)/paceEvery.Seconds() - p.rate) * paceRateWeight
		p.last = now
	}
	held := p.read()
	want := gcPercent(held, p.rate)
	// An eighth either way is not worth a change: held bytes drift with
	// every login and message in flight.
	if d := want - p.cur; max(d, -d) < max(p.cur/8, 1) {
		return
	}
	p.set(want)
	p.log.Debug("collector's pace", "gogc", want, "held_bytes", held, "alloc_bytes_per_second", int64(p.rate))
	p.cur = want
}

// PaceCollector keeps the Go collector's GOGC at a share of what the
// process holds that leaves it room for paceSpan of its garbage, 8 MiB
// at the least (see gcPercent), until ctx ends. With GOGC set it only logs it. It sets
// process-wide state, so it is the command's to call, not the Daemon's.
//
// The pace holds from the start, the ramp included: a ramp's garbage
// (dials, upgrades, logins) is allocated between the sessions' long-lived
// objects, and left to Go's default pace it fills spans that one live
// object then keeps (19,000 sessions: 148 MB of heap in use against 133 MB
// paced from the start, with the same ramp time), so the ramp is paced at
// the least room. Once ready() is true, one collection returns what the
// ramp left to the system (an idle prober may not collect again for a
// minute, and the scavenger is slow), and the room follows the rate.
func PaceCollector(ctx context.Context, ready func() bool, log *slog.Logger) {
	if p := newPacer(log); p != nil {
		p.run(ctx, ready)
	}
}

// run paces until ctx ends.
func (p *pacer) run(ctx context.Context, ready func() bool) {
	tick := time.NewTicker(paceEvery)
	defer tick.Stop()
	started := false
	for {
		p.pace()
		if !started && ready() {
			started = true
			p.free()
			// From now on the room follows the allocation rate; a
			// ramp's, high and brief, is left out of it.
			p.metered, p.last = p.allocs != nil, 0
			if p.metered {
				p.last = p.allocs()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
