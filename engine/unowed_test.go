package engine

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// owedCounts are one kind's expected, delivered, recovered, unowed, lost and
// duplicate counts of the normal cohort.
type owedCounts struct{ expected, delivered, recovered, unowed, lost, dup float64 }

func readOwed(set *metrics.Set, k metrics.Kind) owedCounts {
	c := set.Kind[k].Cohort[metrics.Normal]
	return owedCounts{
		testutil.ToFloat64(c.Expected), testutil.ToFloat64(c.Delivered), testutil.ToFloat64(c.Recovered),
		testutil.ToFloat64(c.Unowed), testutil.ToFloat64(c.Lost), testutil.ToFloat64(c.Duplicate),
	}
}

// TestUnowedDelivery injects the fault a network reset makes: the server
// delivers a message but its ack never reaches the sender, which writes it
// off. Whatever the order of the delivery, the write-off and a late ack, the
// delivery counts as unowed, never as delivered, lost or duplicate, so that
// delivered never exceeds expected; without the fault nothing is unowed.
func TestUnowedDelivery(t *testing.T) {
	type step int
	const (
		deliver step = iota
		recover
		ack
		timeout // the sweep after the ack timeout: the write-off
		sweep
	)
	tests := []struct {
		name  string
		steps []step
		want  owedCounts
	}{
		{"acked, then delivered", []step{ack, deliver, sweep}, owedCounts{expected: 1, delivered: 1}},
		{"delivered, then acked", []step{deliver, ack, sweep}, owedCounts{expected: 1, delivered: 1}},
		{"recovered, then acked", []step{recover, ack, sweep}, owedCounts{expected: 1, recovered: 1}},
		{"ack eaten: delivered, then written off", []step{deliver, timeout, sweep}, owedCounts{unowed: 1}},
		{"ack eaten: written off, then delivered", []step{timeout, deliver, sweep}, owedCounts{unowed: 1}},
		{"ack eaten: recovered, then written off", []step{recover, timeout, sweep}, owedCounts{unowed: 1}},
		{"ack after the timeout", []step{deliver, timeout, ack, sweep}, owedCounts{unowed: 1}},
		{"written off, not delivered", []step{timeout, sweep}, owedCounts{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Now()
			p, set := lagPop(t, t0, 0)
			sender, rcpt := p.users[1], p.users[0]
			sent, err := p.SendNow(1, false)
			if err != nil {
				t.Fatal(err)
			}
			body := probe.AppendBody(nil, &probe.Header{Run: p.run, Sender: sender.nameB, Stream: sender.direct.name, Seq: sent.Seq, Intended: sent.Intended.UnixNano()}, 0)
			now := t0
			for _, s := range tt.steps {
				now = now.Add(10 * time.Millisecond)
				switch s {
				case deliver:
					rcpt.devices[0].inbox.Receive(body, now.UnixNano())
				case recover:
					rcpt.devices[0].inbox.Recover(body, now.UnixNano())
				case ack:
					sender.devices[0].OnAck(sent.Ref, probe.Ack{})
				case timeout:
					now = now.Add(p.opts.Deadline + time.Second)
					p.Sweep(now)
				case sweep:
					p.Sweep(now)
				}
			}
			got := readOwed(set, metrics.Direct)
			if got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if got.delivered+got.recovered > got.expected {
				t.Errorf("delivered %v + recovered %v > expected %v", got.delivered, got.recovered, got.expected)
			}
		})
	}
}

// TestUnowedHeldUntilAck: a delivery that beats its ack is not counted
// until the ack comes, and then once, with its latency.
func TestUnowedHeldUntilAck(t *testing.T) {
	t0 := time.Now()
	p, set := lagPop(t, t0, 0)
	sender, rcpt := p.users[1], p.users[0]
	sent, err := p.SendNow(1, false)
	if err != nil {
		t.Fatal(err)
	}
	body := probe.AppendBody(nil, &probe.Header{Run: p.run, Sender: sender.nameB, Stream: sender.direct.name, Seq: sent.Seq, Intended: sent.Intended.UnixNano()}, 0)
	rcpt.devices[0].inbox.Receive(body, sent.Intended.Add(5*time.Millisecond).UnixNano())
	k := set.Kind[metrics.Direct].Cohort[metrics.Normal]
	if d := testutil.ToFloat64(k.Delivered); d != 0 {
		t.Fatalf("delivered = %v before the ack, want 0: not yet owed", d)
	}
	sender.devices[0].OnAck(sent.Ref, probe.Ack{})
	p.Sweep(t0.Add(10 * time.Millisecond))
	p.Sweep(t0.Add(20 * time.Millisecond))
	if d, n := testutil.ToFloat64(k.Delivered), metrics.Count(k.DeliveryLatency); d != 1 || n != 1 {
		t.Errorf("after the ack: delivered %v, latency samples %d, want 1 and 1", d, n)
	}
}

// exemplarsOf returns the exemplars of a histogram's buckets.
func exemplarsOf(t *testing.T, o prometheus.Observer) []*dto.Exemplar {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	var out []*dto.Exemplar
	for _, b := range m.Histogram.GetBucket() {
		if e := b.GetExemplar(); e != nil {
			out = append(out, e)
		}
	}
	return out
}

func exemplarLabels(e *dto.Exemplar) map[string]string {
	out := map[string]string{}
	for _, l := range e.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// TestLatencyExemplars: a slow delivery's latency sample carries its
// sender, stream and seq; a fast one carries none.
func TestLatencyExemplars(t *testing.T) {
	set := newTestSet(t)
	start := time.Unix(1_700_000_000, 0)
	l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
	in := l.NewInbox()
	// Fast: 5 ms.
	in.Receive(body("run1", "d.bob", 1, start, 0, 0), start.Add(5*time.Millisecond).UnixNano())
	k := set.Kind[metrics.Direct].Cohort[metrics.Normal]
	if ex := exemplarsOf(t, k.DeliveryLatency); len(ex) != 0 {
		t.Fatalf("exemplars after a fast delivery: %v, want none", ex)
	}
	// Slow: 1.5 s, past the deadline and the latency SLI's 1 s.
	in.Receive(body("run1", "d.bob", 2, start.Add(time.Second), 0, 0), start.Add(2500*time.Millisecond).UnixNano())
	ex := exemplarsOf(t, k.DeliveryLatency)
	if len(ex) != 1 {
		t.Fatalf("exemplars after a slow delivery: %v, want one", ex)
	}
	want := map[string]string{"sender": "alice", "stream": "d.bob", "seq": "2"}
	if got := exemplarLabels(ex[0]); !mapsEqual(got, want) || ex[0].GetValue() != 1.5 {
		t.Errorf("exemplar = %v value %v, want %v value 1.5", got, ex[0].GetValue(), want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestExemplarLimit: names too long for OpenMetrics' 128 runes, or not
// UTF-8 (a hostile server's), are cut to fit, keeping their ends.
func TestExemplarLimit(t *testing.T) {
	long := strings.Repeat("ü", 100)
	tests := []struct {
		key string
		seq uint64
	}{
		{"run " + long + "-u7 g." + long + "-g3", 18446744073709551615},
		{"run alice d." + long, 1},
		{"run \xff\xfe d.\xff", 2},
	}
	for _, tt := range tests {
		l := exemplar(tt.key, tt.seq)
		n := 0
		for k, v := range l {
			n += len([]rune(k)) + len([]rune(v))
		}
		if n > prometheus.ExemplarMaxRunes {
			t.Errorf("exemplar(%q) = %v: %d runes, want at most %d", tt.key, l, n, prometheus.ExemplarMaxRunes)
		}
		// The library panics on what it would reject.
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h"})
		h.(prometheus.ExemplarObserver).ObserveWithExemplar(1, l)
	}
	if l := exemplar("run "+long+"-u7 g.x", 3); !strings.HasSuffix(l["sender"], "ü-u7") || l["stream"] != "g.x" {
		t.Errorf("exemplar of a long sender = %v, want its end kept and the stream whole", l)
	}
}

// TestLostLog: each loss is logged with the exact seqs written off (a void
// between them excepted), and a burst of losses logs at most lostBurst
// lines, then one summary with the rest.
func TestLostLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		set := newTestSet(t)
		start := time.Now()
		l := NewLedger(set, "run1", start.Add(-time.Hour), testDeadline, testLostAfter)
		l.lost = newLostLog(slog.New(slog.NewTextHandler(&buf, nil)))
		in := l.NewInbox()
		in.self = []byte("bob")
		// 1 received, 2-3 lost, 4 void (carried by 6), 5 lost, 6 received.
		in.Receive(body("run1", "d.bob", 1, start, 0, 0), start.UnixNano())
		in.Receive(body("run1", "d.bob", 6, start, 4, 4), start.UnixNano())
		in.Sweep(start.Add(testLostAfter + time.Second).UnixNano())
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 ||
			!strings.Contains(lines[0], "msg=\"messages lost\" run=run1 sender=alice stream=d.bob first_seq=2 last_seq=3 count=2 recipient=bob device=0") ||
			!strings.Contains(lines[1], "first_seq=5 last_seq=5 count=1") {
			t.Fatalf("lost log:\n%s\nwant spans 2-3 and 5 of run1 alice d.bob", buf.String())
		}
		if lost := testutil.ToFloat64(set.Kind[metrics.Direct].Cohort[metrics.Normal].Lost); lost != 3 {
			t.Errorf("lost = %v, want 3", lost)
		}

		// A burst, once the limiter is full again: 100 streams lose one
		// message each at once.
		time.Sleep(lostBurst * time.Second / lostRate)
		buf.Reset()
		for i := range 100 {
			s := "d.s" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			in.Receive(body("run1", s, 1, start, 0, 0), start.UnixNano())
			in.Receive(body("run1", s, 3, start, 0, 0), start.UnixNano())
		}
		in.Sweep(start.Add(testLostAfter + time.Second).UnixNano())
		l.lost.flush()
		out := buf.String()
		if n := strings.Count(out, `msg="messages lost"`); n != lostBurst {
			t.Errorf("%d lines for 100 losses at once, want the burst of %d:\n%s", n, lostBurst, out)
		}
		rest := strconv.Itoa(100 - lostBurst)
		if !strings.Contains(out, `msg="more messages lost than logged one by one" spans=`+rest+` messages=`+rest) {
			t.Errorf("no summary of the %s not logged:\n%s", rest, out)
		}
	})
}

// TestAckRecordDecidesLoss: where the sender is in this process, its ack
// record, not the voids its bodies carry, decides what a missing message
// was owed. A write-off whose void never reached the recipient is not
// lost; an acknowledged message that a (merged) void span covers is owed:
// it stays missing, is delivered if it comes, and is lost if it does not.
func TestAckRecordDecidesLoss(t *testing.T) {
	tests := []struct {
		name string
		// ack1 says whether the server acknowledged seq 1; void is the
		// span seq 2 carries; late1 delivers seq 1 after seq 2.
		ack1  bool
		void  [2]uint64
		late1 bool
		want  owedCounts
	}{
		{"written off, its void never arrived", false, [2]uint64{}, false, owedCounts{expected: 1, delivered: 1}},
		{"written off, its void arrived", false, [2]uint64{1, 1}, false, owedCounts{expected: 1, delivered: 1}},
		{"acked, lost", true, [2]uint64{}, false, owedCounts{expected: 2, delivered: 1, lost: 1}},
		{"acked under a void span, lost", true, [2]uint64{1, 1}, false, owedCounts{expected: 2, delivered: 1, lost: 1}},
		{"acked under a void span, delivered late", true, [2]uint64{1, 1}, true, owedCounts{expected: 2, delivered: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Now()
			p, set := lagPop(t, t0, 0)
			sender, rcpt := p.users[1], p.users[0]
			in := rcpt.devices[0].inbox
			s1, err := p.SendNow(1, false)
			if err != nil {
				t.Fatal(err)
			}
			if tt.ack1 {
				sender.devices[0].OnAck(s1.Ref, probe.Ack{})
			} else {
				p.Sweep(time.Now().Add(p.opts.Deadline + time.Second))
			}
			s2, err := p.SendNow(1, false)
			if err != nil {
				t.Fatal(err)
			}
			sender.devices[0].OnAck(s2.Ref, probe.Ack{})
			mk := func(s Sent, vlo, vhi uint64) []byte {
				return probe.AppendBody(nil, &probe.Header{Run: p.run, Sender: sender.nameB, Stream: sender.direct.name, Seq: s.Seq, Intended: s.Intended.UnixNano(), VoidLo: vlo, VoidHi: vhi}, 0)
			}
			in.Receive(mk(s2, tt.void[0], tt.void[1]), s2.Intended.Add(time.Millisecond).UnixNano())
			p.Sweep(s2.Intended.Add(10 * time.Millisecond))
			if got := readOwed(set, metrics.Direct); got.lost != 0 {
				t.Fatalf("lost %v at once, want nothing lost before lost_after", got.lost)
			}
			if tt.late1 {
				in.Receive(mk(s1, 0, 0), s2.Intended.Add(20*time.Millisecond).UnixNano())
			}
			p.Sweep(s2.Intended.Add(p.opts.LostAfter + time.Second))
			if got := readOwed(set, metrics.Direct); got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// BenchmarkInboxReceiveAcked is BenchmarkInboxReceive with the sender in
// this process: each delivery reads its message's ack record.
// BenchmarkInboxReceiveSlow is with every delivery past the exemplar
// threshold, so that each observation carries an exemplar.
func BenchmarkInboxReceiveAcked(b *testing.B) { benchReceive(b, time.Millisecond, true) }
func BenchmarkInboxReceiveSlow(b *testing.B)  { benchReceive(b, 2*time.Second, true) }

func benchReceive(b *testing.B, lat time.Duration, acked bool) {
	set := newTestSet(b)
	start := time.Now()
	l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
	f := &fate{}
	l.sends = map[string]*sendStream{"run1 imcanary-u17 g.imcanary-g3": {fate: f}}
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	buf := make([]byte, 0, 128)
	now := start.UnixNano()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		if acked {
			f.write(h.Seq)
			f.ack(h.Seq)
		}
		buf = probe.AppendBody(buf[:0], &h, 0)
		in.Receive(buf, now+int64(i)+int64(lat))
	}
}

// TestExemplarGate: one exemplar per bucket per exemplarEvery, buckets
// apart.
func TestExemplarGate(t *testing.T) {
	var g exemplarGate
	t0 := time.Unix(1_700_000_000, 0).UnixNano()
	steps := []struct {
		v    float64
		at   time.Duration
		want bool
	}{
		{1.5, 0, true},
		{1.7, 10 * time.Millisecond, false}, // same bucket (1, 2]
		{3, 20 * time.Millisecond, true},    // bucket (2, 5]
		{1.2, exemplarEvery - time.Millisecond, false},
		{1.2, exemplarEvery, true},
		{100, 0, true}, // +Inf
	}
	for _, s := range steps {
		if got := g.allow(s.v, t0+int64(s.at)); got != s.want {
			t.Errorf("allow(%v at +%v) = %v, want %v", s.v, s.at, got, s.want)
		}
	}
}
