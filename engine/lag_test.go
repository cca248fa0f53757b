package engine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// idleSession is a session that is never read or written: the lag tests
// drive the ledger by hand.
type idleSession struct{}

func (idleSession) Serve(probe.Handler) error {
	return &probe.Disconnect{Reason: metrics.ReasonShutdown}
}
func (idleSession) Send(*probe.Message) error                 { return nil }
func (idleSession) Ping() error                               { return nil }
func (idleSession) Close() error                              { return nil }
func (nopDriver) Provision(context.Context, probe.Plan) error { return nil }

type nopDriver struct{}

func (nopDriver) Connect(context.Context, string, probe.Device) (probe.Session, error) {
	return idleSession{}, nil
}

// lagPop is a population of two users in one group, both online since
// start, with nothing sent.
func lagPop(t *testing.T, start time.Time, slow float64) (*Population, *metrics.Set) {
	t.Helper()
	set := metrics.New(prometheus.NewPedanticRegistry()).For("t", metrics.SourceBackground)
	p, err := NewPopulation(Options{
		Connection: Connection{
			Driver:     nopDriver{},
			Run:        "r1",
			Heartbeat:  time.Second,
			BackoffMin: time.Millisecond,
			BackoffMax: time.Millisecond,
		},
		Set:         set,
		Prefix:      "p",
		Users:       2,
		GroupSize:   2,
		Rate:        1,
		Deadline:    2 * time.Second,
		LostAfter:   4 * time.Second,
		SlowReaders: SlowReaders{Fraction: slow, ReadDelay: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.ledger.start = start.Add(-time.Hour).UnixNano()
	for _, u := range p.users {
		u.devices[0].sess, u.devices[0].sessStart = idleSession{}, start.UnixNano()
	}
	return p, set
}

// ack records that the server acknowledged seq of st at t.
func ack(p *Population, st *sendStream, seq uint64, t time.Time) {
	u := p.users[st.from]
	u.mu.Lock()
	st.ackedAt(seq, t.UnixNano())
	u.mu.Unlock()
}

// deliver hands seq of st to its recipient's inbox at t.
func deliver(p *Population, st *sendStream, seq uint64, intended, t time.Time) {
	h := probe.Header{Run: []byte("r1"), Sender: p.users[st.from].nameB, Stream: st.name, Seq: seq, Intended: intended.UnixNano()}
	p.users[st.recipientList()[0]].devices[0].inbox.Receive(probe.AppendBody(nil, &h, 0), t.UnixNano())
}

func histSum(o prometheus.Observer) (count uint64, sum float64) {
	var m dto.Metric
	_ = o.(prometheus.Metric).Write(&m)
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

// TestLagFlagsSilentStall is the silent stall: the server acks a sender's
// messages and never delivers them, so the recipient lags. It is flagged
// once the first missing message has waited LagThreshold (half the 2 s
// deadline) since its ack, not before, and clears when delivery resumes.
func TestLagFlagsSilentStall(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p, set := lagPop(t, t0, 0)
	st := p.users[1].direct // user 1 → user 0
	for seq := uint64(1); seq <= 3; seq++ {
		at := t0.Add(time.Duration(seq) * 100 * time.Millisecond)
		ack(p, st, seq, at)
		deliver(p, st, seq, at, at.Add(time.Millisecond))
	}
	p.Sweep(t0.Add(time.Second))
	if n, s := histSum(set.DeliveryLag); n != 2 || s != 0 {
		t.Fatalf("in step: lag samples %d sum %v, want 2 sessions at 0", n, s)
	}
	// The stall: seqs 4..9 acked from t0+1s on, none delivered.
	for seq := uint64(4); seq <= 9; seq++ {
		ack(p, st, seq, t0.Add(time.Second+time.Duration(seq-4)*100*time.Millisecond))
	}
	steps := []struct {
		at      time.Duration
		lagging float64
	}{
		{1500 * time.Millisecond, 0}, // seq 4 waited 0.5 s
		{1900 * time.Millisecond, 0}, // 0.9 s, under the 1 s threshold
		{2100 * time.Millisecond, 1}, // 1.1 s: lagging, within the 2 s deadline
		{3000 * time.Millisecond, 1},
	}
	for _, s := range steps {
		p.Sweep(t0.Add(s.at))
		if got := testutil.ToFloat64(set.SessionsLagging); got != s.lagging {
			t.Errorf("at +%v: sessions lagging %v, want %v", s.at, got, s.lagging)
		}
	}
	before, sum := histSum(set.DeliveryLag)
	p.Sweep(t0.Add(3100 * time.Millisecond))
	n, sum2 := histSum(set.DeliveryLag)
	if n-before != 2 || sum2-sum != 6 {
		t.Errorf("stalled sweep: %d samples adding %v, want 2 sessions adding 6 messages", n-before, sum2-sum)
	}
	// Delivery resumes with seq 9: 4..8 are a gap for the ledger to judge,
	// not lag.
	deliver(p, st, 9, t0.Add(1800*time.Millisecond), t0.Add(3200*time.Millisecond))
	p.Sweep(t0.Add(3300 * time.Millisecond))
	if got := testutil.ToFloat64(set.SessionsLagging); got != 0 {
		t.Errorf("after delivery resumed: sessions lagging %v, want 0", got)
	}
}

// TestLagIgnoresSteadyDelay: every message arrives 800 ms after its ack,
// with a new one acked every 100 ms, so the recipient is always behind by
// several messages; none waits past the 1 s threshold, so it never counts
// as lagging.
func TestLagIgnoresSteadyDelay(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p, set := lagPop(t, t0, 0)
	st := p.users[1].direct
	const step, delay = 100 * time.Millisecond, 800 * time.Millisecond
	var maxLag float64
	for i := 1; i <= 60; i++ {
		now := t0.Add(time.Duration(i) * step)
		ack(p, st, uint64(i), now)
		if j := i - int(delay/step); j >= 1 {
			deliver(p, st, uint64(j), now.Add(-delay), now)
		}
		before, sum := histSum(set.DeliveryLag)
		p.Sweep(now)
		if got := testutil.ToFloat64(set.SessionsLagging); got != 0 {
			t.Fatalf("at +%v: sessions lagging %v, want 0", now.Sub(t0), got)
		}
		n, sum2 := histSum(set.DeliveryLag)
		if n > before {
			maxLag = max(maxLag, sum2-sum)
		}
	}
	if maxLag != 8 {
		t.Errorf("largest lag %v messages, want 8 (800 ms at one per 100 ms)", maxLag)
	}
}

// TestLagAfterReconnect: messages acked while the recipient was offline
// are timed from its new login, not from their acks, so a fresh session
// is not flagged for what it missed while away.
func TestLagAfterReconnect(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p, set := lagPop(t, t0, 0)
	st := p.users[1].direct
	ack(p, st, 1, t0)
	p.users[0].devices[0].sessStart = t0.Add(5 * time.Second).UnixNano()
	p.Sweep(t0.Add(5500 * time.Millisecond))
	if got := testutil.ToFloat64(set.SessionsLagging); got != 0 {
		t.Errorf("0.5 s after login: sessions lagging %v, want 0", got)
	}
	p.Sweep(t0.Add(6100 * time.Millisecond))
	if got := testutil.ToFloat64(set.SessionsLagging); got != 1 {
		t.Errorf("1.1 s after login: sessions lagging %v, want 1", got)
	}
	// Offline: not a session, so neither sampled nor lagging.
	p.users[0].devices[0].sess = nil
	n, _ := histSum(set.DeliveryLag)
	p.Sweep(t0.Add(7 * time.Second))
	if got := testutil.ToFloat64(set.SessionsLagging); got != 0 {
		t.Errorf("offline: sessions lagging %v, want 0", got)
	}
	if n2, _ := histSum(set.DeliveryLag); n2 != n+1 {
		t.Errorf("offline sweep sampled %d sessions, want 1", n2-n)
	}
}

// TestSlowReaderCohort: a slow reader's lag is kept apart from the lag
// metrics, and what it is owed is expected in the slow_reader cohort.
func TestSlowReaderCohort(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p, set := lagPop(t, t0, 0.5)
	slow, normal := -1, -1
	for i := range p.Users() {
		if p.Slow(i) {
			slow = i
		} else {
			normal = i
		}
	}
	if slow < 0 || normal < 0 {
		t.Fatalf("fraction 0.5 of 2 users: slow %d normal %d, want one of each", slow, normal)
	}
	st := p.users[normal].direct // normal → slow
	for seq := uint64(1); seq <= 5; seq++ {
		ack(p, st, seq, t0)
	}
	p.Sweep(t0.Add(1500 * time.Millisecond))
	if got := p.SlowReaderLag(); got != 5 {
		t.Errorf("slow reader lag %d, want 5", got)
	}
	if got := testutil.ToFloat64(set.SessionsLagging); got != 0 {
		t.Errorf("sessions lagging %v, want 0: slow readers lag by design", got)
	}
	if n, _ := histSum(set.DeliveryLag); n != 1 {
		t.Errorf("lag sampled for %d sessions, want only the normal one", n)
	}
	// OnAck counts the expected delivery in the recipient's cohort.
	u := p.users[normal]
	u.inflight = append(u.inflight, flight{ref: 7, st: u.groups[0], dev: u.devices[0], seq: 1, sentAt: t0.UnixNano()})
	u.devices[0].OnAck(7, probe.Ack{})
	if got := testutil.ToFloat64(set.Kind[metrics.Group].Cohort[metrics.SlowReader].Expected); got != 1 {
		t.Errorf("slow cohort expected %v, want 1", got)
	}
	if got := testutil.ToFloat64(set.Kind[metrics.Group].Cohort[metrics.Normal].Expected); got != 0 {
		t.Errorf("normal cohort expected %v, want 0", got)
	}
}
