package daemon

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestGCPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		held int64
		want int
	}{
		{0, 100},
		{5 * mib, 100}, // small: Go's default
		{8 * mib, 100},
		{16 * mib, 50}, // room stays paceRoom
		{48 * mib, 17}, // rounded up: never less room than paceRoom
		{160 * mib, paceMinPercent},
		{4 << 30, paceMinPercent}, // huge: a share still, never a cap
	} {
		if got := gcPercent(tc.held, 0); got != tc.want {
			t.Errorf("gcPercent(%d MiB) = %d, want %d", tc.held/mib, got, tc.want)
		}
		// Whatever is held, the room is a share of it: the collector
		// cannot be left without room.
		if room := tc.held * int64(gcPercent(tc.held, 0)) / 100; room < tc.held*paceMinPercent/100 {
			t.Errorf("held %d MiB: room %d bytes, less than %d%% of it", tc.held/mib, room, paceMinPercent)
		}
	}
}

// TestGCPercentFollowsRate: a busy process's room is paceSpan of its
// allocation, up to Go's default; an idle one's stays paceRoom.
func TestGCPercentFollowsRate(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		held int64
		rate float64
		want int
	}{
		{160 * mib, 0, paceMinPercent},
		{160 * mib, 100 << 10, paceMinPercent},                  // 4.4 MiB in 45 s: the least room
		{160 * mib, 1 << 20, 29},                                // 45 MiB of 160
		{160 * mib, 8 << 20, 100},                               // more than is held: Go's default
		{400 * mib, float64(paceRoom) / 45 * 2, paceMinPercent}, // 16 MiB of 400: the floor
	} {
		if got := gcPercent(tc.held, tc.rate); got != tc.want {
			t.Errorf("gcPercent(%d MiB, %.0f B/s) = %d, want %d", tc.held/mib, tc.rate, got, tc.want)
		}
	}
}

func TestPacer(t *testing.T) {
	const mib = 1 << 20
	var held int64
	var sets []int
	p := &pacer{log: slog.New(slog.NewTextHandler(io.Discard, nil)), read: func() int64 { return held },
		set: func(n int) int { sets = append(sets, n); return 0 }, cur: 100}
	// Each step is what is held, then every GOGC set so far.
	for _, step := range []struct {
		why  string
		held int64
		want []int
	}{
		{"a small process keeps Go's default", 5 * mib, nil},
		{"a large one is paced", 200 * mib, []int{paceMinPercent}},
		{"drift of a few MiB changes nothing", 190 * mib, []int{paceMinPercent}},
		{"sessions gone: back towards the default", 10 * mib, []int{paceMinPercent, 80}},
	} {
		held = step.held
		p.pace()
		if !slices.Equal(sets, step.want) {
			t.Fatalf("%s: at %d MiB held, GOGC set to %v, want %v", step.why, held/mib, sets, step.want)
		}
	}
}

func TestPacerLeavesGOGC(t *testing.T) {
	t.Setenv("GOGC", "50")
	if p := newPacer(slog.New(slog.NewTextHandler(io.Discard, nil))); p != nil {
		t.Error("a pacer was made although GOGC is set: the operator's pace must stand")
	}
}

// readHeld reads what the runtime marked: a live heap at the least.
func TestReadHeld(t *testing.T) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if h := readHeld(); h <= 0 || h < int64(ms.HeapAlloc)/2 {
		t.Errorf("held %d bytes with %d allocated after a collection", h, ms.HeapAlloc)
	}
}

// TestPacerRun: the pace follows what is held from the start, and the
// ramp's garbage is returned once, when the population is first ready.
func TestPacerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const mib = 1 << 20
		var held atomic.Int64
		var ready atomic.Bool
		var sets []int
		var frees atomic.Int32
		// allocs grows 100 KiB a second while idle, 8 MiB while busy.
		var allocs atomic.Uint64
		var busy atomic.Bool
		p := &pacer{log: slog.New(slog.NewTextHandler(io.Discard, nil)), read: held.Load,
			set: func(n int) int { sets = append(sets, n); return 0 }, free: func() { frees.Add(1) },
			allocs: allocs.Load, cur: 100}
		stopAlloc := make(chan struct{})
		go func() {
			// Half a period out of step with the pacer's ticker, so
			// that each tick sees exactly one second's allocation: at
			// the same instant, which runs first is up to the
			// scheduler, and a tick that saw none or two made the
			// rate dip (CI, stop 46: GOGC 13 then 12).
			time.Sleep(paceEvery / 2)
			for {
				select {
				case <-stopAlloc:
					return
				case <-time.After(paceEvery):
				}
				if busy.Load() {
					allocs.Add(8 << 20)
				} else {
					allocs.Add(100 << 10)
				}
			}
		}()
		defer close(stopAlloc)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { p.run(ctx, ready.Load); close(done) }()

		held.Store(200 * mib) // ramping: already paced
		time.Sleep(paceEvery + time.Millisecond)
		synctest.Wait()
		if len(sets) != 1 || sets[0] != paceMinPercent || frees.Load() != 0 {
			t.Fatalf("while ramping: GOGC set to %v, %d frees; want %d and none", sets, frees.Load(), paceMinPercent)
		}
		ready.Store(true)
		time.Sleep(5 * paceEvery)
		synctest.Wait()
		if frees.Load() != 1 {
			t.Errorf("%d frees once ready, want 1", frees.Load())
		}
		if len(sets) != 1 {
			t.Errorf("an idle population's pace moved: GOGC set to %v", sets)
		}
		// Busy: 8 MiB a second, 360 MiB in paceSpan, more than the 200
		// held: the pace rises towards Go's default as the average
		// catches up (to within the eighth that pace ignores).
		busy.Store(true)
		time.Sleep(120 * paceEvery)
		synctest.Wait()
		if last := sets[len(sets)-1]; last < 100-100/8 || !slices.IsSorted(sets[1:]) {
			t.Errorf("busy: GOGC set to %v, want it to rise to about 100", sets)
		}
		cancel()
		<-done
	})
}
