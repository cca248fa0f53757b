package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// retrier runs the canary round that canary.retry_after brings forward
// after a failed one. It holds at most one retry, pending or running, and
// runs it on its own goroutine, so retries never stack; a scheduled round
// that starts first takes the pending retry's place, and a retry that would
// still be running when the schedule's next round is due is left to that
// round, so the two never overlap.
type retrier struct {
	// after is canary.retry_after in force, read at each failure so that
	// a reload applies to the next one; 0 is off.
	after func() time.Duration
	// scheduled is when the schedule's next round is due after t.
	scheduled func(t time.Time) time.Time
	// span is the longest a round takes (see canaryRoundSpan).
	span func() time.Duration
	// round runs the retry round; it reports its outcome back through
	// ended, as every round does.
	round func(ctx context.Context)
	// left is told when a retry is left to the scheduled round.
	left func()
	log  *slog.Logger

	mu  sync.Mutex
	due time.Time // of the pending retry; zero for none
	// wake tells run that due changed. One slot: run rereads due, so
	// signals in a row are one.
	wake chan struct{}
}

func newRetrier(after func() time.Duration, scheduled func(time.Time) time.Time, span func() time.Duration,
	round func(context.Context), left func(), log *slog.Logger) *retrier {
	return &retrier{after: after, scheduled: scheduled, span: span, round: round, left: left, log: log, wake: make(chan struct{}, 1)}
}

// ended hears the outcome of every round that ran, scheduled or retried:
// a failure arms a retry at end + retry_after (replacing any pending), a
// pass disarms it. It returns when the retry is due, zero for none.
func (r *retrier) ended(end time.Time, pass bool) time.Time {
	after := r.after()
	var due time.Time
	if !pass && after > 0 {
		due = end.Add(after)
	}
	r.set(due)
	return due
}

// superseded is called when a scheduled round starts: it answers what a
// pending retry would have.
func (r *retrier) superseded() { r.set(time.Time{}) }

// pending returns when the pending retry is due, zero for none.
func (r *retrier) pending() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.due
}

func (r *retrier) set(due time.Time) {
	r.mu.Lock()
	r.due = due
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run waits for each retry to fall due and runs it, until ctx ends (the
// daemon's jobs context), which also ends a retry round in progress.
func (r *retrier) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		due := r.pending()
		var fire <-chan time.Time
		if !due.IsZero() {
			timer.Reset(time.Until(due))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			timer.Stop()
			continue
		case <-fire:
		}
		r.mu.Lock()
		if !r.due.Equal(due) {
			// Changed as the timer fired: the new due time wins.
			r.mu.Unlock()
			continue
		}
		r.due = time.Time{}
		r.mu.Unlock()
		now := time.Now()
		if next := r.scheduled(now); !next.IsZero() && next.Sub(now) < r.span() {
			r.log.Info("canary retry left to the scheduled round, which is due before a retry could end", "due", next)
			r.left()
			continue
		}
		r.log.Info("canary retry round: confirming or clearing the last round's failure")
		r.round(ctx)
	}
}
