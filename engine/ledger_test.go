package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

const (
	testDeadline  = time.Second
	testLostAfter = 3 * time.Second
)

// counts is what a ledger recorded for one kind, plus the ignored reasons.
type counts struct {
	delivered, late, lost, dup, reordered, recovered, latePush float64
	ignored                                                    map[string]float64
}

func readCounts(set *metrics.Set, kind int) counts {
	k := set.Kind[kind].Cohort[metrics.Normal]
	c := counts{
		delivered: testutil.ToFloat64(k.Delivered),
		late:      testutil.ToFloat64(k.Late),
		lost:      testutil.ToFloat64(k.Lost),
		dup:       testutil.ToFloat64(k.Duplicate),
		reordered: testutil.ToFloat64(k.Reordered),
		recovered: testutil.ToFloat64(k.Recovered),
		latePush:  testutil.ToFloat64(k.LatePush),
		ignored:   map[string]float64{},
	}
	for r, ctr := range set.Ignored {
		if v := testutil.ToFloat64(ctr); v != 0 {
			c.ignored[r] = v
		}
	}
	return c
}

func newTestSet(t testing.TB) *metrics.Set {
	t.Helper()
	return metrics.New(prometheus.NewPedanticRegistry()).For("test", metrics.SourceBackground)
}

// arrival is one delivery in a scripted test: message seq of a stream,
// intended at start+at, received at start+at+lat. void names a span the
// message carries.
type arrival struct {
	seq            uint64
	at, lat        time.Duration
	voidLo, voidHi uint64
	run            string
	stream         string
	raw            string // when set, the body verbatim
	// fetched: returned by catch-up, not pushed.
	fetched bool
}

func body(run, stream string, seq uint64, intended time.Time, vlo, vhi uint64) []byte {
	return probe.AppendBody(nil, &probe.Header{
		Run: []byte(run), Sender: []byte("alice"), Stream: []byte(stream),
		Seq: seq, Intended: intended.UnixNano(), VoidLo: vlo, VoidHi: vhi,
	}, 0)
}

func TestInbox(t *testing.T) {
	ms := time.Millisecond
	inOrder := func(n int) []arrival {
		var a []arrival
		for i := 1; i <= n; i++ {
			a = append(a, arrival{seq: uint64(i), at: time.Duration(i) * 10 * ms, lat: 5 * ms})
		}
		return a
	}
	tests := []struct {
		name     string
		arrivals []arrival
		// sweepAt is when the ledger is swept, after start.
		sweepAt time.Duration
		kind    int
		want    counts
	}{
		{
			name:     "in order",
			arrivals: inOrder(1000),
			sweepAt:  time.Minute,
			want:     counts{delivered: 1000},
		},
		{
			name:     "duplicate",
			arrivals: []arrival{{seq: 1}, {seq: 2}, {seq: 2}, {seq: 3}, {seq: 1}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3, dup: 2},
		},
		{
			name:     "duplicate of a pending message above a gap",
			arrivals: []arrival{{seq: 1}, {seq: 3}, {seq: 3}, {seq: 2}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3, dup: 1, reordered: 1},
		},
		{
			name:     "reordered",
			arrivals: []arrival{{seq: 1}, {seq: 3}, {seq: 2}, {seq: 4}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 4, reordered: 1},
		},
		{
			name:     "gap is lost once lost_after has passed",
			arrivals: []arrival{{seq: 1}, {seq: 2}, {seq: 4, at: 10 * ms}, {seq: 5}},
			sweepAt:  10*ms + testLostAfter + ms,
			want:     counts{delivered: 4, lost: 1},
		},
		{
			name:     "gap is not lost before lost_after",
			arrivals: []arrival{{seq: 1}, {seq: 2}, {seq: 4, at: 10 * ms}, {seq: 5}},
			sweepAt:  10*ms + testLostAfter - ms,
			want:     counts{delivered: 3 + 1},
		},
		{
			name:     "late is counted as delivered and late, not lost",
			arrivals: []arrival{{seq: 1}, {seq: 2, lat: 2 * time.Second}, {seq: 3}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3, late: 1},
		},
		{
			name:     "late and reordered",
			arrivals: []arrival{{seq: 1}, {seq: 3, at: 100 * ms}, {seq: 2, at: 50 * ms, lat: 1500 * ms}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3, late: 1, reordered: 1},
		},
		{
			name:     "arrival after being declared lost is ignored, not delivered",
			arrivals: []arrival{{seq: 1}, {seq: 3}, {seq: 2, lat: time.Hour}},
			sweepAt:  30 * time.Minute, // runs before the last arrival
			want:     counts{delivered: 2, lost: 1, ignored: map[string]float64{metrics.IgnoredAfterLost: 1}},
		},
		{
			name:     "void span is not lost",
			arrivals: []arrival{{seq: 1}, {seq: 4, voidLo: 2, voidHi: 3}, {seq: 5, voidLo: 2, voidHi: 3}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3},
		},
		{
			name:     "void span only excuses what it names",
			arrivals: []arrival{{seq: 1}, {seq: 5, voidLo: 2, voidHi: 3}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 2, lost: 1},
		},
		{
			name:     "void message delivered anyway counts once",
			arrivals: []arrival{{seq: 1}, {seq: 2}, {seq: 3, voidLo: 2, voidHi: 2}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 3},
		},
		{
			name:     "first messages of our own run lost",
			arrivals: []arrival{{seq: 3}, {seq: 4}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 2, lost: 2},
		},
		{
			name:     "another run's stream starts where it is first seen",
			arrivals: []arrival{{seq: 3, run: "other"}, {seq: 4, run: "other"}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 2},
		},
		{
			name:     "earlier run's leftovers are stale",
			arrivals: []arrival{{seq: 1, at: -time.Second}, {seq: 1}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 1, ignored: map[string]float64{metrics.IgnoredStale: 1}},
		},
		{
			name:     "implausible sequence jump",
			arrivals: []arrival{{seq: 1}, {seq: 1 << 40}, {seq: 2}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 2, ignored: map[string]float64{metrics.IgnoredMalformed: 1}},
		},
		{
			name:     "not a probe message",
			arrivals: []arrival{{raw: "hello"}, {raw: "imc1 r alice d.bob x 1 0-0"}, {seq: 1}},
			sweepAt:  time.Minute,
			want:     counts{delivered: 1, ignored: map[string]float64{metrics.IgnoredMalformed: 2}},
		},
		{
			name:     "group stream",
			arrivals: []arrival{{seq: 1, stream: "g.team"}, {seq: 3, stream: "g.team"}},
			sweepAt:  time.Minute,
			kind:     1,
			want:     counts{delivered: 2, lost: 1},
		},
		{
			name: "too old to judge",
			arrivals: func() []arrival {
				a := inOrder(400)
				return append(a, arrival{seq: 2})
			}(),
			sweepAt: time.Minute,
			want:    counts{delivered: 400, ignored: map[string]float64{metrics.IgnoredTooOld: 1}},
		},
		{
			// Catch-up fills the gap a dropped push left: recovered,
			// neither delivered nor lost.
			name: "gap recovered",
			arrivals: []arrival{
				{seq: 1, at: 0, lat: 10 * ms}, {seq: 3, at: 200 * ms, lat: 10 * ms},
				{seq: 2, at: 100 * ms, lat: 500 * ms, fetched: true},
			},
			sweepAt: 10 * time.Second,
			want:    counts{delivered: 2, recovered: 1},
		},
		{
			// A fetch of what was pushed is an overlap, not a
			// duplicate; a push of what was fetched is a late push,
			// pending (2) or past the base (5); two pushes of one
			// message still are a duplicate.
			name: "catch-up overlap and late push",
			arrivals: []arrival{
				{seq: 1, at: 0, lat: 10 * ms}, {seq: 1, at: 0, lat: 20 * ms, fetched: true},
				{seq: 3, at: 200 * ms, lat: 10 * ms},
				{seq: 2, at: 100 * ms, lat: 300 * ms, fetched: true}, {seq: 2, at: 100 * ms, lat: 400 * ms},
				{seq: 3, at: 200 * ms, lat: 300 * ms, fetched: true},
				{seq: 4, at: 300 * ms, lat: 10 * ms}, {seq: 4, at: 300 * ms, lat: 20 * ms},
				{seq: 6, at: 500 * ms, lat: 10 * ms},
				{seq: 5, at: 400 * ms, lat: 400 * ms, fetched: true},
				{seq: 7, at: 600 * ms, lat: 10 * ms},
				{seq: 5, at: 400 * ms, lat: 600 * ms}, {seq: 5, at: 400 * ms, lat: 700 * ms, fetched: true},
			},
			sweepAt: 10 * time.Second,
			want:    counts{delivered: 5, recovered: 2, dup: 1, latePush: 2, ignored: map[string]float64{metrics.IgnoredCatchUp: 3}},
		},
		{
			// What catch-up brings after lost_after has been counted
			// lost already: eventual completeness ends there.
			name: "recovered too late",
			arrivals: []arrival{
				{seq: 1, at: 0, lat: 10 * ms}, {seq: 3, at: 200 * ms, lat: 10 * ms},
				{seq: 2, at: 100 * ms, lat: 5 * time.Second, fetched: true},
			},
			sweepAt: 4 * time.Second,
			want:    counts{delivered: 2, lost: 1, ignored: map[string]float64{metrics.IgnoredAfterLost: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := newTestSet(t)
			start := time.Unix(1_700_000_000, 0)
			l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
			in := l.NewInbox()
			swept := false
			for _, a := range tt.arrivals {
				recv := start.Add(a.at + a.lat)
				if !swept && recv.After(start.Add(tt.sweepAt)) {
					in.Sweep(start.Add(tt.sweepAt).UnixNano())
					swept = true
				}
				run, stream := a.run, a.stream
				if run == "" {
					run = "run1"
				}
				if stream == "" {
					stream = "d.bob"
				}
				b := body(run, stream, a.seq, start.Add(a.at), a.voidLo, a.voidHi)
				if a.raw != "" {
					b = []byte(a.raw)
				}
				if a.fetched {
					in.Recover(b, recv.UnixNano())
				} else {
					in.Receive(b, recv.UnixNano())
				}
			}
			if !swept {
				in.Sweep(start.Add(tt.sweepAt).UnixNano())
			}
			got := readCounts(set, tt.kind)
			if got.delivered != tt.want.delivered || got.late != tt.want.late || got.lost != tt.want.lost ||
				got.dup != tt.want.dup || got.reordered != tt.want.reordered || got.recovered != tt.want.recovered ||
				got.latePush != tt.want.latePush ||
				!sameMap(got.ignored, tt.want.ignored) {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func sameMap(a, b map[string]float64) bool {
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

// TestInboxBoundedMemory shows that a stream whose gap never fills holds at
// most maxPending messages, and that idle streams are forgotten.
func TestInboxBoundedMemory(t *testing.T) {
	set := newTestSet(t)
	start := time.Unix(1_700_000_000, 0)
	l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
	in := l.NewInbox()
	// seq 1 never arrives; everything after it does, without a sweep.
	n := maxPending * 3
	for i := 2; i <= n; i++ {
		at := start.Add(time.Duration(i) * time.Millisecond)
		in.Receive(body("run1", "d.bob", uint64(i), at, 0, 0), at.UnixNano())
	}
	st := in.streams["run1 alice d.bob"]
	if len(st.pending) > maxPending {
		t.Fatalf("pending = %d, want at most %d", len(st.pending), maxPending)
	}
	if got := readCounts(set, 0); got.lost != 1 || got.delivered != float64(n-1) {
		t.Errorf("counts = %+v, want lost 1, delivered %d", got, n-1)
	}
	if l.Streams() != 1 {
		t.Fatalf("Streams() = %d, want 1", l.Streams())
	}
	// A stream of another run, idle long enough, is forgotten; one of
	// our own run is kept, since forgetting it would book its earlier
	// messages as lost when it comes back.
	at := start.Add(time.Duration(n+1) * time.Millisecond)
	in.Receive(body("other", "d.bob", 7, at, 0, 0), at.UnixNano())
	if l.Streams() != 2 {
		t.Fatalf("Streams() = %d, want 2", l.Streams())
	}
	in.Sweep(start.Add(2 * minEvict).UnixNano())
	if l.Streams() != 1 || len(in.streams) != 1 {
		t.Errorf("after idle sweep Streams() = %d, want 1 (our own run's)", l.Streams())
	}
	later := start.Add(3 * minEvict)
	in.Receive(body("run1", "d.bob", uint64(n+1), later, 0, 0), later.UnixNano())
	in.Sweep(later.Add(time.Hour).UnixNano())
	if got := readCounts(set, 0); got.lost != 1 {
		t.Errorf("lost = %v after a long idle stream resumed, want still 1", got.lost)
	}
}

// TestInboxHostileBodies feeds bodies a lying server could forge: each is
// ignored, and none can hang the inbox, book phantom losses or grow it
// without bound.
func TestInboxHostileBodies(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now := start.Add(time.Second)
	t.Run("void span to the end of time", func(t *testing.T) {
		set := newTestSet(t)
		in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
		in.Receive(body("run1", "d.bob", 1, start, 0, 1<<64-1), now.UnixNano())
		in.Receive(body("run1", "d.bob", 5, start, 1, 1<<62), now.UnixNano())
		in.Receive(body("run1", "d.bob", 1, start, 0, 0), now.UnixNano())
		in.Sweep(now.Add(time.Minute).UnixNano())
		if got := readCounts(set, 0); got.delivered != 1 || got.lost != 0 || got.ignored[metrics.IgnoredMalformed] != 2 {
			t.Errorf("counts = %+v, want 1 delivered, 2 malformed", got)
		}
	})
	t.Run("intended in the future", func(t *testing.T) {
		set := newTestSet(t)
		in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
		in.Receive(body("run1", "d.bob", 2, now.Add(time.Hour), 0, 0), now.UnixNano())
		if got := readCounts(set, 0); got.delivered != 0 || got.ignored[metrics.IgnoredMalformed] != 1 {
			t.Errorf("counts = %+v, want it ignored as malformed", got)
		}
	})
	t.Run("invented senders", func(t *testing.T) {
		set := newTestSet(t)
		l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
		in := l.NewInbox()
		for i := range 3 * maxStreams {
			b := probe.AppendBody(nil, &probe.Header{Run: []byte("x"), Sender: []byte(strconv.Itoa(i)), Stream: []byte("d.bob"), Seq: 1, Intended: start.UnixNano()}, 0)
			in.Receive(b, now.UnixNano())
		}
		if l.Streams() != maxStreams {
			t.Errorf("Streams() = %d, want the limit %d", l.Streams(), maxStreams)
		}
		if got := readCounts(set, 0); got.ignored[metrics.IgnoredStreamLimit] != 2*maxStreams {
			t.Errorf("stream_limit ignored = %v, want %d", got.ignored[metrics.IgnoredStreamLimit], 2*maxStreams)
		}
	})
}

// TestVoidSpansOverlap is the pattern of a slow-acking server: the sender's
// span grows as acks time out (6-6, then 6-7, then 6-8) and each version
// reaches the receiver. Only seq 5 is really missing.
func TestVoidSpansOverlap(t *testing.T) {
	set := newTestSet(t)
	start := time.Unix(1_700_000_000, 0)
	in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	for _, a := range []struct {
		seq, lo, hi uint64
	}{{1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}, {9, 6, 6}, {10, 6, 7}, {11, 6, 8}, {12, 7, 7}} {
		in.Receive(body("run1", "d.bob", a.seq, at(int(a.seq)), a.lo, a.hi), at(int(a.seq)+1).UnixNano())
	}
	in.Sweep(at(100).Add(testLostAfter).UnixNano())
	if got := readCounts(set, 0); got.lost != 1 || got.delivered != 8 {
		t.Errorf("counts = %+v, want 8 delivered and exactly 1 lost", got)
	}
}

func TestParseBodyRoundTrip(t *testing.T) {
	h := probe.Header{Run: []byte("r1"), Sender: []byte("u-1"), Stream: []byte("g.grp"), Seq: 42, Intended: 1234567890123, VoidLo: 3, VoidHi: 9}
	for _, size := range []int{0, 10, 200} {
		b := probe.AppendBody(nil, &h, size)
		if len(b) < size {
			t.Errorf("AppendBody(size %d) length %d, want at least %d", size, len(b), size)
		}
		var got probe.Header
		if err := probe.ParseBody(b, &got); err != nil {
			t.Fatalf("ParseBody(%q) = %v", b, err)
		}
		if string(got.Run) != "r1" || string(got.Sender) != "u-1" || string(got.Stream) != "g.grp" ||
			got.Seq != 42 || got.Intended != 1234567890123 || got.VoidLo != 3 || got.VoidHi != 9 {
			t.Errorf("ParseBody(%q) = %+v, want %+v", b, got, h)
		}
	}
}

func TestParseBodyErrors(t *testing.T) {
	for _, in := range []string{
		"", "hello", "imc1", "imc1 ", "imc1 r s d 1 2", "imc1 r s d 0 2 0-0", "imc1 r s d 1 2 3",
		"imc1 r s d 1 2 5-3", "imc1 r s d 99999999999999999999999 2 0-0", "imc1 r s d 1 -2 0-0",
		"imc1 r  d 1 2 0-0",
	} {
		var h probe.Header
		if err := probe.ParseBody([]byte(in), &h); err == nil {
			t.Errorf("ParseBody(%q) = nil, want an error", in)
		}
	}
}

func FuzzParseBody(f *testing.F) {
	f.Add([]byte("imc1 r s d.x 1 2 0-0"))
	f.Add([]byte("imc1 r s g.x 18446744073709551615 9223372036854775807 1-2 xxxx"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h probe.Header
		if probe.ParseBody(b, &h) != nil {
			return
		}
		// Whatever parses must survive a round trip.
		again := probe.AppendBody(nil, &h, 0)
		var h2 probe.Header
		if err := probe.ParseBody(again, &h2); err != nil || h2.Seq != h.Seq || h2.Intended != h.Intended {
			t.Fatalf("round trip of %q: %q: %v", b, again, err)
		}
	})
}

func BenchmarkInboxReceive(b *testing.B) {
	set := newTestSet(b)
	start := time.Now()
	l := NewLedger(set, "run1", start, testDeadline, testLostAfter)
	in := l.NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("imcanary-u17"), Stream: []byte("g.imcanary-g3")}
	buf := make([]byte, 0, 128)
	now := start.UnixNano()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Seq = uint64(i + 1)
		h.Intended = now + int64(i)
		buf = probe.AppendBody(buf[:0], &h, 0)
		in.Receive(buf, now+int64(i)+1e6)
	}
}

// TestReceiveDoesNotAllocate guards the budget of the delivery path: once a
// stream exists, recording an in-order delivery allocates nothing.
func TestReceiveDoesNotAllocate(t *testing.T) {
	set := newTestSet(t)
	start := time.Now()
	in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
	h := probe.Header{Run: []byte("run1"), Sender: []byte("u1"), Stream: []byte("g.g1")}
	buf := make([]byte, 0, 128)
	seq := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		seq++
		h.Seq, h.Intended = seq, start.UnixNano()
		buf = probe.AppendBody(buf[:0], &h, 0)
		in.Receive(buf, start.UnixNano()+1e6)
	})
	if allocs != 0 {
		t.Errorf("Receive allocates %v times per delivery, want 0", allocs)
	}
}

// TestInboxOwnMessages: a user's own messages are owed to its other devices
// only where the protocol mirrors them; the device that sent one holds it
// already, so neither its echo nor its absence counts.
func TestInboxOwnMessages(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	t.Run("not mirrored", func(t *testing.T) {
		set := newTestSet(t)
		in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
		in.self = []byte("alice")
		in.Receive(body("run1", "d.bob", 1, start, 0, 0), start.Add(time.Millisecond).UnixNano())
		in.Sweep(start.Add(time.Minute).UnixNano())
		if got := readCounts(set, int(metrics.Direct)); got.delivered != 0 || got.ignored[metrics.IgnoredOwn] != 1 {
			t.Errorf("counts = %+v, want the own message ignored as own", got)
		}
	})
	t.Run("mirrored", func(t *testing.T) {
		set := newTestSet(t)
		in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
		in.self, in.ownOwed = []byte("alice"), true
		key := "run1 alice d.bob"
		// This device sent 2 and 4; the others' 1 and 3 come mirrored,
		// and the server echoes 4 back to the device that sent it.
		in.Sent(key, metrics.Direct, 2, start.Add(100*time.Millisecond).UnixNano(), 0, 0)
		in.Receive(body("run1", "d.bob", 1, start, 0, 0), start.Add(150*time.Millisecond).UnixNano())
		in.Receive(body("run1", "d.bob", 3, start.Add(200*time.Millisecond), 0, 0), start.Add(210*time.Millisecond).UnixNano())
		in.Sent(key, metrics.Direct, 4, start.Add(300*time.Millisecond).UnixNano(), 0, 0)
		in.Receive(body("run1", "d.bob", 4, start.Add(300*time.Millisecond), 0, 0), start.Add(310*time.Millisecond).UnixNano())
		in.Sweep(start.Add(time.Minute).UnixNano())
		got := readCounts(set, int(metrics.Direct))
		if got.delivered != 2 || got.lost != 0 || got.dup != 0 || got.ignored[metrics.IgnoredOwn] != 1 {
			t.Errorf("counts = %+v, want 2 delivered, nothing lost, the echo ignored as own", got)
		}
	})
	t.Run("a sibling's failed send", func(t *testing.T) {
		// Another device's send of 2 was never acked; this device sends
		// 3 and 4, which carry the void, and never receives them.
		set := newTestSet(t)
		in := NewLedger(set, "run1", start, testDeadline, testLostAfter).NewInbox()
		in.self, in.ownOwed = []byte("alice"), true
		key := "run1 alice d.bob"
		in.Receive(body("run1", "d.bob", 1, start, 0, 0), start.Add(10*time.Millisecond).UnixNano())
		in.Sent(key, metrics.Direct, 3, start.Add(200*time.Millisecond).UnixNano(), 2, 2)
		in.Sent(key, metrics.Direct, 4, start.Add(300*time.Millisecond).UnixNano(), 2, 2)
		in.Sweep(start.Add(time.Minute).UnixNano())
		if got := readCounts(set, int(metrics.Direct)); got.lost != 0 {
			t.Errorf("counts = %+v, want nothing lost: 2 was void", got)
		}
	})
}
