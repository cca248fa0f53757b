package engine

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// FuzzInboxReceive feeds one inbox a sequence of bodies, one per line of
// the input, 10 ms apart; a line "sweep" sweeps instead. Whatever they
// hold, each body is counted as exactly one outcome (delivered, duplicate
// or one reason of ignored) and reported at most once to the observer as
// that outcome; late and reordered only qualify a delivery; one body never
// books more than maxGap losses; and the inbox stays within its bounds.
// After a final sweep far in the future nothing is pending and only this
// run's streams are kept.
func FuzzInboxReceive(f *testing.F) {
	f.Add([]byte("imc1 run1 alice d.bob 1 1700000000000000000 0-0\n" +
		"imc1 run1 alice d.bob 3 1700000000020000000 0-0\n" +
		"imc1 run1 alice d.bob 2 1700000000010000000 0-0\n" +
		"imc1 run1 alice d.bob 2 1700000000010000000 0-0\n" +
		"sweep\n" +
		"imc1 run1 alice d.bob 6 1700000000030000000 4-5"))
	f.Add([]byte("imc1 run2 carol g.g1 100 1700000000000000000 0-0\n" +
		"imc1 run2 carol g.g1 1048677 1700000000000000000 0-0\n" +
		"imc1 run2 carol g.g1 99 1700000000000000000 0-0\n" +
		"imc1 run2 carol g.g1 300 1700000000000000000 101-299\n" +
		"imc1 run0 dave d.x 1 1600000000000000000 0-0\n" +
		"imc1 run1 alice d.bob 5 1800000000000000000 0-0\n" +
		"imc1 run1 alice d.bob 5 1700000000000000000 5-5\n" +
		"hello"))
	f.Add([]byte("imc1 run1 a g.g 1048577 1700000000000000000 1-1048575\n" +
		"imc1 run1 a g.g 1048578 1700000000000000000 0-18446744073709551614\n" +
		"sweep\nsweep"))
	f.Fuzz(func(t *testing.T, in []byte) {
		set := metrics.New(prometheus.NewPedanticRegistry()).For("fuzz", metrics.SourceBackground)
		l := NewLedger(set, "run1", fuzzStart, time.Second, 3*time.Second)
		obs := &outcomeObserver{}
		l.obs = obs
		inbox := l.NewInbox()
		now := fuzzStart.UnixNano()
		before := readTally(set)
		lines := bytes.Split(in, []byte{'\n'})
		// Each line costs a scrape of every counter; past a few hundred
		// the fuzzer learns nothing new from more of them.
		lines = lines[:min(len(lines), 256)]
		for _, body := range lines {
			now += int64(10 * time.Millisecond)
			if string(body) == "sweep" {
				inbox.Sweep(now)
				after := readTally(set)
				if after.delivered != before.delivered || after.duplicate != before.duplicate || ignoredSum(after) != ignoredSum(before) {
					t.Fatalf("Sweep counted an outcome: %+v, then %+v", before, after)
				}
				before = after
				checkInbox(t, inbox)
				continue
			}
			obs.calls = 0
			inbox.Receive(body, now)
			after := readTally(set)
			d := tally{
				delivered: after.delivered - before.delivered,
				duplicate: after.duplicate - before.duplicate,
				late:      after.late - before.late,
				reordered: after.reordered - before.reordered,
				lost:      after.lost - before.lost,
				saturated: after.saturated - before.saturated,
			}
			ignored := ignoredSum(after) - ignoredSum(before)
			if n := d.delivered + d.duplicate + ignored; n != 1 {
				t.Fatalf("Receive(%q) counted %v outcomes (delivered %v, duplicate %v, ignored %v), want 1",
					body, n, d.delivered, d.duplicate, ignored)
			}
			if d.late > d.delivered || d.reordered > d.delivered || d.saturated != 0 {
				t.Fatalf("Receive(%q) counted late %v, reordered %v, saturated %v for %v deliveries",
					body, d.late, d.reordered, d.saturated, d.delivered)
			}
			if d.lost < 0 || d.lost > maxGap || (d.lost > 0 && d.delivered == 0) {
				t.Fatalf("Receive(%q) wrote off %v messages (delivered %v)", body, d.lost, d.delivered)
			}
			var h probe.Header
			switch {
			case probe.ParseBody(body, &h) != nil:
				if obs.calls != 0 || after.ignored[metrics.IgnoredMalformed] != before.ignored[metrics.IgnoredMalformed]+1 {
					t.Fatalf("Receive(%q) of an unparseable body: %d observer calls, ignored %v, want 0 calls and malformed", body, obs.calls, after.ignored)
				}
			case obs.calls != 1:
				t.Fatalf("Receive(%q) reported %d outcomes to the observer, want 1", body, obs.calls)
			case (obs.last == Delivered) != (d.delivered == 1) ||
				(obs.last == Duplicate) != (d.duplicate == 1) ||
				(obs.last == Ignored) != (ignored == 1):
				t.Fatalf("Receive(%q) told the observer %v but counted delivered %v, duplicate %v, ignored %v",
					body, obs.last, d.delivered, d.duplicate, ignored)
			}
			before = after
			checkInbox(t, inbox)
		}

		// Far enough ahead that every gap is written off and every idle
		// stream of another run evicted.
		inbox.Sweep(now + int64(time.Hour) + l.evict + l.lostAfter)
		checkInbox(t, inbox)
		for key, st := range inbox.streams {
			if len(st.pending) != 0 || !st.own {
				t.Fatalf("after the last sweep stream %q keeps %d pending (own %v)", key, len(st.pending), st.own)
			}
		}
	})
}

func ignoredSum(t tally) float64 {
	var n float64
	for _, v := range t.ignored {
		n += v
	}
	return n
}

// checkInbox checks the inbox's bounds and the ordering its code relies on.
func checkInbox(t *testing.T, in *Inbox) {
	t.Helper()
	if n := len(in.streams); n > maxStreams || int64(n) != in.l.Streams() {
		t.Fatalf("inbox holds %d streams, ledger counts %d, limit %d", n, in.l.Streams(), maxStreams)
	}
	for key, st := range in.streams {
		if len(st.pending) > maxPending || len(st.voids) > maxVoids {
			t.Fatalf("stream %q: %d pending, %d voids", key, len(st.pending), len(st.voids))
		}
		for i, p := range st.pending {
			if p.seq <= st.base || (i > 0 && p.seq <= st.pending[i-1].seq) {
				t.Fatalf("stream %q: pending %v not ascending above base %d", key, st.pending, st.base)
			}
		}
		for i, v := range st.voids {
			if v.lo > v.hi || (i > 0 && v.lo <= st.voids[i-1].hi+1) {
				t.Fatalf("stream %q: voids %v not disjoint and sorted", key, st.voids)
			}
		}
	}
}

// fuzzStart is the ledger start in FuzzInboxReceive: a fixed time, so that
// the seeds' intended times stay meaningful.
var fuzzStart = time.Unix(1_700_000_000, 0)

// outcomeObserver counts what the ledger reports to an observer.
type outcomeObserver struct {
	calls int
	last  Outcome
}

func (o *outcomeObserver) Login(int, time.Duration, error) {}
func (o *outcomeObserver) Disconnect(int, string, error)   {}
func (o *outcomeObserver) Ack(uint64, bool, time.Duration) {}
func (o *outcomeObserver) Unacked(uint64, string, string)  {}
func (o *outcomeObserver) Received(_ int, _ *probe.Header, _ time.Duration, out Outcome) {
	o.calls++
	o.last = out
}

// tally is what one inbox has counted so far, summed over kinds and
// cohorts.
type tally struct {
	delivered, duplicate, late, reordered, lost, saturated float64
	ignored                                                map[string]float64
}

func readTally(set *metrics.Set) tally {
	v := testutil.ToFloat64
	t := tally{ignored: map[string]float64{}}
	for _, k := range set.Kind {
		t.saturated += v(k.Saturated)
		for _, c := range k.Cohort {
			t.delivered += v(c.Delivered)
			t.duplicate += v(c.Duplicate)
			t.late += v(c.Late)
			t.reordered += v(c.Reordered)
			t.lost += v(c.Lost)
		}
	}
	for r, c := range set.Ignored {
		t.ignored[r] = v(c)
	}
	return t
}
