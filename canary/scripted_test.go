package canary

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// The scripted tests run in a synctest bubble: the memDriver's delays and
// the canary's deadlines are on one fake clock, so "250ms late for a 200ms
// deadline" is exactly that however loaded the machine.

// memDriver is an in-memory IM server for scripted faults a real server
// cannot be made to commit on cue; route decides, per message, who gets
// it and after what delay (negative: dropped); ackDelay delays every ack.
type memDriver struct {
	mu       sync.Mutex
	sess     map[string]*memSess
	groups   map[string][]string
	route    func(from string, h *probe.Header, normal []string) map[string]time.Duration
	ackDelay time.Duration
	dupAfter time.Duration
}

type memSess struct {
	d    *memDriver
	user string
	ev   chan func(probe.Handler)
	done chan struct{}
	once sync.Once
}

func newMem() *memDriver {
	return &memDriver{sess: map[string]*memSess{}, groups: map[string][]string{}}
}

func (d *memDriver) Provision(_ context.Context, p probe.Plan) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range p.Groups {
		d.groups[g.Name] = g.Members
	}
	return nil
}

func (d *memDriver) Connect(_ context.Context, user string, _ probe.Device) (probe.Session, error) {
	s := &memSess{d: d, user: user, ev: make(chan func(probe.Handler), 1024), done: make(chan struct{})}
	d.mu.Lock()
	d.sess[user] = s
	d.mu.Unlock()
	return s, nil
}

func (s *memSess) Serve(h probe.Handler) error {
	for {
		select {
		case <-s.done:
			return &probe.Disconnect{Reason: metrics.ReasonShutdown}
		case f := <-s.ev:
			f(h)
		}
	}
}
func (s *memSess) Ping() error  { return nil }
func (s *memSess) Close() error { s.once.Do(func() { close(s.done) }); return nil }
func (s *memSess) push(f func(probe.Handler)) {
	select {
	case s.ev <- f:
	case <-s.done:
	}
}

func (s *memSess) Send(m *probe.Message) error {
	d := s.d
	var h probe.Header
	body := append([]byte(nil), m.Body...)
	if err := probe.ParseBody(body, &h); err != nil {
		return err
	}
	d.mu.Lock()
	normal := []string{m.To}
	if m.Group != "" {
		normal = slices.DeleteFunc(slices.Clone(d.groups[m.Group]), func(u string) bool { return u == s.user })
	}
	route := map[string]time.Duration{}
	for _, u := range normal {
		route[u] = 0
	}
	if d.route != nil {
		route = d.route(s.user, &h, normal)
	}
	d.mu.Unlock()
	ref := m.Ref
	time.AfterFunc(d.ackDelay, func() { s.push(func(hd probe.Handler) { hd.OnAck(ref, probe.Ack{}) }) })
	for u, delay := range route {
		if delay < 0 {
			continue
		}
		time.AfterFunc(delay, func() {
			d.mu.Lock()
			r := d.sess[u]
			d.mu.Unlock()
			if r != nil {
				r.push(func(hd probe.Handler) { hd.OnDelivery(&probe.Delivery{Body: body}) })
			}
		})
		if d.dupAfter > 0 {
			time.AfterFunc(delay+d.dupAfter, func() {
				d.mu.Lock()
				r := d.sess[u]
				d.mu.Unlock()
				if r != nil {
					r.push(func(hd probe.Handler) { hd.OnDelivery(&probe.Delivery{Body: body}) })
				}
			})
		}
	}
	return nil
}

func newMemCanary(t *testing.T, d *memDriver, users int, deadline time.Duration) *Canary {
	t.Helper()
	c, err := New(Options{
		Connection: engine.Connection{
			Driver:     d,
			Run:        "r1",
			Heartbeat:  time.Second,
			BackoffMin: 10 * time.Millisecond,
			BackoffMax: 100 * time.Millisecond,
		},
		Metrics:  metrics.New(prometheus.NewPedanticRegistry()),
		Target:   "t",
		Prefix:   "can",
		Users:    users,
		Messages: 1,
		Deadline: deadline,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	if !c.WaitReady(context.Background()) {
		t.Fatal("not ready")
	}
	return c
}

// u0's direct message is late, u1's never arrives: both reasons are due.
func TestLateDeliveryDoesNotHideMissingOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newMem()
		d.route = func(from string, h *probe.Header, normal []string) map[string]time.Duration {
			r := map[string]time.Duration{normal[0]: 0}
			if h.Stream[0] == 'g' {
				return r
			}
			switch from {
			case "can-u0":
				r[normal[0]] = 250 * time.Millisecond // late for a 200ms deadline
			case "can-u1":
				r[normal[0]] = -1 // never delivered
			}
			return r
		}
		c := newMemCanary(t, d, 2, 200*time.Millisecond)
		got := reasons(c.Round(context.Background()))[metrics.KindDirect]
		if !slices.Contains(got, metrics.CanaryNotDelivered) {
			t.Errorf("direct reasons = %v, want not_delivered too: can-u1's message never arrived", got)
		}
	})
}

// can-u0's group message reaches can-u1 and, wrongly, can-u0 itself, never
// can-u2: the round must fail.
func TestMisroutedDeliveryDoesNotCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newMem()
		d.route = func(from string, h *probe.Header, normal []string) map[string]time.Duration {
			r := map[string]time.Duration{}
			for _, u := range normal {
				r[u] = 0
			}
			if h.Stream[0] == 'g' && from == "can-u0" {
				delete(r, "can-u2")
				r[from] = 0
			}
			return r
		}
		c := newMemCanary(t, d, 3, 200*time.Millisecond)
		if r := c.Round(context.Background()); r.Result == metrics.ResultPass {
			t.Errorf("Result = pass, checks %+v: can-u2 never got can-u0's group message", r.Checks)
		}
	})
}

// Every ack takes 1.2 deadlines; deliveries are instant. "Every ack within
// its timeout" does not hold, so no round may pass.
func TestLateAckFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newMem()
		d.ackDelay = 240 * time.Millisecond
		c := newMemCanary(t, d, 2, 200*time.Millisecond)
		for i := range 10 {
			if r := c.Round(context.Background()); r.Result == metrics.ResultPass {
				t.Fatalf("round %d passed although every ack came 1.2 deadlines late: %+v", i, r.Checks)
			}
		}
	})
}

// A round cut short by shutdown (ctx) is not a failed round.
func TestCancelledRoundIsAborted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newMem()
		d.route = func(from string, h *probe.Header, normal []string) map[string]time.Duration {
			r := map[string]time.Duration{}
			for _, u := range normal {
				r[u] = 100 * time.Millisecond // on time for 1s
			}
			return r
		}
		c := newMemCanary(t, d, 2, time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		if r := c.Round(ctx); r.Result != metrics.ResultAborted {
			t.Errorf("cancelled round = %s %v; want aborted", r.Result, reasons(r))
		}
		var counted float64
		for _, k := range metrics.Kinds {
			for _, res := range []string{metrics.ResultPass, metrics.ResultFail} {
				counted += metrics.Value(c.o.Metrics.CanaryRounds.WithLabelValues("t", k, res))
			}
		}
		if counted != 0 {
			t.Errorf("an aborted round was counted %v times as an SLI event, want 0", counted)
		}
	})
}

// Every message is delivered again 300ms later, within the 1s deadline.
func TestDuplicateWithinDeadlineFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newMem()
		d.dupAfter = 300 * time.Millisecond
		c := newMemCanary(t, d, 2, time.Second)
		if r := c.Round(context.Background()); r.Result == metrics.ResultPass {
			t.Errorf("pass although every message was delivered twice within the deadline: %+v", r.Checks)
		}
	})
}
