package engine

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/imcanary/imcanary/metrics"
)

// Why a session ended, at info level: a server that closes sessions (a
// pong it never got, a slow consumer, a protocol error) is the first thing
// an operator of a staging server looks for, and at debug level nobody
// sees it. A storm of thousands of ends must not flood the log, so lines
// are rate-limited; the count of those not logged goes into the next line
// that is, and imcanary_session_disconnects_total has them all.
const (
	endBurst = 10
	endEvery = 10 * time.Second
)

// endLog logs session ends at a bounded rate. Safe for concurrent use.
type endLog struct {
	log *slog.Logger
	lim *rate.Limiter
	// skipped counts the ends not logged since the last line.
	skipped atomic.Int64
}

func newEndLog(log *slog.Logger) *endLog {
	return &endLog{log: log, lim: rate.NewLimiter(rate.Every(endEvery), endBurst)}
}

// note logs that user's device's session ended for reason with err. The
// ends imcanary itself caused (churn, shutdown) stay at debug level.
func (el *endLog) note(user string, device int32, reason string, err error) {
	if el == nil {
		return
	}
	level := slog.LevelInfo
	if reason == metrics.ReasonChurn || reason == metrics.ReasonShutdown {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !el.log.Enabled(ctx, level) {
		return
	}
	if level == slog.LevelInfo && !el.lim.Allow() {
		el.skipped.Add(1)
		return
	}
	attrs := []slog.Attr{slog.String("user", user), slog.Int("device", int(device)), slog.String("reason", reason)}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	if level == slog.LevelInfo {
		if n := el.skipped.Swap(0); n > 0 {
			attrs = append(attrs, slog.Int64("not_logged_before", n), slog.String("see", "imcanary_session_disconnects_total"))
		}
	}
	el.log.LogAttrs(ctx, level, "session ended", attrs...)
}
