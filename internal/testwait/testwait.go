// Package testwait is the one way imcanary's tests wait for a condition
// that another goroutine or process brings about: poll it, and fail the
// test, naming what it waited for, once the time allowed has passed.
package testwait

import (
	"testing"
	"time"
)

// poll is how often For checks: short beside any wait worth writing, long
// enough not to compete with what it waits for.
const poll = 5 * time.Millisecond

// For polls cond until it holds, and fails tb (Fatal) if it does not
// within d: "timed out after D waiting for WHAT".
func For(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	Every(tb, d, poll, what, cond)
}

// Every is For, checking every interval: for a cond that costs a scrape
// or a request.
func Every(tb testing.TB, d, interval time.Duration, what string, cond func() bool) {
	tb.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(interval) {
		if time.Now().After(end) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// Sweeper is a population under test, as Traffic and Settle drive it.
type Sweeper interface {
	SetSending(bool)
	Sweep(now time.Time)
	// Inflight is how many sends await their ack: each may still add
	// deliveries owed.
	Inflight() int
}

// sweepEvery is how often Traffic and Settle sweep: the population's own
// sweeper runs at its heartbeat, which tests make long.
const sweepEvery = 50 * time.Millisecond

// Traffic lets p send for d of wall-clock time, sweeping as its sweeper
// does: the tests over loopback that use it measure a real server's
// traffic, which no fake clock can hurry.
func Traffic(p Sweeper, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(min(sweepEvery, time.Until(end))) {
		p.Sweep(time.Now())
	}
}

// Settle stops p sending and sweeps until no send awaits its ack and
// accounted reports every owed message delivered or lost, then lets linger
// pass (for duplicates and stragglers; 0 for none) and sweeps once more.
// It gives up after limit, and reports whether it settled.
//
// accounted alone is not enough: an ack that comes after it held makes
// more deliveries owed (CI saw 5,982 of 5,985 accounted a moment after all
// were).
func Settle(p Sweeper, linger, limit time.Duration, accounted func() bool) bool {
	p.SetSending(false)
	for end := time.Now().Add(limit); ; time.Sleep(sweepEvery) {
		p.Sweep(time.Now())
		if p.Inflight() == 0 && accounted() {
			break
		}
		if time.Now().After(end) {
			return false
		}
	}
	Traffic(p, linger)
	p.Sweep(time.Now())
	return true
}
