package report

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// searchTestReport is a search that found its knee at 60 after 7 steps,
// compared with a previous search whose knee was 80 and with no baseline.
func searchTestReport() *Search {
	t0 := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	step := func(v float64, result string, p99 time.Duration, deliv, loss float64, failed ...Threshold) SearchStep {
		rt := 1.0
		if p99 > time.Second {
			rt = 0.4
		}
		return SearchStep{Value: v, Result: result, RunID: "r" + searchValue(v), SentPerSec: v * 20, DeliveredPerSec: deliv,
			P99Delivery: p99, P99Ack: 3 * time.Millisecond, LossRatio: loss, Realtime: rt, Failed: failed}
	}
	p99 := func(actual string, v float64) Threshold {
		return Threshold{Name: "p99_delivery", Limit: "150ms", Actual: actual, LimitValue: 0.15, ActualValue: v}
	}
	s := &Search{
		ID: "20261207T040000Z-ab12", Kind: "search", Target: "refserver", Profile: "find-limit", Vary: "rate",
		Start: 10, Max: 400, Factor: 2, Precision: 0.05, Result: SearchFound, Knee: 60, FirstFail: 62.5,
		Broke: []Threshold{p99("210ms", 0.21)},
		Steps: []SearchStep{
			step(10, "pass", 4*time.Millisecond, 1900, 0),
			step(20, "pass", 5*time.Millisecond, 3800, 0),
			step(40, "pass", 6*time.Millisecond, 7600, 0),
			step(80, "fail", 2*time.Second, 9000, 0.12, p99("2s", 2), Threshold{Name: "max_loss", Limit: "0.1%", Actual: "12%"}),
			step(60, "pass", 90*time.Millisecond, 11400, 0),
			step(70, "fail", 900*time.Millisecond, 11800, 0.01, p99("900ms", 0.9)),
			step(62.5, "fail", 210*time.Millisecond, 11850, 0, p99("210ms", 0.21)),
		},
		StartTime: t0, EndTime: t0.Add(57 * time.Second),
		Settings: Profile{Name: "find-limit", Users: 20, GroupSize: 5, Rate: 10, Ramp: time.Second, Duration: 5 * time.Second,
			Drain: time.Second, Deadline: 5 * time.Second,
			Thresholds: Thresholds{MaxLoss: 0.001, P99Ack: time.Second, P99Delivery: 150 * time.Millisecond}},
		CatchUp: "off",
		Notes:   []string{"Each step is a run of profile find-limit."},
	}
	was := *s
	was.ID, was.StartTime, was.Knee, was.FirstFail = "20261201T040000Z-cd34", t0.Add(-6*24*time.Hour), 80, 85
	was.Settings.Users = 30
	was.Steps = []SearchStep{step(10, "pass", 3*time.Millisecond, 1900, 0), step(80, "pass", 100*time.Millisecond, 15000, 0), step(85, "fail", time.Second, 15500, 0.02)}
	was.Settings.Rate = 20 // the varied value: not a change of set-up
	s.Comparisons = []SearchComparison{
		CompareSearch(AgainstPrevious, s, &was),
		MissingSearchComparison(AgainstBaseline, `no baseline is pinned for profile "find-limit"`),
	}
	return s
}

func TestSearchGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(*bytes.Buffer, *Search) error
	}{
		{"search.golden.txt", func(b *bytes.Buffer, s *Search) error { return WriteSearchText(b, s) }},
		{"search.golden.json", func(b *bytes.Buffer, s *Search) error { return WriteSearchJSON(b, s) }},
		{"search.golden.html", func(b *bytes.Buffer, s *Search) error { return WriteSearchHTML(b, s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, searchTestReport()); err != nil {
				t.Fatal(err)
			}
			renderGolden(t, tc.name, b.Bytes())
		})
	}
}

func TestCompareSearch(t *testing.T) {
	s := searchTestReport()
	c := s.Comparisons[0]
	if c.ID != "20261201T040000Z-cd34" || len(c.Steps) != 3 {
		t.Fatalf("comparison %+v: want the previous search's id and its 3 steps", c.Comparison)
	}
	if !slices.Equal(c.SettingsChanged, []string{"users"}) {
		t.Errorf("settings changed %q, want [users]: the varied rate is no change of set-up", c.SettingsChanged)
	}
	want := map[string][2]bool{"knee": {true, true}, "first failing": {true, true}}
	for _, d := range c.Deltas {
		w, ok := want[d.Name]
		if !ok {
			t.Errorf("unexpected delta %q", d.Name)
			continue
		}
		delete(want, d.Name)
		if d.Worse != w[1] {
			t.Errorf("%s %v → %v: worse %v, want %v (a lower knee is worse)", d.Name, d.Was, d.Now, d.Worse, w[1])
		}
	}
	if len(want) > 0 {
		t.Errorf("deltas missing: %v", want)
	}
	// A higher knee is better.
	better := CompareSearch(AgainstBaseline, s, &Search{Knee: 50, FirstFail: 55, Vary: "rate", Settings: s.Settings, Target: s.Target,
		CatchUp: s.CatchUp, Start: s.Start, Max: s.Max, Factor: s.Factor, Precision: s.Precision})
	for _, d := range better.Deltas {
		if d.Worse {
			t.Errorf("%s %v → %v judged worse", d.Name, d.Was, d.Now)
		}
	}
	if len(better.SettingsChanged) != 0 {
		t.Errorf("same set-up read as changed: %q", better.SettingsChanged)
	}
}

func TestWriteSearchHTML(t *testing.T) {
	var b bytes.Buffer
	if err := WriteSearchHTML(&b, searchTestReport()); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if n := renderHTMLCheck(t, page, true); n != 3 {
		t.Errorf("%d <svg> elements, want 3: latency, throughput, loss", n)
	}
	for _, want := range []string{
		"<title>FOUND · search find-limit · refserver</title>",
		"knee: 60 messages per second per user passed, 62.5 failed; first to break: p99_delivery 210ms against 150ms",
		"First to break, at 62.5 messages per second per user",
		">knee 60", ">first failing 62.5", // marks
		">p99 delivery limit 150ms</text>", ">loss limit 0.10%</text>",
		"<title>previous</title>", // the compared search's lines
		"compared with the previous search 20261201T040000Z-cd34",
		"compared with the baseline search: none: no baseline is pinned",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Steps in the order they ran, each with its verdict.
	if got := strings.Count(page, `<span class="pill fail">FAIL</span>`); got != 4 {
		t.Errorf("%d FAIL pills, want 4: three failed steps and the threshold that broke", got)
	}
	// A series joins its steps in order of value across the values only
	// the other search tried: this search's p99 delivery line has all 7.
	i := strings.Index(page, `<title>p99 delivery</title>`)
	j := strings.LastIndex(page[:max(i, 0)], "<polyline points=")
	if i < 0 || j < 0 || strings.Count(page[j:i], ",") != 7 {
		t.Errorf("this search's p99 delivery is not one line of 7 points")
	}
}
