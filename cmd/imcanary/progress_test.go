package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
	"github.com/imcanary/imcanary/soak"
)

// TestProgressPrinter: the soak progress line tells an operator that loss
// is judged lost_after after sending, pending before that, on one line
// redrawn in place on a terminal and printed whole, every few seconds,
// elsewhere.
func TestProgressPrinter(t *testing.T) {
	early := soak.Progress{Phase: report.PhaseSend, Elapsed: 12 * time.Second, Remaining: 5 * time.Minute,
		Online: 500, Users: 500, SentPerSec: 250, DelivPerSec: 1225, LostAfter: 30 * time.Second}
	later := early
	later.Elapsed, later.LossJudged, later.Lost = 2*time.Minute, true, 3

	var b bytes.Buffer
	p := newProgressPrinter(&b)
	if p.terminal {
		t.Fatal("a buffer taken for a terminal")
	}
	p.print(early)
	p.print(later) // within 5 s of the first: not printed
	p.done()
	want := early.String() + "\n"
	if b.String() != want {
		t.Errorf("printed %q, want the first report only, %q", b.String(), want)
	}
	if !strings.Contains(b.String(), "lost pending (judged 30s after send)") {
		t.Errorf("printed %q before lost_after passed, want loss shown as pending and when it is judged", b.String())
	}

	b.Reset()
	p = &progressPrinter{w: &b, terminal: true}
	p.print(early)
	p.print(later)
	p.done()
	want = "\r\033[K" + early.String() + "\r\033[K" + later.String() + "\n"
	if b.String() != want {
		t.Errorf("terminal printed %q, want %q", b.String(), want)
	}
	if !strings.Contains(later.String(), "lost 3 (judged 30s after send)") {
		t.Errorf("later line %q, want lost 3 and when loss is judged", later.String())
	}
	for _, line := range []string{early.String(), later.String()} {
		if strings.ContainsAny(line, "\r\n") {
			t.Errorf("progress line %q is not one line", line)
		}
	}
}
