package engine

import (
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// A population laid out across shards, each shard a Population of its own
// (its own run, its own metrics), all on one memServer: what one shard
// sends, others receive, and only the sums over the shards balance.

const acrossUsers = 42

// runAcross runs shards populations, each the slice SliceOf(i, shards) of
// one population of 42 users: one group of all 42, and the direct pairs,
// two of which (20-21 and 30-31 with four shards) cross a shard's edge.
func runAcross(t *testing.T, srv *memServer, shards, devices int, opts ...func(i int, o *Options)) []*memRun {
	t.Helper()
	runs := make([]*memRun, shards)
	for i := range runs {
		runs[i] = startAcross(t, srv, fmt.Sprintf("r%d", i), i, shards, devices, opts...)
		if !runs[i].pop.WaitReady(t.Context()) {
			t.Fatalf("shard %d never online", i)
		}
	}
	// Sending starts once every shard's devices are owed other shards'
	// messages, as a soak run across shards starts its send phase after
	// every shard's ramp: the sums balance only over what every device
	// was there to receive.
	time.Sleep(firstOwed)
	for _, r := range runs {
		r.pop.SetSending(true)
	}
	return runs
}

// startAcross starts shard i of shards of the population of runAcross,
// paused, with its own run and metrics, and opts applied to its Options.
// It runs until the test ends, or its stop is called.
func startAcross(t *testing.T, srv *memServer, run string, i, shards, devices int, opts ...func(i int, o *Options)) *memRun {
	t.Helper()
	o := Options{
		Connection: Connection{Driver: srv, Run: run, Heartbeat: 10 * time.Second, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		Set:        metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground),
		Prefix:     "m", Users: acrossUsers, Devices: devices, Groups: []config.GroupSpec{{Count: 1, Size: acrossUsers}}, Rate: 2,
		Deadline: memDeadline, LostAfter: memLost, Slice: SliceOf(i, shards, acrossUsers),
		StartPaused: true, OwedAfterLogin: true,
	}
	for _, f := range opts {
		f(i, &o)
	}
	return startMem(t, srv, o)
}

// settleAcross stops every shard's sending and lets twice lost_after pass.
func settleAcross(runs []*memRun) memTotals {
	for _, r := range runs {
		r.pop.SetSending(false)
	}
	time.Sleep(2 * memLost)
	synctest.Wait()
	var sum memTotals
	for _, r := range runs {
		c := r.totals()
		sum.expected += c.expected
		sum.delivered += c.delivered
		sum.recovered += c.recovered
		sum.lost += c.lost
		sum.late += c.late
		sum.dup += c.dup
		sum.reordered += c.reordered
		sum.unowed += c.unowed
	}
	return sum
}

// TestAcrossShardsBalance: summed over the shards, every delivery a
// sender's shard counted owed is delivered or lost in the shard of its
// recipient, exactly; the lost are exactly the deliveries the server
// dropped, and on a clean server none. The expected include what a
// sender's shard owes to users of the other shards.
func TestAcrossShardsBalance(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dropEvery int // 0: none
		devices   int
	}{{"clean", 0, 1}, {"drop 1 in 100", 100, 1}, {"two devices each, clean", 0, 2}, {"two devices each, drop 1 in 100", 100, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer()
				if tc.dropEvery > 0 {
					srv.setFaults(every(tc.dropEvery, memFault{drop: true}))
				}
				runs := runAcross(t, srv, 4, tc.devices)
				time.Sleep(10 * time.Second)
				// The last drops are followed by clean deliveries
				// of their streams, which reveal them.
				srv.setFaults(nil)
				time.Sleep(2 * time.Second)
				c := settleAcross(runs)
				made := srv.counts()
				t.Logf("summed over 4 shards %+v; server %+v", c, made)
				if c.expected < 5000 {
					t.Fatalf("%v deliveries expected, want thousands", c.expected)
				}
				if n := srv.overflow.Load(); n != 0 {
					t.Fatalf("%d events overflowed a session queue", n)
				}
				if c.lost != float64(made.dropped) || c.delivered+c.lost != c.expected || c.dup+c.unowed+c.recovered != 0 {
					t.Errorf("%+v: want the %d dropped lost, the rest delivered, once", c, made.dropped)
				}
				// Every delivery the server made was owed by
				// the sender's shard, the deliveries to other
				// shards' users (three quarters of the group's)
				// included.
				if c.expected != float64(made.deliveries) {
					t.Errorf("%v expected, the server made %d deliveries: want every one owed", c.expected, made.deliveries)
				}
			})
		})
	}
}

// TestAcrossShardsRestart: one shard of four stops while the others send
// on, and starts again with a new run, its users logging in while the
// others' messages to them keep coming, as a pod of a StatefulSet
// restarts. The others' streams of the old run end without a false count,
// and from the rejoin on a delivery the server drops to any device is
// lost, exactly; on a clean server none. (This server keeps nothing for
// an absent user, so what a restarted shard's devices were sent before
// they logged in never reaches them here; the reference server's offline
// backlog, pushed at the login, is TestRunAcrossShardsRestart's, which
// fails without Inbox.owedFrom.)
func TestAcrossShardsRestart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dropEvery int // 0: none
	}{{"clean", 0}, {"drop 1 in 100", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer()
				runs := runAcross(t, srv, 4, 1)
				time.Sleep(3 * time.Second)
				runs[1].stop()
				// Down longer than lost_after: the others'
				// streams to its users go on without it.
				time.Sleep(2 * memLost)
				runs[1] = startAcross(t, srv, "r1-again", 1, 4, 1)
				runs[1].pop.SetSending(true)
				if !runs[1].pop.WaitReady(t.Context()) {
					t.Fatal("restarted shard never online")
				}
				time.Sleep(2 * firstOwed)
				if tc.dropEvery > 0 {
					srv.setFaults(every(tc.dropEvery, memFault{drop: true}))
				}
				dropped0 := srv.counts().dropped
				time.Sleep(8 * time.Second)
				srv.setFaults(nil)
				time.Sleep(2 * time.Second)
				c := settleAcross(runs)
				made := srv.counts()
				stale := metrics.Value(runs[1].set.Ignored[metrics.IgnoredStale])
				again := runs[1].totals()
				t.Logf("summed over 4 shards %+v; server %+v; the restarted shard %+v, %v stale", c, made, again, stale)
				if dropped := made.dropped - dropped0; c.lost != float64(dropped) || c.late+c.dup+c.recovered != 0 {
					t.Errorf("%+v: want the %d dropped lost, and none late, duplicate or recovered", c, dropped)
				}
				if tc.dropEvery > 0 && c.lost == 0 {
					t.Errorf("nothing lost: the faults never hit")
				}
				if again.delivered == 0 || again.expected == 0 {
					t.Errorf("the restarted shard counted %+v: want it receiving and sending again", again)
				}
			})
		})
	}
}

// TestSliceShardOf: every user of a population laid out across shards
// is in the slice of the shard ShardOf names, for sizes that divide
// evenly and not.
func TestSliceShardOf(t *testing.T) {
	for _, users := range []int{2, 3, 7, 10, 42, 101, 4002} {
		for n := 2; n <= min(users, 9); n++ {
			for i := range n {
				sl := SliceOf(i, n, users)
				for u := sl.Lo; u < sl.Hi; u++ {
					if got := sl.ShardOf(u, users); got != i {
						t.Fatalf("%d users over %d shards: user %d is in shard %d's slice %d-%d, ShardOf says %d", users, n, u, i, sl.Lo, sl.Hi-1, got)
					}
				}
			}
		}
	}
}

// TestAcrossShardsClock: two shards of one population, the second's clock
// 500 ms ahead of the first's. Every delivery takes no time (the bubble's
// clock stands still while the server delivers), so each latency the
// ledgers observe is the skew they failed to correct. With the offsets
// known (Options.ShardClock, as the canary ring measures them) every
// delivery, across the shards too, is observed at 0; with them unknown
// the cross-shard ones are untrusted, counted and not observed; with no
// clock at all the skew goes into the latencies, which is what the
// correction is for.
func TestAcrossShardsClock(t *testing.T) {
	const skew = 500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		clock func(i int) func(shard int, now int64) (int64, bool)
	}{
		{"offsets known", func(i int) func(int, int64) (int64, bool) {
			return func(shard int, _ int64) (int64, bool) {
				// How far the sender's shard is ahead of shard i.
				return int64(skew) * int64(shard-i), true
			}
		}},
		{"offsets unknown", func(int) func(int, int64) (int64, bool) {
			return func(int, int64) (int64, bool) { return 0, false }
		}},
		{"no clock", func(int) func(int, int64) (int64, bool) { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newMemServer()
				untrusted := []prometheus.Counter{prometheus.NewCounter(prometheus.CounterOpts{Name: "u0"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "u1"})}
				runs := runAcross(t, srv, 2, 1, func(i int, o *Options) {
					o.TestClockOffset = time.Duration(i) * skew
					o.ShardClock, o.ShardClockUntrusted = tc.clock(i), untrusted[i]
				})
				time.Sleep(5 * time.Second)
				c := settleAcross(runs)
				if c.delivered < 1000 || c.lost != 0 {
					t.Fatalf("%+v: want thousands delivered, none lost", c)
				}
				for i, r := range runs {
					n, sum := r.latencies()
					un := metrics.Value(untrusted[i])
					delivered := r.totals().delivered
					t.Logf("shard %d: %v delivered, %d latencies observed summing %.3f s, %v untrusted", i, delivered, n, sum, un)
					switch tc.name {
					case "offsets known":
						if float64(n) != delivered || math.Abs(sum) > 1e-6 || un != 0 {
							t.Errorf("shard %d: %d observed summing %.6f s, %v untrusted, of %v delivered: want every one observed at 0", i, n, sum, un, delivered)
						}
					case "offsets unknown":
						if un == 0 || float64(n)+un != delivered || math.Abs(sum) > 1e-6 {
							t.Errorf("shard %d: %d observed summing %.6f s, %v untrusted, of %v delivered: want the cross-shard ones untrusted, the rest at 0", i, n, sum, un, delivered)
						}
					case "no clock":
						if float64(n) != delivered || math.Abs(sum) < 1 {
							t.Errorf("shard %d: %d observed summing %.6f s, of %v delivered: want the skew in them", i, n, sum, delivered)
						}
					}
				}
			})
		})
	}
}

// marked is a delivery of another shard's stream in a scripted test: seq,
// intended at start+at and received 5 ms later, with the resolved mark
// and off mask the sender wrote into it.
type marked struct {
	seq, resolved, off uint64
	at                 time.Duration
}

// TestInboxMarks: a receiver of another shard's stream counts a delivery
// only once the sender's marks say what became of it: delivered when
// acknowledged, unowed when written off; the last ones, which no later
// message covers, once lost_after has passed with none; the stream is
// owed from seq 1 when it began after the ledger did, and from the first
// message seen otherwise.
func TestInboxMarks(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		begun time.Duration // the stream's seq 1, from the ledger's start
		got   []marked
		// before is what is counted before the sweep past lost_after,
		// after what is counted once it has run.
		before, after struct{ delivered, unowed, lost float64 }
	}{
		{
			name: "acknowledged, covered by the next",
			got:  []marked{{seq: 1, at: 10 * ms}, {seq: 2, resolved: 1, at: 20 * ms}, {seq: 3, resolved: 2, at: 30 * ms}},
			// 3 is covered by nothing: held until the sweep.
			before: struct{ delivered, unowed, lost float64 }{2, 0, 0},
			after:  struct{ delivered, unowed, lost float64 }{3, 0, 0},
		},
		{
			name:   "written off yet delivered",
			got:    []marked{{seq: 1, at: 10 * ms}, {seq: 2, at: 20 * ms}, {seq: 3, resolved: 2, off: 1, at: 30 * ms}, {seq: 4, resolved: 3, off: 2, at: 40 * ms}},
			before: struct{ delivered, unowed, lost float64 }{2, 1, 0},
			after:  struct{ delivered, unowed, lost float64 }{3, 1, 0},
		},
		{
			// The off mask of a missed message is repeated by the
			// next: 2 was written off, and the news comes with 4.
			name:   "written off, the news one message late",
			got:    []marked{{seq: 1, at: 10 * ms}, {seq: 2, at: 20 * ms}, {seq: 4, resolved: 3, off: 2, at: 40 * ms}},
			before: struct{ delivered, unowed, lost float64 }{1, 1, 0},
			// 3 never came, and was acknowledged: lost.
			after: struct{ delivered, unowed, lost float64 }{2, 1, 1},
		},
		{
			name:   "written off and never delivered: not lost",
			got:    []marked{{seq: 1, at: 10 * ms}, {seq: 3, resolved: 2, off: 1, at: 30 * ms}, {seq: 4, resolved: 3, at: 40 * ms}},
			before: struct{ delivered, unowed, lost float64 }{2, 0, 0},
			after:  struct{ delivered, unowed, lost float64 }{3, 0, 0},
		},
		{
			name:   "began after the ledger: owed from seq 1",
			begun:  time.Millisecond,
			got:    []marked{{seq: 3, resolved: 2, at: 30 * ms}, {seq: 4, resolved: 3, at: 40 * ms}},
			before: struct{ delivered, unowed, lost float64 }{1, 0, 0},
			after:  struct{ delivered, unowed, lost float64 }{2, 0, 2},
		},
		{
			name:   "began before the ledger: owed from the first seen",
			begun:  -time.Millisecond,
			got:    []marked{{seq: 3, resolved: 2, at: 30 * ms}, {seq: 4, resolved: 3, at: 40 * ms}},
			before: struct{ delivered, unowed, lost float64 }{1, 0, 0},
			after:  struct{ delivered, unowed, lost float64 }{2, 0, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := newTestSet(t)
			start := time.Unix(1000, 0)
			l := NewLedger(set, "me", start, testDeadline, testLostAfter)
			in := l.NewInbox()
			for _, m := range tc.got {
				b := probe.AppendBody(nil, &probe.Header{
					Run: []byte("other"), Sender: []byte("alice"), Stream: []byte("g.room"), Seq: m.seq,
					Intended: start.Add(m.at).UnixNano(), HasResolved: true, Resolved: m.resolved, OffMask: m.off,
					Begun: start.Add(tc.begun).UnixNano(),
				}, 0)
				in.Receive(b, start.Add(m.at+5*ms).UnixNano())
			}
			k := set.Kind[metrics.Group].Cohort[metrics.Normal]
			read := func() struct{ delivered, unowed, lost float64 } {
				return struct{ delivered, unowed, lost float64 }{metrics.Value(k.Delivered), metrics.Value(k.Unowed), metrics.Value(k.Lost)}
			}
			in.Sweep(start.Add(100 * ms).UnixNano())
			if got := read(); got != tc.before {
				t.Errorf("before lost_after: %+v, want %+v", got, tc.before)
			}
			in.Sweep(start.Add(100*ms + testLostAfter + ms).UnixNano())
			if got := read(); got != tc.after {
				t.Errorf("after lost_after: %+v, want %+v", got, tc.after)
			}
		})
	}
}

// TestAcrossShardsSyncs: a device that receives from another shard's
// sender is always owed a sync (with catch-up, the sync finds the gap at
// the end of a conversation that no later push reveals), since this
// process never sees that sender's acks; one whose conversations all stay
// in its shard is owed one only for what its shard's senders had
// acknowledged.
func TestAcrossShardsSyncs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups []config.GroupSpec
		slice  Slice
		want   bool
	}{
		{"a group spanning the shards", []config.GroupSpec{{Count: 1, Size: 40}}, SliceOf(0, 2, 40), true},
		{"groups within the shard", []config.GroupSpec{{Count: 10, Size: 4}}, SliceOf(0, 2, 40), false},
		{"one shard of its own", []config.GroupSpec{{Count: 1, Size: 40}}, Slice{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPopulation(Options{
				Connection: Connection{Driver: newMemServer(), Run: "r", Heartbeat: time.Second, BackoffMin: time.Millisecond, BackoffMax: time.Second},
				Set:        newTestSet(t), Prefix: "m", Users: 40, Groups: tc.groups, Rate: 1,
				Deadline: time.Second, LostAfter: 2 * time.Second, Slice: tc.slice,
			})
			if err != nil {
				t.Fatal(err)
			}
			sl := p.Slice()
			for i := sl.Lo; i < sl.Hi; i++ {
				if got := p.owes(p.users[i].devices[0]); got != tc.want {
					t.Fatalf("user %d: owes a sync %v before anything was sent, want %v", i, got, tc.want)
				}
			}
		})
	}
}
