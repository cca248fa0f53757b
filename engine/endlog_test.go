package engine

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// TestEndLogIsBounded: why a session ended is logged at info, a burst of
// ends at most endBurst lines and then one per endEvery, the next line
// carrying how many were not logged; imcanary's own ends stay at debug.
func TestEndLogIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		el := newEndLog(slog.New(slog.NewTextHandler(&buf, nil)))
		for range 3 * endBurst {
			el.note("imcanary-u1", 0, metrics.ReasonServerClose, errors.New(`close 3012 "no pong"`))
		}
		el.note("imcanary-u2", 1, metrics.ReasonChurn, nil)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != endBurst {
			t.Fatalf("%d lines for %d ends at once, want %d:\n%s", len(lines), 3*endBurst, endBurst, buf.String())
		}
		for _, want := range []string{"level=INFO", "session ended", "user=imcanary-u1", "reason=server_close", `no pong`} {
			if !strings.Contains(lines[0], want) {
				t.Errorf("line %q lacks %q", lines[0], want)
			}
		}
		buf.Reset()
		time.Sleep(endEvery)
		el.note("imcanary-u3", 0, metrics.ReasonSlowConsumer, nil)
		if got := buf.String(); !strings.Contains(got, "reason=slow_consumer") || !strings.Contains(got, "not_logged_before=20") {
			t.Errorf("the line after the burst: %q, want it to count the 20 not logged", got)
		}
	})
}
