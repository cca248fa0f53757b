package report

import (
	"bytes"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The -update flag rewrites the golden files. Other test files of this
// package may define the same flag (the repository's convention), so it is
// defined here only if it is not yet: package-level flag variables are
// initialised before init functions run.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata/")
	}
}

func renderUpdating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// renderTestStart is the fixed start of the test run, so golden files do not
// change from day to day.
var renderTestStart = time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)

// renderTestReport builds a failed soak run the way the runner fills one:
// 500 users ramped in over a minute, five minutes of traffic, a 90 s
// drain, 60 samples of 7.5 s, a burst of loss and latency around the
// fourth minute when the server closed three sessions and dropped two slow
// consumers, and two thresholds failed.
func renderTestReport() *Soak {
	at := func(d time.Duration) time.Time { return renderTestStart.Add(d) }
	const (
		ramp     = time.Minute
		duration = 5 * time.Minute
		drain    = 90 * time.Second
		interval = 7500 * time.Millisecond
	)
	r := &Soak{
		ID:     "20260314T090000Z-4f2a9c",
		Kind:   "soak",
		Target: "prosody-staging",
		Profile: Profile{
			Name: "steady", Users: 500, GroupSize: 10, Rate: 0.5,
			Ramp: ramp, Duration: duration, Drain: drain, Deadline: 5 * time.Second,
			LateLogins: 0.02, LateAfter: 2 * time.Minute,
			Thresholds: Thresholds{
				MaxLoss: 0.001, MaxLate: 0.01, P99Ack: 500 * time.Millisecond,
				P99Delivery: 500 * time.Millisecond, MinOnlineRatio: 0.9, MaxDisconnects: 10,
			},
		},
		Result: "fail",
		Start:  renderTestStart,
		End:    at(ramp + duration + drain),
		Phases: []Phase{
			{Name: "ramp", Start: at(0)},
			{Name: "send", Start: at(ramp)},
			{Name: "drain", Start: at(ramp + duration)},
		},
		Users: Users{Configured: 500, LoggedIn: 497, FailedLogins: 6, Groups: 50, MinOnlineRatio: 0.9417},
		Messages: Messages{
			Sent: 75210, SentPerSec: 250.7, SendSeconds: 300, Acked: 75012, Unacked: 198, Offline: 143, WriteErrors: 3,
			Rejected: map[string]int64{"too_large": 2, "rate_limited": 41},
		},
		Disconnects: map[string]int64{"server_close": 3, "slow_consumer": 2, "error": 0},
		Latency: map[string]Percentiles{
			"login":           {Count: 503, P50: 85 * time.Millisecond, P95: 240 * time.Millisecond, P99: 610 * time.Millisecond, Max: 1900 * time.Millisecond, Mean: 110 * time.Millisecond},
			"ack":             {Count: 75012, P50: 4200 * time.Microsecond, P95: 18 * time.Millisecond, P99: 95 * time.Millisecond, Max: 3100 * time.Millisecond, Mean: 7 * time.Millisecond},
			"delivery_direct": {Count: 37452, P50: 11 * time.Millisecond, P95: 64 * time.Millisecond, P99: 480 * time.Millisecond, Max: 4600 * time.Millisecond, Mean: 21 * time.Millisecond},
			"delivery_group":  {Count: 337801, P50: 14 * time.Millisecond, P95: 88 * time.Millisecond, P99: 720 * time.Millisecond, Max: 4800 * time.Millisecond, Mean: 26 * time.Millisecond},
			// Split by recipient: 2% of the users logged in late.
			"delivery_on_time":    {Count: 368530, P50: 13 * time.Millisecond, P95: 80 * time.Millisecond, P99: 480 * time.Millisecond, Max: 4800 * time.Millisecond, Mean: 24 * time.Millisecond},
			"delivery_late_login": {Count: 6820, P50: 30 * time.Second, P95: 110 * time.Second, P99: 118 * time.Second, Max: 119 * time.Second, Mean: 41 * time.Second},
		},
		Errors: []ErrorCount{
			{Error: "ack timeout after 5s", Count: 181},
			{Error: "server refused message: rate_limited", Count: 41},
			{Error: "websocket: close 1001 (going away): server shutting down", Count: 3},
			{Error: "write: broken pipe", Count: 3},
			{Error: "login: authentication failed: not-authorized", Count: 2},
			{Error: "server refused message: too_large", Count: 2},
			{Error: "dial tcp 127.0.0.1:5280: connect: connection refused", Count: 1},
		},
		Notes: []string{
			"Latency is measured from each message's intended send time (open loop), so a sender that fell behind shows as latency.",
			"Loss ratio counts deliveries the ledger wrote off (lost) and those still missing when the drain ended (undelivered), over deliveries owed for acknowledged messages.",
		},
	}

	direct := Deliveries{Expected: 37600, Delivered: 37452, Lost: 120, Undelivered: 28, Late: 310, Duplicate: 4, Reordered: 17}
	group := Deliveries{Expected: 338490, Delivered: 337801, Recovered: 100, Lost: 561, Undelivered: 28, Late: 2811, Duplicate: 0, Reordered: 96}
	var all Deliveries
	for _, d := range []*Deliveries{&direct, &group} {
		d.LossRatio = float64(d.Lost+d.Undelivered) / float64(d.Expected)
		d.LateRatio = float64(d.Late) / float64(d.Delivered)
		d.RealtimeMissRatio = float64(d.Expected-d.Delivered+d.Late) / float64(d.Expected)
		all.Expected += d.Expected
		all.Delivered += d.Delivered
		all.Recovered += d.Recovered
		all.Lost += d.Lost
		all.Undelivered += d.Undelivered
		all.Late += d.Late
		all.Duplicate += d.Duplicate
		all.Reordered += d.Reordered
	}
	all.LossRatio = float64(all.Lost+all.Undelivered) / float64(all.Expected)
	all.LateRatio = float64(all.Late) / float64(all.Delivered)
	all.RealtimeMissRatio = float64(all.Expected-all.Delivered+all.Late) / float64(all.Expected)
	r.Deliveries = map[string]Deliveries{"direct": direct, "group": group, "all": all}
	r.CatchUp = "on"

	r.Thresholds = []Threshold{
		{Name: "max_loss", Limit: "0.1%", Actual: "0.196%", LimitValue: 0.001, ActualValue: all.LossRatio, Pass: false},
		{Name: "max_late", Limit: "1%", Actual: "0.8322%", LimitValue: 0.01, ActualValue: all.LateRatio, Pass: true},
		{Name: "p99_ack", Limit: "500ms", Actual: "95ms", LimitValue: 0.5, ActualValue: 0.095, Pass: true},
		{Name: "p99_delivery", Limit: "500ms", Actual: "712ms", LimitValue: 0.5, ActualValue: 0.712, Pass: false,
			Cause: "62.5% of the 3,771 deliveries slower than 500ms went to users who logged in late (held for them while offline); the on-time recipients' p99 was 480ms"},
		{Name: "min_online_ratio", Limit: "90%", Actual: "94.17%", LimitValue: 0.9, ActualValue: 0.9417, Pass: true},
		{Name: "max_disconnects", Limit: "10", Actual: "5", LimitValue: 10, ActualValue: 5, Pass: true},
		{Name: "all_users_logged_in", Limit: "500", Actual: "497", LimitValue: 500, ActualValue: 497, Pass: false},
		{Name: "deliveries", Limit: "≥ 1", Actual: "375253", LimitValue: 1, ActualValue: 375253, Pass: true},
	}

	// The series: a deterministic wobble stands in for noise.
	var lost, late, disc int64
	for i := 1; i <= 60; i++ {
		el := time.Duration(i) * interval
		wobble := float64((i*37)%11-5) / 5 // -1..1
		s := Sample{T: at(el)}
		var sent float64
		switch {
		case el <= ramp:
			s.Phase = "ramp"
			s.Online = int(500 * el / ramp)
			if s.Online == 500 {
				s.Online = 497
			}
			sent = float64(s.Online) * 0.5 * (1 + 0.02*wobble)
		case el <= ramp+duration:
			s.Phase = "send"
			s.Online = 495 + int(2*wobble)
			if el >= 195*time.Second && el < 240*time.Second {
				s.Online = 471 + int(3*wobble) // the server dropped sessions; they log back in
			}
			sent = 250 * (1 + 0.03*wobble)
		default:
			s.Phase = "drain"
			s.Online = 497
		}
		s.SentPerSec = sent
		s.DelivPerSec = sent * 4.9 * (1 + 0.01*wobble)
		s.P50 = time.Duration(12+2*wobble) * time.Millisecond
		s.P99 = time.Duration(160+40*wobble) * time.Millisecond
		s.Max = time.Duration(420+120*wobble) * time.Millisecond
		switch {
		case el >= 195*time.Second && el < 240*time.Second:
			// The burst: latency jumps, messages are written off.
			s.P50 = 95 * time.Millisecond
			s.P99 = 2400 * time.Millisecond
			s.Max = 4800 * time.Millisecond
			lost += min(120, 681-lost) // the run's 681 lost, all in the burst
			late += 300
		case s.Phase == "drain" && el > ramp+duration+45*time.Second:
			// Nothing left to arrive: no latency in the interval.
			s.DelivPerSec, s.P50, s.P99, s.Max = 0, 0, 0, 0
		case s.Phase == "drain":
			s.DelivPerSec = 400 / float64(i-47)
		default:
			late += int64(20 + 5*wobble)
		}
		if el == 195*time.Second {
			disc += 3
		}
		if el == 210*time.Second {
			disc += 2
		}
		s.Lost, s.Late, s.Disconnects = lost, late, disc
		r.Samples = append(r.Samples, s)
	}
	// Scale the late series to end on the run's total.
	for i := range r.Samples {
		r.Samples[i].Late = r.Samples[i].Late * all.Late / late
	}
	return r
}

// renderDrillReport is renderTestReport as a slow-reader drill whose
// prober was saturated during the burst: 25 of the 500 users read slowly
// and were disconnected as slow consumers, and imcanary itself was
// saturated for 37.5 s of the send phase and 7.5 s of the drain, so the
// failed thresholds make the run inconclusive.
func renderDrillReport() *Soak {
	r := renderTestReport()
	at := func(d time.Duration) time.Time { return renderTestStart.Add(d) }
	r.Result = "inconclusive"
	r.Drill = &Drill{
		SlowReaders: 25, Fraction: 0.05, ReadDelay: 50 * time.Millisecond,
		Pause: 30 * time.Second, PauseEvery: 2 * time.Minute,
		Deliveries: Deliveries{Expected: 18760, Delivered: 14203, Lost: 2880, Undelivered: 1677, Late: 9870},
		Latency: Percentiles{Count: 14203, P50: 4200 * time.Millisecond, P95: 27 * time.Second,
			P99: 31 * time.Second, Max: 33 * time.Second},
		NormalP99:   712 * time.Millisecond,
		Disconnects: map[string]int64{"slow_consumer": 58, "error": 3},
		CloseCodes:  map[string]int64{"4008": 58},
		TimeToDisconnect: Percentiles{Count: 61, P50: 21 * time.Second, P95: 33 * time.Second,
			P99: 35 * time.Second, Max: 36 * time.Second},
		MaxLagMessages: 3412,
	}
	dd := &r.Drill.Deliveries
	dd.LossRatio = float64(dd.Lost+dd.Undelivered) / float64(dd.Expected)
	dd.LateRatio = float64(dd.Late) / float64(dd.Delivered)
	dd.RealtimeMissRatio = float64(dd.Expected-dd.Delivered+dd.Late) / float64(dd.Expected)
	// The reaction and the notes are what the runner writes for these
	// numbers; soak's TestGoldenNotes checks that it still does.
	r.Drill.Reaction = "disconnected as slow consumers (close 4008) after 21s median: 25 of 25 slow readers, 61 disconnects (error 3, slow_consumer 58)"
	r.Saturation = &Saturation{
		Periods: []SaturatedPeriod{
			{Start: at(195 * time.Second), End: at(232500 * time.Millisecond), Causes: []string{"cpu", "gc_pause"}},
			{Start: at(397500 * time.Millisecond), End: at(405 * time.Second), Causes: []string{"receive_lag"}},
		},
		SendDrainRatio:  45.0 / 390,
		DeliverySamples: 41822,
	}
	var slowDisc int64
	for i := range r.Samples {
		s := &r.Samples[i]
		el := s.T.Sub(renderTestStart)
		if s.Phase != "ramp" && slowDisc < 61 {
			slowDisc = min(61, slowDisc+2)
		}
		s.SlowReaderDisconnects = slowDisc
		if s.Phase != "ramp" {
			s.SlowReaderLag = int64(800 + (i*53)%900)
		}
		for _, p := range r.Saturation.Periods {
			if el > p.Start.Sub(renderTestStart) && el <= p.End.Sub(renderTestStart) {
				s.Saturated, s.SaturationCauses = true, p.Causes
			}
		}
	}
	r.Notes = append([]string{"Inconclusive: max_loss, p99_delivery, all_users_logged_in failed while imcanary itself was saturated for 11.5% of the send and drain phases, " +
		"3m15s–3m53s into the run (send), 6m38s–6m45s into the run (drain), because of cpu, gc_pause, receive_lag; " +
		"41,822 delivery latency samples were recorded while it was. The failure may be imcanary's own rather than the server's, " +
		"so the run neither passes nor fails: give the prober more CPU, or lower the users or the rate, and run it again."}, r.Notes...)
	r.Notes = append(r.Notes, "Slow-reader drill: 25 of 500 users, spread evenly, read slowly (a pause of 30s at the first delivery of each session "+
		"and then every 2m of reading; 50ms after every delivery) and never send. "+
		"Deliveries, delivery latency, disconnects, min_online_ratio and the thresholds on them count the other users only; the drill section counts the slow readers. "+
		"Time to disconnect runs from when a slow reader started being slow (its session's login or the start of the send phase, whichever is later) "+
		"to when imcanary saw its session end, after reading what the server had sent before the close; "+
		"lag is the most messages acknowledged to a slow reader's conversations and not yet read, at the population's sweeps.")
	return r
}

// renderGolden compares got with testdata/name, or rewrites the file under
// -update.
func renderGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if renderUpdating() {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./soak -run Golden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update if the change is intended)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		write  func(io.Writer, *Soak) error
		report func() *Soak
	}{
		{"report.golden.json", WriteJSON, renderTestReport},
		{"report.golden.txt", WriteText, renderTestReport},
		{"report-drill.golden.json", WriteJSON, renderDrillReport},
		{"report-drill.golden.txt", WriteText, renderDrillReport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, tc.report()); err != nil {
				t.Fatalf("write: %v", err)
			}
			renderGolden(t, tc.name, b.Bytes())
		})
	}
}

// renderNormalise puts every time of r in UTC (which also drops the
// monotonic reading): JSON keeps the instant and the offset, not the
// *time.Location, so only UTC times compare equal after a round trip.
func renderNormalise(r *Soak) {
	r.Start, r.End = r.Start.UTC(), r.End.UTC()
	for i := range r.Phases {
		r.Phases[i].Start = r.Phases[i].Start.UTC()
	}
	for i := range r.Samples {
		r.Samples[i].T = r.Samples[i].T.UTC()
	}
	if r.Saturation != nil {
		for i := range r.Saturation.Periods {
			p := &r.Saturation.Periods[i]
			p.Start, p.End = p.Start.UTC(), p.End.UTC()
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	zoned := renderTestReport()
	paris := time.FixedZone("CET", 3600)
	zoned.Start = zoned.Start.In(paris)
	zoned.Samples[3].T = zoned.Samples[3].T.In(paris)

	drill := renderDrillReport()
	for name, r := range map[string]*Soak{
		"full":  renderTestReport(),
		"drill": drill,
		"zoned": zoned,
		"empty": {ID: "x", Result: "aborted"},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteJSON(&b, r); err != nil {
				t.Fatalf("WriteJSON: %v", err)
			}
			got, err := ReadJSON(&b)
			if err != nil {
				t.Fatalf("ReadJSON: %v", err)
			}
			renderNormalise(r)
			renderNormalise(got)
			if !reflect.DeepEqual(got, r) {
				t.Errorf("ReadJSON(WriteJSON(r)) = %+v, want %+v", got, r)
			}
		})
	}
}

func TestWriteJSONFieldNames(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, renderTestReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// Durations are integer nanoseconds under _ns names, two-space indent.
	for _, want := range []string{
		"\n  \"id\": ", "\n    \"ramp_ns\": 60000000000,", "\"p99_delivery_ns\": 500000000",
		"\"max_ns\": 4800000000", "\"sent_per_second\": 250.7", "\"delivered_per_second\": ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteJSON output lacks %q", want)
		}
	}
}

// TestWriteJSONDrillFieldNames pins the names of the drill and saturation
// fields, which pipelines read.
func TestWriteJSONDrillFieldNames(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, renderDrillReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"\n  \"drill\": {", "\"slow_readers\": 25,", "\"fraction\": 0.05,", "\"read_delay_ns\": 50000000,",
		"\"pause_ns\": 30000000000,", "\"pause_every_ns\": 120000000000,", "\"reaction\": \"disconnected as slow consumers",
		"\"normal_p99_ns\": 712000000,", "\"close_codes\": {", "\"4008\": 58", "\"time_to_disconnect\": {",
		"\"max_lag_messages\": 3412", "\n  \"saturation\": {", "\"periods\": [", "\"causes\": [",
		"\"send_drain_ratio\": ", "\"delivery_samples\": 41822", "\"slow_reader_disconnects\": ",
		"\"slow_reader_lag_messages\": ", "\"saturated\": true", "\"saturation_causes\": [",
		"\"result\": \"inconclusive\"",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteJSON output lacks %q", want)
		}
	}
	// Without a drill or saturation the report does not mention them.
	b.Reset()
	if err := WriteJSON(&b, renderTestReport()); err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"drill", "saturat", "slow_reader"} {
		if strings.Contains(b.String(), absent) {
			t.Errorf("WriteJSON of a report without a drill or saturation mentions %q", absent)
		}
	}
}

func TestReadJSONErrors(t *testing.T) {
	for _, in := range []string{"", "{", `{"id": 1}`, `{"id": "a"} {"id": "b"}`, `[]`} {
		if _, err := ReadJSON(strings.NewReader(in)); err == nil {
			t.Errorf("ReadJSON(%q) = nil error, want one", in)
		}
	}
	// A newer report's extra fields do not stop an older reader.
	r, err := ReadJSON(strings.NewReader(`{"id": "a", "added_later": {"x": 1}}` + "\n"))
	if err != nil || r.ID != "a" {
		t.Errorf("ReadJSON(extra field) = %v, %v, want id a, nil", r, err)
	}
}

func TestRenderLatency(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0ns"},
		{850 * time.Nanosecond, "850ns"},
		{1500 * time.Nanosecond, "1.5µs"},
		{850 * time.Microsecond, "850µs"},
		{999600 * time.Nanosecond, "1ms"},
		{1200 * time.Microsecond, "1.2ms"},
		{1234567 * time.Nanosecond, "1.2ms"},
		{9960 * time.Microsecond, "10ms"},
		{35 * time.Millisecond, "35ms"},
		{350 * time.Millisecond, "350ms"},
		{999700 * time.Microsecond, "1s"},
		{2 * time.Second, "2s"},
		{2140 * time.Millisecond, "2.1s"},
		{42 * time.Second, "42s"},
		{59700 * time.Millisecond, "1m"},
		{95 * time.Second, "1m35s"},
		{time.Hour, "1h"},
		{-3 * time.Millisecond, "-3ms"},
		{math.MaxInt64, "2562047h47m16s"},
		{math.MinInt64, "-2562047h47m16s"},
	} {
		if got := renderLatency(tc.in); got != tc.want {
			t.Errorf("renderLatency(%d) = %q, want %q", int64(tc.in), got, tc.want)
		}
	}
}

func TestRenderTickLabels(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0.001, "1ms"}, {0.1, "100ms"}, {10, "10s"}, {1000, "17m"}, {1e4, "3h"}, {1e6, "12d"},
		{1e7, "116d"}, {1e9, "31.7y"}, {float64(math.MaxInt64) / 1e9, "292y"}, {math.Inf(1), "-"},
	} {
		if got := renderTickLatency(tc.in); got != tc.want {
			t.Errorf("renderTickLatency(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {0.25, "0.25"}, {12, "12"}, {250, "250"}, {999.9, "1000"}, {1500, "1.5k"}, {2e6, "2M"},
		{9.22e18, "9.22e18"}, {math.MaxFloat64, "1.8e308"}, {math.NaN(), "-"},
	} {
		if got := renderSI(tc.in); got != tc.want {
			t.Errorf("renderSI(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{
		{0, 450, "[0 60 120 180 240 300 360 420]"},
		{0, 1, "[0 1]"},
		{0, 30, "[0 5 10 15 20 25 30]"},
		{-60, 3600, "[0 600 1200 1800 2400 3000 3600]"},
	} {
		if got := fmt.Sprint(renderTimeTicks(tc.lo, tc.hi)); got != tc.want {
			t.Errorf("renderTimeTicks(%v, %v) = %s, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
	for _, sec := range []float64{0, 90, 3600, 5400} {
		want := map[float64]string{0: "0s", 90: "1m30s", 3600: "1h", 5400: "1h30m"}[sec]
		if got := renderTickSpan(sec); got != want {
			t.Errorf("renderTickSpan(%v) = %q, want %q", sec, got, want)
		}
	}
}

func TestRenderPercent(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0%"}, {1, "100.0%"}, {0.9417, "94.2%"}, {0.0042, "0.42%"},
		{0.00003, "0.003%"}, {1e-9, "<0.001%"}, {math.NaN(), "-"}, {math.Inf(1), "-"},
	} {
		if got := renderPercent(tc.in); got != tc.want {
			t.Errorf("renderPercent(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRenderCount(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {75210, "75,210"}, {-1234567, "-1,234,567"}, {math.MinInt64, "-9,223,372,036,854,775,808"}} {
		if got := renderCount(tc.in); got != tc.want {
			t.Errorf("renderCount(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRenderVerdict(t *testing.T) {
	for in, want := range map[string]string{
		"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "aborted": "ABORTED", "": "UNKNOWN", "odd": "ODD",
	} {
		if got := renderVerdict(in); got != want {
			t.Errorf("renderVerdict(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWriteTextShape(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, renderTestReport()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if !strings.HasPrefix(lines[0], "FAIL  soak steady  target prosody-staging  start 2026-03-14 09:00:00 UTC  duration 7m30s") {
		t.Errorf("first line = %q", lines[0])
	}
	if len(lines) > 45 {
		t.Errorf("WriteText wrote %d lines, want a screenful (≤ 45)", len(lines))
	}
	b.Reset()
	if err := WriteText(&b, &Soak{}); err != nil {
		t.Fatal(err)
	}
	lines = append(lines, strings.Split(b.String(), "\n")...)
	// A drill and saturation add about twenty lines.
	b.Reset()
	if err := WriteText(&b, renderDrillReport()); err != nil {
		t.Fatal(err)
	}
	drill := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if !strings.HasPrefix(drill[0], "INCONCLUSIVE  soak steady") {
		t.Errorf("first line = %q", drill[0])
	}
	if len(drill) > 70 {
		t.Errorf("WriteText wrote %d lines for a drill, want ≤ 70", len(drill))
	}
	for i, l := range append(lines, drill...) {
		if strings.TrimRight(l, " \t") != l {
			t.Errorf("line %d has trailing space: %q", i+1, l)
		}
	}
}

func TestWriteRoundText(t *testing.T) {
	c := &Round{
		ID: "c1", Kind: "canary", Target: "prosody-staging", Result: "fail",
		Start: renderTestStart, End: renderTestStart.Add(2300 * time.Millisecond),
		Checks: []Check{
			{Kind: "direct", Pass: true, Expected: 1, Delivered: 1, MaxLatency: 42 * time.Millisecond},
			{Kind: "group", Pass: false, Expected: 9, Delivered: 7, Reasons: []string{"not_delivered", "late"}, MaxLatency: 2100 * time.Millisecond},
		},
	}
	var b bytes.Buffer
	if err := WriteRoundText(&b, c); err != nil {
		t.Fatal(err)
	}
	want := "FAIL  canary  target prosody-staging  start 2026-03-14 09:00:00 UTC in 2.3s\n" +
		"  direct  pass  1/1 delivered  max 42ms\n" +
		"  group   FAIL  7/9 delivered  max 2.1s  not_delivered, late\n"
	if got := b.String(); got != want {
		t.Errorf("WriteRoundText() =\n%s\nwant:\n%s", got, want)
	}
	if err := WriteRoundText(io.Discard, &Round{}); err != nil {
		t.Errorf("WriteRoundText(empty) = %v, want nil", err)
	}
}

// renderHTMLCheck parses a page with encoding/xml in its lenient HTML mode
// (golang.org/x/net/html is not a dependency of this module) and returns
// the number of <svg> elements, failing t on any attribute that names a
// URL off the page or carries NaN or Inf. With strict, the page's text may
// not mention a URL or a script either: set it for reports whose own
// strings hold none.
func renderHTMLCheck(t *testing.T, page string, strict bool) (svgs int) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = false
	d.AutoClose = xml.HTMLAutoClose
	d.Entity = xml.HTMLEntity
	inSVG, titled := 0, 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("parse html: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			switch el.Name.Local {
			case "svg":
				svgs++
				inSVG++
			case "title":
				if inSVG > 0 {
					titled++
				}
			}
			for _, a := range el.Attr {
				v := strings.TrimSpace(a.Value)
				switch strings.ToLower(a.Name.Local) {
				case "src", "href", "srcset", "action", "poster", "data", "background", "xmlns":
					if strings.Contains(v, "//") || strings.Contains(strings.ToLower(v), "http") {
						t.Errorf("<%s %s=%q>: a URL off the page", el.Name.Local, a.Name.Local, v)
					}
				}
				if strings.Contains(v, "NaN") || strings.Contains(v, "Inf") {
					t.Errorf("<%s %s=%q>: not a finite number", el.Name.Local, a.Name.Local, v)
				}
			}
		case xml.EndElement:
			if el.Name.Local == "svg" {
				inSVG--
			}
		}
	}
	if titled < svgs {
		t.Errorf("%d of %d charts have a <title>", titled, svgs)
	}
	res := []*regexp.Regexp{
		regexp.MustCompile(`(?i)<(script|img|iframe|link|object|embed|a)\b`),
		regexp.MustCompile(`\bNaN\b`), regexp.MustCompile(`[+-]Inf\b`),
	}
	if strict {
		res = append(res, regexp.MustCompile(`(?i)https?:`), regexp.MustCompile(`(?i)url\(`),
			regexp.MustCompile(`(?i)@import`), regexp.MustCompile(`(?i)script`))
	}
	for _, re := range res {
		if loc := re.FindStringIndex(page); loc != nil {
			t.Errorf("page contains %q at %d: %q", re, loc[0], page[max(0, loc[0]-40):min(len(page), loc[1]+40)])
		}
	}
	return svgs
}

func TestWriteHTML(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHTML(&b, renderTestReport()); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	page := b.String()
	if n := renderHTMLCheck(t, page, true); n != 4 {
		t.Errorf("WriteHTML wrote %d <svg> elements, want 4", n)
	}
	for _, want := range []string{
		`<div class="verdict" role="status" aria-label="verdict FAIL">FAIL</div>`,
		"<title>FAIL · soak steady · prosody-staging</title>",
		">ramp</text>", ">send</text>", ">drain</text>", // phase marks
		"<polyline ", ">p99 limit 500ms</text>", ">configured 500</text>",
		">0s</text>", ">1m</text>", // x ticks
		">10ms</text>", ">1s</text>", // log y ticks
		"max_loss", "server_close", "rate_limited", "ack timeout after 5s", "open loop", ">lost 681</text>", ">late 3,121</text>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("WriteHTML output lacks %q", want)
		}
	}
	if strings.Count(page, `class="pill fail"`) != 3 {
		t.Errorf("want 3 failed threshold rows, got %d", strings.Count(page, `class="pill fail"`))
	}
}

func TestWriteHTMLDrill(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHTML(&b, renderDrillReport()); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	page := b.String()
	if n := renderHTMLCheck(t, page, true); n != 4 {
		t.Errorf("WriteHTML wrote %d <svg> elements, want 4", n)
	}
	for _, want := range []string{
		`<div class="verdict" role="status" aria-label="verdict INCONCLUSIVE">INCONCLUSIVE</div>`,
		`<header class="banner inconclusive">`,
		"while imcanary itself was saturated: the failure may be its own.",
		`<h2 id="h-saturation">imcanary saturated</h2>`, "11.5% of the send and drain phases",
		"<td class=\"name\">3m15s</td><td>3m53s</td><td>send</td><td>cpu, gc_pause</td>",
		`<h2 id="h-drill">Slow-reader drill</h2>`,
		`<p class="reaction">disconnected as slow consumers (close 4008) after 21s median`,
		"<td>normal users&#39; p99</td><td>712ms</td>", "<td>close codes</td><td>4008 58</td>",
		`class="saturated"`, "<title>imcanary saturated: cpu, gc_pause</title>", "Shaded spans: imcanary itself was saturated.",
		">slow disconnects 61</text>", "slow readers <b>5.00%</b>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("WriteHTML output lacks %q", want)
		}
	}
	// Two periods, shaded on each of the four charts.
	if n := strings.Count(page, `<rect class="saturated"`); n != 8 {
		t.Errorf("%d saturated bands, want 8", n)
	}
	b.Reset()
	if err := WriteHTML(&b, renderTestReport()); err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"h-drill", "h-saturation", `class="saturated"`, "Shaded spans", "slow disconnects"} {
		if strings.Contains(b.String(), absent) {
			t.Errorf("a report without drill or saturation renders %q", absent)
		}
	}
}

func TestWriteHTMLEdgeCases(t *testing.T) {
	one := renderTestReport()
	one.Samples = one.Samples[:1]

	zeros := renderTestReport()
	for i := range zeros.Samples {
		zeros.Samples[i] = Sample{T: zeros.Samples[i].T, Phase: zeros.Samples[i].Phase}
	}

	huge := renderTestReport()
	for i := range huge.Samples {
		s := &huge.Samples[i]
		s.P50, s.P99, s.Max = time.Nanosecond, time.Duration(math.MaxInt64/2), math.MaxInt64
		s.Lost, s.Late, s.Disconnects = math.MaxInt64, math.MaxInt64/3, 1
		s.Online = math.MaxInt32
		s.SentPerSec, s.DelivPerSec = math.MaxFloat64, 1e300
	}
	huge.Samples[5].SentPerSec = math.NaN()
	huge.Samples[6].DelivPerSec = math.Inf(1)
	huge.Samples[7].SentPerSec = -5
	huge.Profile.Thresholds.P99Delivery = math.MaxInt64

	hostile := renderTestReport()
	hostile.Target = `<script>alert("t")</script>`
	hostile.Profile.Name = `"><img src=https://evil.test/x>`
	hostile.Phases[1].Name = `</text><script>x()</script>`
	hostile.Errors[0].Error = `<a href="https://evil.test">x</a> & more`
	hostile.Notes = append(hostile.Notes, `<style>@import url(https://evil.test/x.css)</style>`)

	aborted := renderTestReport()
	aborted.Result = "aborted"
	aborted.End = time.Time{}
	aborted.Samples = aborted.Samples[:20]
	aborted.Phases = aborted.Phases[:2]

	passed := renderTestReport()
	passed.Result = "pass"
	for i := range passed.Thresholds {
		passed.Thresholds[i].Pass = true
	}

	// Samples out of order and before the start must not break the axes.
	unordered := renderTestReport()
	unordered.Samples[0].T = renderTestStart.Add(-time.Minute)
	unordered.Samples[1], unordered.Samples[2] = unordered.Samples[2], unordered.Samples[1]

	sameTime := renderTestReport()
	sameTime.Start, sameTime.End = time.Time{}, time.Time{}
	sameTime.Phases = nil
	for i := range sameTime.Samples {
		sameTime.Samples[i].T = renderTestStart
	}

	// A drill and saturation with nothing in them, or out of the run.
	bare := renderDrillReport()
	bare.Drill = &Drill{}
	bare.Saturation = &Saturation{Periods: []SaturatedPeriod{
		{},
		{Start: renderTestStart.Add(-time.Hour), End: renderTestStart.Add(-time.Minute)},
		{Start: renderTestStart.Add(time.Hour), End: renderTestStart.Add(2 * time.Hour), Causes: []string{"<b>"}},
		{Start: renderTestStart.Add(time.Minute), End: renderTestStart.Add(time.Minute)},
	}}
	noStart := renderDrillReport()
	noStart.Start, noStart.End = time.Time{}, time.Time{}
	noStart.Saturation.Periods = nil

	for name, r := range map[string]*Soak{
		"no samples": {ID: "x", Result: "fail", Start: renderTestStart, End: renderTestStart.Add(time.Minute)},
		"drill":      renderDrillReport(),
		"bare drill": bare,
		"no start":   noStart,
		"empty":      {},
		"one sample": one,
		"all zero":   zeros,
		"huge":       huge,
		"hostile":    hostile,
		"aborted":    aborted,
		"pass":       passed,
		"unordered":  unordered,
		"same time":  sameTime,
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteHTML(&b, r); err != nil {
				t.Fatalf("WriteHTML: %v", err)
			}
			if n := renderHTMLCheck(t, b.String(), name != "hostile"); n != 4 {
				t.Errorf("WriteHTML wrote %d <svg> elements, want 4", n)
			}
			if want := ">" + renderVerdict(r.Result) + "</div>"; !strings.Contains(b.String(), want) {
				t.Errorf("WriteHTML output lacks the verdict %q", want)
			}
			if name == "hostile" && strings.Count(b.String(), "<style") != 1 {
				t.Errorf("a report's text opened a <style> element")
			}
			if err := WriteText(io.Discard, r); err != nil {
				t.Errorf("WriteText: %v", err)
			}
		})
	}
}

func TestRenderNilReport(t *testing.T) {
	for name, f := range map[string]func(io.Writer, *Soak) error{"json": WriteJSON, "text": WriteText, "html": WriteHTML} {
		if err := f(io.Discard, nil); err == nil {
			t.Errorf("Write %s(nil) = nil, want an error", name)
		}
	}
}

// renderCheckPhaseLabels fails t unless labels, laid out for marks at xs in
// a plot from left to right whose top edge is at top, are readable: each
// one inside the plot, anchored at its own mark (starting just right of
// it, or ending just left of it with an arrow pointing at it), clear of
// every other label on its row and of every box in avoid, and, on the top
// row, ending before the next mark. It returns how many were abbreviated.
func renderCheckPhaseLabels(t *testing.T, names []string, xs []float64, left, right, top float64, avoid []renderBox, labels []renderPhaseLabel) (short int) {
	t.Helper()
	if len(labels) != len(names) {
		t.Fatalf("%d labels for %d phases", len(labels), len(names))
	}
	type span struct{ lo, hi float64 }
	spans := make([]span, len(labels))
	for i, l := range labels {
		w := renderPhaseWidth(l.Text)
		lo, hi := l.X, l.X+w
		text, want := l.Text, names[i]
		if l.Left {
			lo, hi = l.X-w, l.X
			if !strings.HasSuffix(text, renderPhaseArrow) {
				t.Errorf("label %q left of its mark has no arrow pointing at it", text)
			}
			text = strings.TrimSuffix(text, renderPhaseArrow)
			if math.Abs(l.X-(xs[i]-renderPhasePad)) > 1e-9 {
				t.Errorf("label %q ends at %v, want just left of its mark at %v", l.Text, l.X, xs[i])
			}
		} else if math.Abs(l.X-(xs[i]+renderPhasePad)) > 1e-9 && !l.Short {
			t.Errorf("label %q starts at %v, want just right of its mark at %v", l.Text, l.X, xs[i])
		}
		if l.Short {
			short++
			want = renderPhaseAbbrev(names[i])
		}
		if text != want {
			t.Errorf("label of phase %q = %q, want %q", names[i], l.Text, want)
		}
		if lo < left-1e-9 || hi > right+1e-9 {
			t.Errorf("label %q spans %.1f–%.1f, outside the plot %.1f–%.1f: it would be clipped", l.Text, lo, hi, left, right)
		}
		if l.Row == 0 && !l.Left {
			for j, xj := range xs {
				if j != i && xj > xs[i] && hi > xj {
					t.Errorf("label %q on the top row runs to %.1f, past the next mark at %.1f", l.Text, hi, xj)
				}
			}
		}
		base := renderPhaseBaseline(top, l.Row)
		for _, b := range avoid {
			if lo < b.X1 && b.X0 < hi && base-renderPhaseAscent < b.Y1 && b.Y0 < base+renderPhaseDescent {
				t.Errorf("label %q on row %d overlaps %+v", l.Text, l.Row, b)
			}
		}
		spans[i] = span{lo, hi}
		for j := range i {
			if labels[j].Row == l.Row && lo < spans[j].hi && spans[j].lo < hi {
				t.Errorf("labels %q and %q overlap on row %d", labels[j].Text, l.Text, l.Row)
			}
		}
	}
	return short
}

func TestRenderPhaseLabels(t *testing.T) {
	const left, right, top = 64, 544, 36
	phases := []string{"ramp", "send", "drain"}
	// x of a time in a run of total seconds.
	at := func(sec, total float64) float64 { return left + sec/total*(right-left) }
	// A reference line's label at the top right, where a short drain's
	// label would go.
	ref := []renderBox{{X0: right - 4 - 15*renderPhaseCharW, X1: right - 4, Y0: top + 1, Y1: top + 14}}
	for _, tc := range []struct {
		name  string
		xs    []float64
		avoid []renderBox
		// wantLeft names the labels that must sit left of their mark.
		wantLeft []string
	}{
		{"even", []float64{at(0, 450), at(60, 450), at(360, 450)}, nil, nil},
		{"drain 1s of 10m", []float64{at(0, 600), at(60, 600), at(599, 600)}, nil, []string{"drain"}},
		{"drain 0s at the end", []float64{at(0, 600), at(60, 600), at(600, 600)}, nil, []string{"drain"}},
		{"ramp 0.2s", []float64{at(0, 600), at(0.2, 600), at(540, 600)}, nil, nil},
		{"send 1s in the middle", []float64{at(0, 600), at(300, 600), at(301, 600)}, nil, []string{"send"}},
		{"send and drain 1s at the end", []float64{at(0, 600), at(598, 600), at(599, 600)}, nil, []string{"send", "drain"}},
		{"every phase at once", []float64{at(0, 600), at(0, 600), at(0, 600)}, nil, nil},
		{"drain 1s under a reference label", []float64{at(0, 600), at(60, 600), at(599, 600)}, ref, []string{"drain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels := renderPhaseLabels(phases, tc.xs, left, right, top, tc.avoid)
			if n := renderCheckPhaseLabels(t, phases, tc.xs, left, right, top, tc.avoid, labels); n > 0 {
				t.Errorf("%d labels abbreviated with room to stack them in full: %+v", n, labels)
			}
			for i, l := range labels {
				if want := slices.Contains(tc.wantLeft, phases[i]); l.Left != want {
					t.Errorf("label %q left of its mark = %v, want %v", l.Text, l.Left, want)
				}
			}
		})
	}
	t.Run("crowded", func(t *testing.T) {
		// More phases in one spot than rows: some are abbreviated, and
		// none leaves the plot.
		names := []string{"ramp", "send", "drain", "ramp", "send", "drain", "ramp", "send"}
		xs := make([]float64, len(names))
		for i := range xs {
			xs[i] = right - float64(i)
		}
		labels := renderPhaseLabels(names, xs, left, right, top, nil)
		for i, l := range labels {
			w := renderPhaseWidth(l.Text)
			lo, hi := l.X, l.X+w
			if l.Left {
				lo, hi = l.X-w, l.X
			}
			if lo < left || hi > right {
				t.Errorf("label %d %q spans %.1f–%.1f, outside the plot", i, l.Text, lo, hi)
			}
		}
	})
}

// renderShortDrainReport is a 10-minute run whose drain took its last
// second: the drain's mark sits at the plot's right edge.
func renderShortDrainReport() *Soak {
	r := renderTestReport()
	at := func(d time.Duration) time.Time { return renderTestStart.Add(d) }
	r.Result = "pass"
	r.Profile.Ramp, r.Profile.Duration, r.Profile.Drain = time.Minute, 539*time.Second, 5*time.Second
	r.Phases = []Phase{{Name: "ramp", Start: at(0)}, {Name: "send", Start: at(time.Minute)}, {Name: "drain", Start: at(599 * time.Second)}}
	r.End = at(10 * time.Minute)
	r.Samples = r.Samples[:0]
	for i := 1; i <= 100; i++ {
		el := time.Duration(i) * 6 * time.Second
		ph := "send"
		switch {
		case el <= time.Minute:
			ph = "ramp"
		case el > 599*time.Second:
			ph = "drain"
		}
		r.Samples = append(r.Samples, Sample{T: at(el), Phase: ph, Online: 497, SentPerSec: 250, DelivPerSec: 1225,
			P50: 12 * time.Millisecond, P99: 160 * time.Millisecond, Max: 420 * time.Millisecond})
	}
	return r
}

// TestWriteHTMLShortDrain: the label of a drain of 1 s at the end of a
// 10-minute run is the whole word, inside the plot, pointing at its mark,
// with the phase's name and span in a tooltip.
func TestWriteHTMLShortDrain(t *testing.T) {
	r := renderShortDrainReport()
	for _, c := range renderCharts(r) {
		left, _ := strconv.ParseFloat(c.Left, 64)
		right, _ := strconv.ParseFloat(c.Right, 64)
		top, _ := strconv.ParseFloat(c.Top, 64)
		// The reference lines' labels, which phase labels must clear.
		var avoid []renderBox
		for _, ref := range c.Refs {
			x, _ := strconv.ParseFloat(ref.LabelX, 64)
			y, _ := strconv.ParseFloat(ref.LabelY, 64)
			avoid = append(avoid, renderBox{X0: x - renderPhaseWidth(ref.Label), X1: x, Y0: y - renderPhaseAscent, Y1: y + renderPhaseDescent})
		}
		var names []string
		var xs []float64
		var labels []renderPhaseLabel
		for i, m := range c.Phases {
			x, _ := strconv.ParseFloat(m.X, 64)
			lx, _ := strconv.ParseFloat(m.LabelX, 64)
			ly, _ := strconv.ParseFloat(m.LabelY, 64)
			names, xs = append(names, r.Phases[i].Name), append(xs, x)
			labels = append(labels, renderPhaseLabel{Text: m.Label, X: lx, Left: m.Anchor == "end",
				Row: int(math.Round((ly - renderPhaseBaseline(top, 0)) / renderPhaseRowH)), Short: !strings.HasPrefix(m.Label, r.Phases[i].Name)})
		}
		if n := renderCheckPhaseLabels(t, names, xs, left, right, top, avoid, labels); n > 0 {
			t.Errorf("chart %s: %d phase labels abbreviated", c.ID, n)
		}
	}
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	renderHTMLCheck(t, page, true)
	for _, want := range []string{
		`text-anchor="end">drain →</text>`, `text-anchor="start">send</text>`, `text-anchor="start">ramp</text>`,
		"<title>drain from 9m59s, for 1s</title>", "<title>send from 1m, for 8m59s</title>",
	} {
		if n := strings.Count(page, want); n != 4 {
			t.Errorf("WriteHTML(short drain) has %d of %q, want one per chart (4)", n, want)
		}
	}
	if strings.Contains(page, "too short to name in full") {
		t.Errorf("WriteHTML(short drain) says a label was shortened; every one fits in full")
	}
}

// renderUngrouped finds whole numbers of four digits or more written
// without separators: every count of 1,000 and up is grouped, so a table
// never shows 12,345 beside 12345.
var renderUngrouped = regexp.MustCompile(`(^|[^\d,.])\d{4,}([^\d,]|$)`)

// TestReportsGroupCounts: the text and HTML reports of a run whose every
// count is in the thousands print each with separators, thresholds and
// rates included, while the JSON keeps them plain numbers.
func TestReportsGroupCounts(t *testing.T) {
	r := renderTestReport()
	r.Users = Users{Configured: 12000, LoggedIn: 11998, FailedLogins: 1234, Groups: 1200, MinOnlineRatio: 0.99}
	r.Profile.Users = 12000
	r.Messages = Messages{Sent: 7521000, SentPerSec: 25070, SendSeconds: 300, Acked: 7501200, Unacked: 19800,
		Offline: 14300, WriteErrors: 3000, Rejected: map[string]int64{"rate_limited": 4100}}
	r.Disconnects = map[string]int64{"server_close": 3000, "slow_consumer": 2000}
	for i := range r.Thresholds {
		th := &r.Thresholds[i]
		switch th.Name {
		case "max_disconnects":
			th.Limit, th.Actual, th.LimitValue, th.ActualValue = "10000", "5000", 10000, 5000
		case "all_users_logged_in":
			th.Limit, th.Actual, th.LimitValue, th.ActualValue = "12000", "11998", 12000, 11998
		}
	}
	for i := range r.Errors {
		r.Errors[i].Count *= 1000
	}
	for i := range r.Samples {
		r.Samples[i].Lost *= 1000
		r.Samples[i].Disconnects *= 1000
	}
	// Not counts: the run's id and start time, and the error messages,
	// which quote close codes and ports as the server and kernel wrote
	// them.
	ids := []string{r.ID, "", "2026-03-14", "", "20260314", ""}
	for _, e := range r.Errors {
		ids = append(ids, e.Error, "")
	}
	strip := strings.NewReplacer(ids...)

	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(strip.Replace(b.String()), "\n") {
		if m := renderUngrouped.FindString(line); m != "" {
			t.Errorf("text line %d has an ungrouped number %q: %q", i+1, m, line)
		}
	}
	for _, want := range []string{"7,521,000 sent (25,070.0/s over 5m)", "max_disconnects      10,000    5,000", "all_users_logged_in  12,000   11,998"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("WriteText lacks %q:\n%s", want, b.String())
		}
	}

	b.Reset()
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	// The page's visible text, between tags; attributes (coordinates)
	// and the style sheet are not read as numbers.
	page := strip.Replace(b.String())
	page = page[strings.Index(page, "</style>"):]
	for _, text := range regexp.MustCompile(`>([^<]*)<`).FindAllStringSubmatch(page, -1) {
		if m := renderUngrouped.FindString(text[1]); m != "" {
			t.Errorf("HTML text has an ungrouped number %q: %q", m, text[1])
		}
	}
	for _, want := range []string{"<td>10,000</td><td>5,000</td>", "sent, 25,070.0/s over 5m", "60 samples"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("WriteHTML lacks %q", want)
		}
	}

	b.Reset()
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"sent": 7521000,`, `"limit": "10000",`, `"limit_value": 10000,`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("WriteJSON lacks %q: machine formats keep plain numbers", want)
		}
	}
}

func TestRenderRate(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0.0"}, {0.5, "0.5"}, {250.74, "250.7"}, {999.96, "1,000.0"}, {1225.04, "1,225.0"},
		{-1234.5, "-1,234.5"}, {-0.04, "-0.0"}, {math.NaN(), "-"}, {math.Inf(-1), "-"},
	} {
		if got := renderRate(tc.in); got != tc.want {
			t.Errorf("renderRate(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRenderThresholdValue(t *testing.T) {
	for in, want := range map[string]string{
		"375253": "375,253", "10": "10", "-1500": "-1,500", "0.1%": "0.1%", "500ms": "500ms", "≥ 1": "≥ 1", "": "",
	} {
		if got := renderThresholdValue(in); got != want {
			t.Errorf("renderThresholdValue(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRenderSendRate: the rate shown is over the time the run sent, as
// the runner measured it, and for a report from before send_seconds it is
// worked out again from the phases rather than taken over the profile's
// duration.
func TestRenderSendRate(t *testing.T) {
	at := func(d time.Duration) time.Time { return renderTestStart.Add(d) }
	aborted := &Soak{
		Result: "aborted", Start: at(0), End: at(9 * time.Second),
		Profile: Profile{Duration: 10 * time.Minute},
		Phases:  []Phase{{Name: "ramp", Start: at(0)}, {Name: "send", Start: at(2 * time.Second)}},
		// As the runner fills it: 1,400 over the 7 s it sent.
		Messages: Messages{Sent: 1400, SentPerSec: 200, SendSeconds: 7},
	}
	// The same run written before send_seconds existed: its rate was over
	// the planned 10 minutes, and its send phase ran from its start to
	// the end of the run.
	legacy := *aborted
	legacy.Messages = Messages{Sent: 1400, SentPerSec: 1400 / 600.0}
	drained := &Soak{
		Phases:   []Phase{{Name: "send", Start: at(0)}, {Name: "drain", Start: at(4 * time.Second)}},
		End:      at(10 * time.Second),
		Messages: Messages{Sent: 1000, SentPerSec: 1000 / 60.0},
	}
	for _, tc := range []struct {
		name string
		r    *Soak
		want string
	}{
		{"measured", aborted, "200.0/s over 7s"},
		{"legacy, aborted while sending", &legacy, "200.0/s over 7s"},
		{"legacy, up to the drain", drained, "250.0/s over 4s"},
		{"never sent", &Soak{Result: "aborted", Phases: []Phase{{Name: "ramp", Start: at(0)}}}, "0.0/s"},
		{"empty", &Soak{}, "0.0/s"},
	} {
		if got := renderSendRate(tc.r); got != tc.want {
			t.Errorf("%s: renderSendRate() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
