package soak

import (
	"testing"
	"time"

	"github.com/imcanary/imcanary/report"
)

// TestShortIntervalFolded: the run's last sample, 2 ms after the tick
// before it, is folded into that one: the chart's rates are over whole
// intervals, and what the last sample counts from the start is kept.
func TestShortIntervalFolded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var samples []report.Sample
	var lastDT float64
	// Three 1 s ticks at 20 sent/s and 50 delivered/s.
	for i := 1; i <= 3; i++ {
		samples, lastDT = appendSample(samples, lastDT, report.Sample{T: t0.Add(time.Duration(i) * time.Second), Lost: int64(i)}, 20, 50, 1, 0.5)
	}
	// The end: 2 ms later, 21 more delivered (a frame's worth).
	end := t0.Add(3*time.Second + 2*time.Millisecond)
	samples, lastDT = appendSample(samples, lastDT, report.Sample{T: end, Lost: 7, Max: time.Second}, 0, 21, 0.002, 0.5)
	if len(samples) != 3 {
		t.Fatalf("%d samples, want the 2 ms one folded into the third", len(samples))
	}
	last := samples[2]
	if last.DelivPerSec > 100 || last.DelivPerSec < 50 {
		t.Errorf("last delivered/s %.0f, want (50+21)/1.002 s: a rate over 2 ms would be 10,500", last.DelivPerSec)
	}
	if last.SentPerSec > 20 || last.SentPerSec < 19.9 {
		t.Errorf("last sent/s %.2f, want 20/1.002", last.SentPerSec)
	}
	if !last.T.Equal(end) || last.Lost != 7 || last.Max != time.Second {
		t.Errorf("last sample %+v: want the end's time, its cumulative lost and the worse max", last)
	}
	if lastDT != 1.002 {
		t.Errorf("last span %v, want 1.002", lastDT)
	}
	// A whole interval is a sample of its own.
	samples, _ = appendSample(samples, lastDT, report.Sample{T: end.Add(time.Second)}, 10, 10, 1, 0.5)
	if len(samples) != 4 || samples[3].SentPerSec != 10 {
		t.Errorf("%d samples, last %+v: want a fourth at 10/s", len(samples), samples[len(samples)-1])
	}
}

// TestLateLoginCause: a p99 that fails on what was held for late logins
// says so, with the on-time recipients' own p99; one that fails on the
// on-time recipients says nothing of late logins.
func TestLateLoginCause(t *testing.T) {
	late, onTime := newHist(), newHist()
	for range 95 {
		record(late, 3*time.Second)
	}
	for range 5 {
		record(onTime, 3*time.Second)
	}
	for range 1000 {
		record(onTime, 20*time.Millisecond)
	}
	limit := 2 * time.Second
	ls, ots := above(late, limit), above(onTime, limit)
	if ls != 95 || ots != 5 {
		t.Fatalf("above %v: late %d, on time %d; want 95 and 5", limit, ls, ots)
	}
	got := lateLoginCause(ls, ots, limit, percentiles(onTime))
	want := "95% of the 100 deliveries slower than 2s went to users who logged in late (held for them while offline); the on-time recipients' p99 was 20ms"
	if got != want {
		t.Errorf("cause %q\nwant %q", got, want)
	}
	if c := lateLoginCause(5, 95, limit, percentiles(onTime)); c != "" {
		t.Errorf("cause %q when the on-time recipients were the slow ones, want none", c)
	}
	row := withCause(durationRow("p99_delivery", limit, 3872767*time.Microsecond), got)
	if row.Actual != "3.9s" || row.Limit != "2s" || row.Pass || row.Cause != got {
		t.Errorf("row %+v: want 3.9s against 2s, failed, with its cause", row)
	}
	if row := durationRow("p99_ack", 2*time.Second, 2004*time.Millisecond); row.Actual == row.Limit {
		t.Errorf("row %+v: an actual over the limit reads as the limit", row)
	}
}
