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
