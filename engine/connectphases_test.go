package engine

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// linkDriver records the Link.Connect of every connect, and whether
// provisioning happened (it has no link to record).
type linkDriver struct {
	*countingDriver
	mu  sync.Mutex
	got []*metrics.ConnectSet
}

func (d *linkDriver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	d.mu.Lock()
	d.got = append(d.got, dev.Link.Connect)
	d.mu.Unlock()
	return d.countingDriver.Connect(ctx, user, dev)
}

// TestConnectTimedInPopulationSeries checks every session's connect is
// given the population's own connect series, so that the connection
// layer's phases land under the population's target and source.
func TestConnectTimedInPopulationSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceCanary)
		d := &linkDriver{countingDriver: newCountingDriver()}
		const users = 3
		p, err := NewPopulation(Options{
			Connection: Connection{Driver: d, Run: "r1", Heartbeat: time.Minute, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond},
			Set:        set, Prefix: "p", Users: users, GroupSize: 2,
			Deadline: 10 * time.Second, LostAfter: 20 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		// Exits when cancel ends ctx.
		go func() { _ = p.Run(ctx); close(done) }()
		waitOnline(t, p, users, time.Minute)
		cancel()
		<-done
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.got) < users {
			t.Fatalf("%d connects, want at least %d", len(d.got), users)
		}
		for i, c := range d.got {
			if c != &set.Connect {
				t.Errorf("connect %d: Link.Connect = %p, want the population's series %p", i, c, &set.Connect)
			}
		}
	})
}
