package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/imcanary/imcanary/engine"
)

// watch logs the target's state as an on-call engineer reads it: one line
// per change, in words, and no more than one line per minGap however the
// target flaps.
//
//	target unreachable: connection refused (dial tcp 127.0.0.1:7070: …); 0 of 100 online
//	target back after 12s; 100 of 100 online
//	target back after 37s–1m4s (the outage ended between …); 100 of 100 online
//	sessions below target: 60 of 100 online for 30s; the target takes logins
//	sessions back: 100 of 100 online after 45s
//
// Without it, losing the target left nothing in the log at INFO or WARN:
// each failed reconnect is a debug line, as it must be with thousands of
// users.
type watch struct {
	reach *engine.Reach
	// pop reports the background population: online sessions, the users
	// it is meant to keep online, and whether it has ever been whole (the
	// ramp is not a shortfall).
	pop func() (online, users int, ready bool)
	log *slog.Logger
	// settle is how long a shortfall of sessions must last to be logged,
	// and how long a population whose target came back gets to log in
	// again before "target back" is logged with the count so far: a
	// reconnect wave takes up to a backoff cap to come home.
	settle time.Duration
	// minGap is the least time between two lines.
	minGap time.Duration

	logged   watchState // the state the log last reported
	loggedAt time.Time  // when that state began, as the log told it
	raw      watchState // the state seen at the last step
	rawSince time.Time
	due      watchState // raw once it has lasted (see step)
	lastLine time.Time
	// changes counts the changes of due since the last line: a line
	// reports one, and says how many more the rate limit swallowed.
	changes int
}

type watchState uint8

const (
	watchUp watchState = iota
	watchShort
	watchDown
)

// watchTick is how often the watch looks.
const watchTick = time.Second

// newWatch watches reach and the population pop. backoffMax sizes settle.
func newWatch(reach *engine.Reach, pop func() (int, int, bool), backoffMax time.Duration, log *slog.Logger) *watch {
	return &watch{
		reach: reach, pop: pop, log: log,
		settle: max(5*time.Second, backoffMax),
		minGap: 10 * time.Second,
	}
}

// run steps every watchTick until ctx ends.
func (w *watch) run(ctx context.Context) {
	t := time.NewTicker(watchTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.step(now)
		}
	}
}

// step looks once and logs a change that is due.
func (w *watch) step(now time.Time) {
	st := w.reach.State()
	online, users, ready := w.pop()
	s := watchUp
	switch {
	case st.Known && !st.Reachable:
		s = watchDown
	case ready && online < users:
		s = watchShort
	}
	if s != w.raw {
		w.raw, w.rawSince = s, now
	}
	// A shortfall of sessions is a state only once it has lasted: kicks,
	// churn and a target coming back all make short ones. Until then the
	// state is what it was.
	if s == watchShort && now.Sub(w.rawSince) < w.settle {
		s = w.due
	}
	if s != w.due {
		w.changes++
		w.due = s
	}
	if s == w.logged {
		return
	}
	if !w.lastLine.IsZero() && now.Sub(w.lastLine) < w.minGap {
		return
	}
	more := w.changes - 1
	w.changes = 0
	w.lastLine = now
	prev, prevAt := w.logged, w.loggedAt
	w.logged, w.loggedAt = s, now
	counts := fmt.Sprintf("%d of %d online", online, users)
	suffix := ""
	if more > 0 {
		suffix = fmt.Sprintf(" (%d more changes since the last line)", more)
	}
	attrs := []any{"online", online, "users", users}
	switch {
	case s == watchDown:
		w.loggedAt = st.Since
		attrs = append(attrs, "reason", st.Reason, "err", st.Err)
		w.log.Warn("target unreachable: "+st.Cause()+"; "+counts+suffix, attrs...)
	case prev == watchDown:
		// The outage ended between the last attempt that failed and the
		// first login that succeeded, which reconnects backing off can
		// put a backoff cap apart: both are said, not the time this line
		// is written, which waits for the population too.
		away, least := now.Sub(prevAt), time.Duration(0)
		if st.Reachable && !st.Since.Before(prevAt) {
			away = st.Since.Sub(prevAt)
			if st.LastFailure.After(prevAt) && st.LastFailure.Before(st.Since) {
				least = st.LastFailure.Sub(prevAt)
			}
		}
		away, least = away.Round(time.Second), least.Round(time.Second)
		if s == watchShort {
			counts += " so far"
		}
		if least > 0 && least < away {
			w.log.Info(fmt.Sprintf("target back after %v–%v (the outage ended between the last attempt that failed and the first login); %s%s", least, away, counts, suffix),
				append(attrs, "down_for", away.String(), "down_at_least", least.String())...)
			break
		}
		w.log.Info(fmt.Sprintf("target back after %v; %s%s", away, counts, suffix), append(attrs, "down_for", away.String())...)
	case s == watchShort:
		lasted := now.Sub(w.rawSince).Round(time.Second)
		w.loggedAt = w.rawSince
		w.log.Warn(fmt.Sprintf("sessions below target: %s for %v; the target takes logins%s", counts, lasted, suffix), attrs...)
	default: // short → up
		took := now.Sub(prevAt).Round(time.Second)
		w.log.Info(fmt.Sprintf("sessions back: %s after %v%s", counts, took, suffix), attrs...)
	}
}
