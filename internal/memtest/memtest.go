// Package memtest measures what a process holds, for the memory
// benchmarks: the Go heap and stacks in use and the resident set after a
// collection, and the heap profile of what is live.
package memtest

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
)

// Now returns the Go heap in use, goroutine stacks, and the resident set
// size. It first collects and returns freed pages (FreeOSMemory), so that
// RSS shows what is held, not what a ramp used on the way.
func Now() (heap, stack, rss int64) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap, stack = int64(ms.HeapInuse), int64(ms.StackInuse)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			rss = pages * int64(os.Getpagesize())
		}
	}
	return heap, stack, rss
}

// WriteHeapProfile writes the heap profile of what is live now to name:
// a -memprofile is written at the end, after what was measured is gone.
func WriteHeapProfile(tb testing.TB, name string) {
	tb.Helper()
	f, err := os.Create(name)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
