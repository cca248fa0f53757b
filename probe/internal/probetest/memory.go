package probetest

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// InboxHandler is a Handler that hands every delivery to an inbox of the
// ledger, as the population does: the end of a frame-to-ledger benchmark.
type InboxHandler struct{ In *engine.Inbox }

func (h InboxHandler) OnAck(uint64, probe.Ack)      {}
func (h InboxHandler) OnReject(uint64, string)      {}
func (h InboxHandler) OnDelivery(d *probe.Delivery) { h.In.Receive(d.Body, d.At) }

// SessionMemory brings n idle users of drv online (users PREFIX-uN, in
// groups of 5, sending nothing, keepalive an hour apart) and returns what
// each session costs this process once all are: Go heap and goroutine
// stacks, per session. Provisioning may register users on the server: the
// wait for them is bounded by n.
func SessionMemory(tb testing.TB, drv probe.Driver, prefix string, n int) (heapPer, stackPer float64) {
	tb.Helper()
	set := metrics.New(prometheus.NewRegistry()).For("bench", metrics.SourceBackground)
	pop, err := engine.NewPopulation(engine.Options{
		Connection: engine.Connection{Driver: drv, Run: "bench", Heartbeat: time.Hour,
			BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second},
		Set: set, Prefix: prefix, Users: n, GroupSize: 5, Deadline: time.Second, LostAfter: 2 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	h0, s0 := memNow()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = pop.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	limit := 60*time.Second + time.Duration(n)*200*time.Millisecond
	testwait.Every(tb, limit, 20*time.Millisecond, fmt.Sprintf("%d sessions online", n), pop.Ready)
	// Whatever the logins left behind settles.
	testwait.Traffic(pop, time.Second)
	h1, s1 := memNow()
	return float64(h1-h0) / float64(n), float64(s1-s0) / float64(n)
}

func memNow() (heap, stack int64) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse), int64(ms.StackInuse)
}
