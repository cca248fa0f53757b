package engine

import (
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
)

// BenchmarkLayoutMemory reports what a population's layout holds per user
// before any session: users, devices, send streams, inboxes and the
// ledger's records, for 19,000 users in groups of 5 (the bench's one
// process). It is the part of an idle session's cost that is imcanary's
// own bookkeeping, apart from the connection's. Live bytes after a
// collection, so that garbage and the heap's slack do not count.
func BenchmarkLayoutMemory(b *testing.B) {
	const users = 19000
	set := metrics.New(prometheus.NewRegistry()).For("b", metrics.SourceBackground)
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for b.Loop() {
		before := live()
		p, err := NewPopulation(Options{
			Connection: Connection{Driver: nopDriver{}, Run: "bench", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, CatchUp: true},
			Set:        set, Prefix: "m", Users: users, GroupSize: 5, Rate: 1,
			Deadline: time.Second, LostAfter: 2 * time.Second,
		})
		if err != nil {
			b.Fatal(err)
		}
		after := live()
		runtime.KeepAlive(p)
		b.ReportMetric(float64(after-before)/users, "B/user")
	}
}
