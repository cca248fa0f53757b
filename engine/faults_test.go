package engine

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/metrics"
)

// The ledger against faults of a known size, made by an in-memory server
// under testing/synctest: every time is the bubble's, so each fault is
// counted exactly, as what it is, and nothing else is counted at all.

// memRun is a population on a memServer.
type memRun struct {
	srv *memServer
	pop *Population
	set *metrics.Set
	// stop, if set, ends the population's Run and waits for it.
	stop func()
}

const (
	memUsers    = 12
	memDeadline = time.Second
	memLost     = 3 * time.Second
)

// runMem runs a population of 12 users in groups of 4, each sending 5
// messages a second, on srv, until the bubble's test ends.
func runMem(t *testing.T, srv *memServer) *memRun {
	t.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	r := startMem(t, srv, Options{
		Connection: Connection{Driver: srv, Run: "r1", Heartbeat: 10 * time.Second, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		Set:        set, Prefix: "m", Users: memUsers, GroupSize: 4, Rate: 5,
		Deadline: memDeadline, LostAfter: memLost,
	})
	if !r.pop.WaitReady(t.Context()) {
		t.Fatal("population never online")
	}
	return r
}

// startMem starts the population of o, whose Set it records into, on
// srv. It runs until the test ends, or its stop is called.
func startMem(t *testing.T, srv *memServer, o Options) *memRun {
	t.Helper()
	r := &memRun{srv: srv, set: o.Set}
	var err error
	if r.pop, err = NewPopulation(o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		_ = r.pop.Run(ctx)
		close(done)
	}()
	r.stop = func() { cancel(); <-done }
	t.Cleanup(r.stop)
	return r
}

// settle stops sending and lets twice lost_after pass, so that every owed
// delivery is delivered or written off.
func (r *memRun) settle() memTotals {
	r.pop.SetSending(false)
	time.Sleep(2 * memLost)
	synctest.Wait()
	return r.totals()
}

type memTotals struct {
	expected, delivered, recovered, lost, late, dup, reordered, unowed float64
}

func (r *memRun) totals() memTotals {
	var c memTotals
	for _, k := range r.set.Kind {
		rs := k.Cohort[metrics.Normal]
		c.expected += metrics.Value(rs.Expected)
		c.delivered += metrics.Value(rs.Delivered)
		c.recovered += metrics.Value(rs.Recovered)
		c.lost += metrics.Value(rs.Lost)
		c.late += metrics.Value(rs.Late)
		c.dup += metrics.Value(rs.Duplicate)
		c.reordered += metrics.Value(rs.Reordered)
		c.unowed += metrics.Value(rs.Unowed)
	}
	return c
}

// latencies returns the delivery latencies' count and their sum.
func (r *memRun) latencies() (n uint64, sum float64) {
	for _, k := range r.set.Kind {
		var m dto.Metric
		_ = k.Cohort[metrics.Normal].DeliveryLatency.(prometheus.Metric).Write(&m)
		n += m.Histogram.GetSampleCount()
		sum += m.Histogram.GetSampleSum()
	}
	return n, sum
}

// every returns a fault decider that hits every nth delivery.
func every(n int, f memFault) func(memDelivery) memFault {
	i := 0
	return func(memDelivery) memFault {
		i++
		if i%n == 0 {
			return f
		}
		return memFault{}
	}
}

func TestMemFaultsCountedExactly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every int // the fault hits every nth delivery
		fault memFault
		// check says what the ledger must have counted, given what the
		// server did.
		check func(t *testing.T, c memTotals, made memCounts)
	}{
		{"none", 1, memFault{}, func(t *testing.T, c memTotals, _ memCounts) {
			if c.delivered != c.expected || c.lost+c.late+c.dup+c.reordered+c.recovered != 0 {
				t.Errorf("%+v: want every expected delivery delivered once, in order, on time", c)
			}
		}},
		{"drop", 10, memFault{drop: true}, func(t *testing.T, c memTotals, made memCounts) {
			if c.lost != float64(made.dropped) || c.delivered+c.lost != c.expected {
				t.Errorf("%+v: want the %d dropped lost, the rest delivered", c, made.dropped)
			}
		}},
		{"duplicate", 10, memFault{dup: true}, func(t *testing.T, c memTotals, made memCounts) {
			if c.dup != float64(made.duplicated) || c.delivered != c.expected || c.lost != 0 {
				t.Errorf("%+v: want the %d duplicated counted duplicates, every delivery delivered", c, made.duplicated)
			}
		}},
		{"reorder", 10, memFault{hold: true}, func(t *testing.T, c memTotals, made memCounts) {
			if c.reordered != float64(made.held) || c.delivered != c.expected || c.lost+c.dup != 0 {
				t.Errorf("%+v: want the %d held back counted reordered, every delivery delivered", c, made.held)
			}
		}},
		// Every delivery delayed alike keeps their order.
		{"delay within the deadline", 1, memFault{delay: memDeadline / 2}, func(t *testing.T, c memTotals, made memCounts) {
			if c.delivered != c.expected || c.late+c.lost+c.reordered != 0 {
				t.Errorf("%+v: want %d delayed deliveries delivered on time", c, made.delayed)
			}
		}},
		{"delay past the deadline", 1, memFault{delay: 2 * memDeadline}, func(t *testing.T, c memTotals, made memCounts) {
			if c.late != float64(made.delayed) || c.delivered != c.expected || c.lost+c.reordered != 0 {
				t.Errorf("%+v: want the %d delayed past the deadline late, not lost", c, made.delayed)
			}
		}},
		// One delayed past the next of its stream arrives after it.
		{"delay past the next", 10, memFault{delay: 2 * memDeadline}, func(t *testing.T, c memTotals, made memCounts) {
			if c.late != float64(made.delayed) || c.reordered != float64(made.delayed) || c.delivered != c.expected || c.lost != 0 {
				t.Errorf("%+v: want the %d delayed late and reordered, none lost", c, made.delayed)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer()
				srv.setFaults(every(tc.every, tc.fault))
				r := runMem(t, srv)
				time.Sleep(10 * time.Second)
				if tc.every > 1 {
					// The last faults are followed by clean
					// deliveries of their conversations, which
					// reveal them. A fault on every delivery stays:
					// a clean one would overtake the last delayed.
					srv.setFaults(nil)
					time.Sleep(2 * time.Second)
				}
				c := r.settle()
				made := srv.counts()
				t.Logf("%+v; server %+v", c, made)
				if c.expected < 1000 {
					t.Fatalf("%v deliveries expected, want over a thousand", c.expected)
				}
				if n := srv.overflow.Load(); n != 0 {
					t.Fatalf("%d events overflowed a session queue", n)
				}
				tc.check(t, c, made)
			})
		})
	}
}

// TestMemLatencyIsTheDelay: with every delivery delayed by the same amount
// and nothing else in the way, every delivery's latency is that delay, to
// the nanosecond: the ledger measures from the intended send time to the
// read, and the bubble's clock does not move in between.
func TestMemLatencyIsTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 300 * time.Millisecond
		srv := newMemServer()
		srv.setFaults(func(memDelivery) memFault { return memFault{delay: delay} })
		r := runMem(t, srv)
		time.Sleep(5 * time.Second)
		c := r.settle()
		n, sum := r.latencies()
		t.Logf("%+v; %d latencies, sum %v s", c, n, sum)
		if n == 0 || float64(n) != c.delivered {
			t.Fatalf("%d latencies observed for %v deliveries", n, c.delivered)
		}
		if mean := sum / float64(n); math.Abs(mean-delay.Seconds()) > 1e-9 {
			t.Errorf("mean latency %v s, want exactly the delay %v", mean, delay)
		}
	})
}

// TestMemStallIsLagging: the server stops delivering to one user without
// closing its session, as Tinode does to a slow session. The session stays
// online and nothing is lost yet, so only the lag can show it: it is
// flagged lagging within one deadline, the only one, and clears once
// deliveries come again.
func TestMemStallIsLagging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newMemServer()
		r := runMem(t, srv)
		time.Sleep(time.Second)
		if n := metrics.Value(r.set.SessionsLagging); n != 0 {
			t.Fatalf("before the stall: sessions lagging = %v, want 0", n)
		}
		const stalled = "m-u7"
		srv.setFaults(func(d memDelivery) memFault { return memFault{drop: d.to == stalled} })
		began := time.Now()
		for metrics.Value(r.set.SessionsLagging) == 0 && time.Since(began) <= memDeadline {
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(began)
		if n := metrics.Value(r.set.SessionsLagging); n != 1 {
			t.Fatalf("sessions lagging = %v %v after the stall, want exactly the stalled one within the deadline (%v)", n, took, memDeadline)
		}
		if lost := r.totals().lost; lost != 0 {
			t.Errorf("lost = %v when the stall was flagged, want 0: lag must come first", lost)
		}
		for _, reason := range metrics.DisconnectReasons {
			if n := metrics.Value(r.set.Disconnects[reason]); n != 0 {
				t.Errorf("%s disconnects = %v, want 0: the stall closes nothing", reason, n)
			}
		}
		srv.setFaults(nil)
		time.Sleep(2 * memDeadline)
		if n := metrics.Value(r.set.SessionsLagging); n != 0 {
			t.Errorf("sessions lagging = %v two deadlines after the stall ended, want 0", n)
		}
		t.Logf("stall flagged after %v (deadline %v)", took, memDeadline)
	})
}
