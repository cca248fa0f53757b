package report

import (
	"bytes"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// compareEarlierReport is renderTestReport's run a day earlier, healthy:
// the delivery p99 a quarter of the failed run's, a tenth of the loss, no
// duplicates, the same settings.
func compareEarlierReport() *Soak {
	r := renderTestReport()
	day := 24 * time.Hour
	r.ID = "20260313T090000Z-0e0e0e"
	r.Result = "pass"
	r.Start, r.End = r.Start.Add(-day), r.End.Add(-day)
	for i := range r.Phases {
		r.Phases[i].Start = r.Phases[i].Start.Add(-day)
	}
	for i := range r.Samples {
		s := &r.Samples[i]
		s.T = s.T.Add(-day)
		s.P50, s.P99, s.Max = s.P50/2, s.P99/4, s.Max/4
	}
	for k, p := range r.Latency {
		p.P99, p.Max = p.P99/4, p.Max/4
		r.Latency[k] = p
	}
	all := r.Deliveries["all"]
	all.LossRatio /= 10
	all.Duplicate = 0
	r.Deliveries["all"] = all
	return r
}

// renderCompareReport is renderTestReport compared with the earlier run
// as its previous one, with a baseline pinned and since pruned.
func renderCompareReport() *Soak {
	r := renderTestReport()
	r.Comparisons = []Comparison{
		Compare(AgainstPrevious, r, compareEarlierReport()),
		MissingComparison(AgainstBaseline, "the pinned baseline 20260301T090000Z-0b0b0b is no longer in the history (pruned by history.max_runs or history.max_age, or deleted)"),
	}
	return r
}

func TestCompareGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(io.Writer, *Soak) error
	}{
		{"report-compare.golden.json", WriteJSON},
		{"report-compare.golden.txt", WriteText},
		{"report-compare.golden.html", WriteHTML},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, renderCompareReport()); err != nil {
				t.Fatalf("write: %v", err)
			}
			if strings.HasSuffix(tc.name, ".html") {
				if svgs := renderHTMLCheck(t, b.String(), true); svgs != 5 {
					t.Errorf("page has %d charts, want the report's four and the comparison's", svgs)
				}
			}
			renderGolden(t, tc.name, b.Bytes())
		})
	}
}

// TestCompareRegression compares a run whose delivery p99 quadrupled and
// whose loss grew tenfold with the healthy run before it: both deltas are
// there, with their sizes, and judged worse; the same run compared with
// itself has no change at all, and nothing worse.
func TestCompareRegression(t *testing.T) {
	now, was := renderTestReport(), compareEarlierReport()
	c := Compare(AgainstPrevious, now, was)
	find := func(c Comparison, name string) Delta {
		t.Helper()
		i := slices.IndexFunc(c.Deltas, func(d Delta) bool { return d.Name == name })
		if i < 0 {
			t.Fatalf("Compare: no delta %q in %+v", name, c.Deltas)
		}
		return c.Deltas[i]
	}
	p99 := find(c, "delivery_direct p99")
	if p99.Was != 0.12 || p99.Now != 0.48 || math.Abs(p99.Change-0.36) > 1e-9 || !p99.Worse {
		t.Errorf("delivery_direct p99 = %+v, want 120ms → 480ms, +360ms, worse", p99)
	}
	if p99.Relative == nil || math.Abs(*p99.Relative-3) > 1e-9 {
		t.Errorf("delivery_direct p99 relative = %v, want 3 (+300%%)", p99.Relative)
	}
	loss := find(c, "loss")
	if !(loss.Now > loss.Was) || !loss.Worse || math.Abs(*loss.Relative-9) > 1e-9 {
		t.Errorf("loss = %+v, want tenfold and worse", loss)
	}
	if row := renderDeltaRow(p99); !slices.Equal(row, []string{"delivery_direct p99", "120ms", "480ms", "+360ms", "+300%", "worse"}) {
		t.Errorf("renderDeltaRow(p99) = %q", row)
	}
	dup := find(c, "duplicates")
	if dup.Was != 0 || dup.Now == 0 || dup.Relative != nil || !dup.Worse {
		t.Errorf("duplicates = %+v, want from 0, no relative change, worse", dup)
	}
	if len(c.SettingsChanged) != 0 {
		t.Errorf("SettingsChanged = %q, want none: the same profile", c.SettingsChanged)
	}
	if len(c.Series) != len(was.Samples) || c.Series[1].Offset <= c.Series[0].Offset {
		t.Errorf("Series has %d samples, want %d in time order", len(c.Series), len(was.Samples))
	}

	same := Compare(AgainstPrevious, now, renderTestReport())
	for _, d := range same.Deltas {
		if d.Change != 0 || d.Worse {
			t.Errorf("a run beside itself: %+v, want no change", d)
		}
	}
}

// TestCompareSettingsChanged: a rate and a threshold changed, and a drill
// added, are named; the profile's name is not a setting.
func TestCompareSettingsChanged(t *testing.T) {
	was := renderTestReport()
	now := renderTestReport()
	now.Profile.Rate *= 2
	now.Profile.Thresholds.MaxLoss = 0.01
	now.Drill = renderDrillReport().Drill
	got := Compare(AgainstPrevious, now, was).SettingsChanged
	want := []string{"drill", "drill.fraction", "drill.pause_every_ns", "drill.pause_ns", "drill.read_delay_ns", "rate", "thresholds.max_loss"}
	if !slices.Equal(got, want) {
		t.Errorf("SettingsChanged = %q, want %q", got, want)
	}
	var b bytes.Buffer
	now.Comparisons = []Comparison{Compare(AgainstPrevious, now, was)}
	if err := WriteText(&b, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "settings changed since that run, so the deltas compare different experiments: drill, ") {
		t.Errorf("WriteText does not say the settings changed:\n%s", b.String())
	}
}

// TestCompareChart: the chart draws this run and the compared one, each
// as a line of its own, and there is none without a compared run.
func TestCompareChart(t *testing.T) {
	r := renderCompareReport()
	ch := renderCompareChart(r)
	if ch == nil {
		t.Fatal("renderCompareChart = nil with a previous run")
	}
	if len(ch.Lines) < 2 {
		t.Fatalf("chart has %d lines, want this run's and the previous run's", len(ch.Lines))
	}
	names := []string{}
	for _, l := range ch.Lines {
		names = append(names, l.Name)
	}
	if !slices.Contains(names, "previous p99 (20260313T090000Z-0e0e0e)") {
		t.Errorf("chart lines %q, want the previous run's", names)
	}
	r.Comparisons = r.Comparisons[1:] // only the missing baseline
	if ch := renderCompareChart(r); ch != nil {
		t.Errorf("renderCompareChart with no compared run = %d lines, want none", len(ch.Lines))
	}
}

// TestCompareStorm: a reconnect storm that took longer to recover, with
// slower logins, shows as worse recovery times; a time one run never
// reached is left out, not compared with 0.
func TestCompareStorm(t *testing.T) {
	was, now := renderStormReport(), renderStormReport()
	now.Storm.Recovery99 = 9 * time.Second
	now.Storm.Login.P99 = 400 * time.Millisecond
	now.Storm.Back = now.Storm.Dropped
	now.Storm.Recovery100, now.Storm.Reached100 = 20*time.Second, true
	c := Compare(AgainstPrevious, now, was)
	byName := map[string]Delta{}
	for _, d := range c.Deltas {
		byName[d.Name] = d
	}
	if d, ok := byName["storm recovery 99%"]; !ok || d.Was != 5.1 || d.Now != 9 || !d.Worse {
		t.Errorf("storm recovery 99%% = %+v (found %v), want 5.1s → 9s, worse", d, ok)
	}
	if d, ok := byName["storm login p99"]; !ok || d.Was != 0.088 || d.Now != 0.4 || !d.Worse {
		t.Errorf("storm login p99 = %+v (found %v), want 88ms → 400ms, worse", d, ok)
	}
	if d, ok := byName["storm sessions back"]; !ok || d.Now != 1 || d.Worse {
		t.Errorf("storm sessions back = %+v (found %v), want all back now, better", d, ok)
	}
	if d, ok := byName["storm recovery 100%"]; ok {
		t.Errorf("storm recovery 100%% = %+v, want none: the earlier run never had all back", d)
	}
	plain := Compare(AgainstPrevious, renderTestReport(), compareEarlierReport())
	for _, d := range plain.Deltas {
		if strings.HasPrefix(d.Name, "storm") {
			t.Errorf("runs without a storm drill compared on %q", d.Name)
		}
	}
}
