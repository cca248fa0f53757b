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
	for end := time.Now().Add(d); !cond(); time.Sleep(poll) {
		if time.Now().After(end) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
