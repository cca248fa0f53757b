package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

// TestProgressString: the progress line says when loss is judged, shows
// loss as pending until the first messages are old enough to be judged,
// and stays one line with its counts grouped.
func TestProgressString(t *testing.T) {
	p := Progress{Phase: report.PhaseSend, Elapsed: 72 * time.Second, Remaining: 378 * time.Second, Online: 12000, Users: 12000,
		SentPerSec: 2500.4, DelivPerSec: 12250.6, LostAfter: 30 * time.Second}
	for _, tc := range []struct {
		name     string
		judged   bool
		lost     int64
		wantLost string
	}{
		{"before lost_after", false, 0, "lost pending (judged 30s after send)"},
		{"after lost_after", true, 0, "lost 0 (judged 30s after send)"},
		{"losses", true, 1234, "lost 1,234 (judged 30s after send)"},
		// Whatever the runner says, a loss counted is shown.
		{"a loss before judging", false, 2, "lost 2 (judged 30s after send)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := p
			p.LossJudged, p.Lost = tc.judged, tc.lost
			got := p.String()
			if !strings.Contains(got, "  "+tc.wantLost+"  ") {
				t.Errorf("Progress.String() = %q, want it to contain %q", got, tc.wantLost)
			}
			if strings.ContainsAny(got, "\n\r") {
				t.Errorf("Progress.String() = %q, want one line", got)
			}
			for _, want := range []string{"1m12s elapsed", "6m18s left", "online 12,000/12,000", "sent 2,500/s", "delivered 12,251/s"} {
				if !strings.Contains(got, want) {
					t.Errorf("Progress.String() = %q, want it to contain %q", got, want)
				}
			}
		})
	}
	// Without a lost_after (a Progress from elsewhere), no claim about
	// when loss is judged.
	if got := (Progress{Phase: report.PhaseRamp, Elapsed: 400 * time.Millisecond}).String(); !strings.Contains(got, "lost pending  ") || strings.Contains(got, "judged") {
		t.Errorf("Progress{ramp}.String() = %q, want lost pending and no lost_after", got)
	}
}
