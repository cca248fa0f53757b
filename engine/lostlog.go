package engine

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The lost log: each loss the ledger decides is logged with the ids of the
// messages written off, so that a page leads to the server's logs for those
// exact messages. A burst of losses (an outage) must not flood the log, so
// lines are rate-limited, and what was not logged one by one is summed up in
// a line of its own.

const (
	// lostBurst lines may be logged at once, then lostRate a second: an
	// outage that loses thousands of messages logs its first few gaps,
	// which name the streams and times to look at.
	lostBurst = 20
	lostRate  = 1
	// lostSummaryEvery is how often at most the summary of what was not
	// logged is logged.
	lostSummaryEvery = 10 * time.Second
)

// lostLog logs lost messages at a bounded rate. It is shared by every inbox
// of a ledger; note is called with an inbox's lock held, and costs a token
// check when the bound is reached.
type lostLog struct {
	log *slog.Logger
	lim *rate.Limiter
	// skipped and skippedMsgs count the spans and messages not logged
	// since the last summary.
	skipped, skippedMsgs atomic.Int64
	summary              rate.Sometimes
}

func newLostLog(log *slog.Logger) *lostLog {
	return &lostLog{
		log:     log,
		lim:     rate.NewLimiter(lostRate, lostBurst),
		summary: rate.Sometimes{Interval: lostSummaryEvery},
	}
}

// note logs the seqs lo through hi of the stream with inbox key key as lost
// by in's device. before (Unix ns) is the intended send time of the first
// message received after them: they were sent before it.
func (ll *lostLog) note(in *Inbox, key string, lo, hi uint64, before int64) {
	if ll == nil {
		return
	}
	if !ll.lim.Allow() {
		ll.skipped.Add(1)
		ll.skippedMsgs.Add(int64(hi - lo + 1))
		return
	}
	run, rest, _ := strings.Cut(key, " ")
	sender, stream, _ := strings.Cut(rest, " ")
	ll.log.LogAttrs(context.Background(), slog.LevelWarn, "messages lost",
		slog.String("run", run), slog.String("sender", sender), slog.String("stream", stream),
		slog.Uint64("first_seq", lo), slog.Uint64("last_seq", hi), slog.Uint64("count", hi-lo+1),
		slog.String("recipient", string(in.self)), slog.Int("device", int(in.dev)),
		slog.Time("sent_before", time.Unix(0, before)))
}

// flush logs, at most every lostSummaryEvery, how many lost spans and
// messages were not logged one by one; the sweeper calls it.
func (ll *lostLog) flush() {
	if ll == nil || ll.skipped.Load() == 0 {
		return
	}
	ll.summary.Do(func() {
		spans, msgs := ll.skipped.Swap(0), ll.skippedMsgs.Swap(0)
		ll.log.LogAttrs(context.Background(), slog.LevelWarn, "more messages lost than logged one by one",
			slog.Int64("spans", spans), slog.Int64("messages", msgs),
			slog.String("see", "imcanary_deliveries_lost_total"))
	})
}
