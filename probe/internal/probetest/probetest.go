// Package probetest holds what the adapters' integration tests share: a
// driver wrapper that can drop a user's sessions and keep the user away,
// the ledger's totals of a cohort, and the wait for a soak to settle. It
// is imported by tests only.
package probetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// Totals are a cohort's counts over both kinds of conversation.
type Totals struct {
	Sent, Expected, Delivered, Recovered, Lost, Late, Dup, Reordered float64
}

func (c Totals) String() string {
	return fmt.Sprintf("{sent:%v expected:%v delivered:%v recovered:%v lost:%v late:%v dup:%v reordered:%v}",
		c.Sent, c.Expected, c.Delivered, c.Recovered, c.Lost, c.Late, c.Dup, c.Reordered)
}

// Accounted reports whether every owed delivery is delivered, recovered
// or lost.
func (c Totals) Accounted() bool {
	return c.Expected > 0 && c.Delivered+c.Recovered+c.Lost == c.Expected
}

// Cohort returns co's totals in set.
func Cohort(set *metrics.Set, co metrics.Cohort) Totals {
	var c Totals
	for _, k := range set.Kind {
		r := k.Cohort[co]
		c.Sent += metrics.Value(k.Sent)
		c.Expected += metrics.Value(r.Expected)
		c.Delivered += metrics.Value(r.Delivered)
		c.Recovered += metrics.Value(r.Recovered)
		c.Lost += metrics.Value(r.Lost)
		c.Late += metrics.Value(r.Late)
		c.Dup += metrics.Value(r.Duplicate)
		c.Reordered += metrics.Value(r.Reordered)
	}
	return c
}

// Settle stops pop sending and waits until every send is acked or failed
// and every owed delivery of co is accounted for, or twice lostAfter and a
// margin, sweeping meanwhile. A settle that runs out of time says so in
// tb's log: the totals it returns then hold deliveries still in flight.
func Settle(tb testing.TB, pop *engine.Population, set *metrics.Set, lostAfter time.Duration, co metrics.Cohort) Totals {
	tb.Helper()
	limit := 2*lostAfter + 5*time.Second
	if !testwait.Settle(pop, 0, limit, func() bool { return Cohort(set, co).Accounted() }) {
		tb.Logf("not settled in %v: %d sends await their ack; %v", limit, pop.Inflight(), Cohort(set, co))
	}
	return Cohort(set, co)
}

// SoakUntil lets pop send until n deliveries are owed to co, or for
// limit, then settles.
func SoakUntil(tb testing.TB, pop *engine.Population, set *metrics.Set, n float64, limit, lostAfter time.Duration, co metrics.Cohort) Totals {
	tb.Helper()
	for end := time.Now().Add(limit); time.Now().Before(end) && Cohort(set, co).Expected < n; {
		time.Sleep(100 * time.Millisecond)
	}
	return Settle(tb, pop, set, lostAfter, co)
}

// Quantile estimates the q-quantile of a histogram from its buckets, as
// Prometheus's histogram_quantile does at its coarsest: the upper bound of
// the bucket it falls in (enough to say where latency stands).
func Quantile(o prometheus.Observer, q float64) time.Duration {
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil || m.Histogram == nil {
		return -1
	}
	n := float64(m.Histogram.GetSampleCount())
	for _, b := range m.Histogram.Bucket {
		if float64(b.GetCumulativeCount()) >= q*n {
			return time.Duration(b.GetUpperBound() * float64(time.Second))
		}
	}
	return -1
}

// Killer wraps a driver: it records each session it connects, so that
// Kill can drop a user's sessions as a lost link does (Abort), and keeps
// a killed user away for as long as the test says.
type Killer struct {
	probe.Driver
	// Abort ends a session without a goodbye.
	Abort func(probe.Session)
	// Provisioned, if set, is told how long each Provision took.
	Provisioned func(plan probe.Plan, took time.Duration, err error)

	mu       sync.Mutex
	sessions map[string][]probe.Session
	away     map[string]time.Time
}

// Provision implements probe.Driver.
func (k *Killer) Provision(ctx context.Context, plan probe.Plan) error {
	began := time.Now()
	err := k.Driver.Provision(ctx, plan)
	if k.Provisioned != nil {
		k.Provisioned(plan, time.Since(began), err)
	}
	return err
}

// Connect implements probe.Driver.
func (k *Killer) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	k.mu.Lock()
	until := k.away[user]
	k.mu.Unlock()
	if time.Now().Before(until) {
		return nil, fmt.Errorf("%s held away by the test", user)
	}
	s, err := k.Driver.Connect(ctx, user, dev)
	if err == nil {
		k.mu.Lock()
		if k.sessions == nil {
			k.sessions = map[string][]probe.Session{}
		}
		k.sessions[user] = append(k.sessions[user], s)
		k.mu.Unlock()
	}
	return s, err
}

// MirrorsOwn passes the wrapped driver's probe.Mirror on.
func (k *Killer) MirrorsOwn() bool {
	m, ok := k.Driver.(probe.Mirror)
	return ok && m.MirrorsOwn()
}

// Kill drops user's sessions and keeps the user away for away. It
// returns how many sessions it dropped.
func (k *Killer) Kill(user string, away time.Duration) int {
	k.mu.Lock()
	if k.away == nil {
		k.away = map[string]time.Time{}
	}
	k.away[user] = time.Now().Add(away)
	ss := k.sessions[user]
	if k.sessions != nil {
		k.sessions[user] = nil
	}
	k.mu.Unlock()
	for _, s := range ss {
		k.Abort(s)
	}
	return len(ss)
}
