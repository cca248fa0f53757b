package report

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// renderStormReport is renderTestReport as a reconnect-storm drill on the
// daemon's background population: half of 10,000 sessions dropped two
// minutes into sending, 99% back after 5.1 s, all but 3 by the end.
func renderStormReport() *Soak {
	r := renderTestReport()
	r.Profile.Thresholds.Recovery99, r.Profile.Thresholds.Recovery100 = 10*time.Second, 30*time.Second
	r.Storm = &Storm{
		Population: "background", Fraction: 0.5, At: renderTestStart.Add(3 * time.Minute),
		Online: 10000, Dropped: 5000, Back: 4997,
		Recovery99: 5100 * time.Millisecond, Reached99: true,
		Login:          Percentiles{Count: 4997, P50: 3 * time.Millisecond, P95: 41 * time.Millisecond, P99: 88 * time.Millisecond, Max: 1200 * time.Millisecond},
		FailedAttempts: 12,
		AttemptsOf:     "process", Attempts: 5209, AttemptsSpan: 4*time.Minute + 30*time.Second,
		AttemptsPerSec: 5209 / 270.0, PeakPerSec: 1010, MaxConnectRate: 1000, Burst: 100,
		Deliveries:     Deliveries{Expected: 90210, Delivered: 90011, Recovered: 160, Lost: 39, Late: 412},
		InFlightAtDrop: 640,
		Window:         4*time.Minute + 30*time.Second,
		ConnectPath: &ConnectPath{Phases: []ConnectPhase{
			{Phase: "dns"},
			{Phase: "tcp", Count: 5009, P50: 600 * time.Microsecond, P99: 1900 * time.Microsecond, Mean: 700 * time.Microsecond},
			{Phase: "tls", Count: 5003, P50: 1500 * time.Microsecond, P99: 40 * time.Millisecond, Mean: 4 * time.Millisecond},
			{Phase: "upgrade", Count: 5001, P50: 400 * time.Microsecond, P99: 3 * time.Millisecond, Mean: 600 * time.Microsecond},
			{Phase: "login", Count: 4997, P50: 700 * time.Microsecond, P99: 45 * time.Millisecond, Mean: 5 * time.Millisecond},
		}, Total: Percentiles{Count: 4997, P50: 3 * time.Millisecond, P95: 41 * time.Millisecond, P99: 88 * time.Millisecond, Max: 1200 * time.Millisecond}},
		ConnectUntilEnd: true,
	}
	// The run's own connects: its 10,000 logins and the storm's.
	r.ConnectPath = &ConnectPath{Phases: []ConnectPhase{
		{Phase: "dns"},
		{Phase: "tcp", Count: 15009, P50: 500 * time.Microsecond, P99: 1800 * time.Microsecond, Mean: 600 * time.Microsecond},
		{Phase: "tls", Count: 15003, P50: 1400 * time.Microsecond, P99: 20 * time.Millisecond, Mean: 3 * time.Millisecond},
		{Phase: "upgrade", Count: 15001, P50: 400 * time.Microsecond, P99: 2 * time.Millisecond, Mean: 500 * time.Microsecond},
		{Phase: "login", Count: 14997, P50: 600 * time.Microsecond, P99: 30 * time.Millisecond, Mean: 3 * time.Millisecond},
	}, Total: Percentiles{Count: 14997, P50: 2 * time.Millisecond, P95: 20 * time.Millisecond, P99: 40 * time.Millisecond, Max: 1200 * time.Millisecond}}
	r.Thresholds = append(r.Thresholds,
		Threshold{Name: "recovery_99", Limit: "10s", Actual: "5.1s", LimitValue: 10, ActualValue: 5.1, Pass: true},
		Threshold{Name: "recovery_100", Limit: "30s", Actual: "not reached: 4,997 of 5,000 back", LimitValue: 30},
	)
	// The note is what the runner writes for these numbers; soak's
	// TestGoldenStormNote checks that it still does.
	r.Notes = append(r.Notes, "Reconnect-storm drill: 50.0% of the sessions of the daemon's background population online at the drop were aborted at once, their connections closed with no close frame, as a load balancer restart does. "+
		"A session is back when its connect attempt (dial and login) succeeds; the recovery times run from the drop to the login that brought 99% (rounded up) and all of them back, and login latency is those attempts' own duration. "+
		"Connect attempts are the whole process's (every population sharing its connect limiter), counted as each one's turn under the connect limit comes, from the drop until the last session was back; the peak second is sampled every 100ms. "+
		"Deliveries are the dropped population's, from the drop to the end of the run; expected includes what was owed before the drop and still in flight at it.")
	return r
}

func TestRenderStormGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(io.Writer, *Soak) error
	}{
		{"report-storm.golden.json", WriteJSON},
		{"report-storm.golden.txt", WriteText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, renderStormReport()); err != nil {
				t.Fatalf("write: %v", err)
			}
			renderGolden(t, tc.name, b.Bytes())
		})
	}
}

// TestWriteStorm holds each format to the storm section's facts, and
// keeps it out of a report without a drill.
func TestWriteStorm(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(io.Writer, *Soak) error
		want  []string
	}{
		{"text", WriteText, []string{"reconnect storm", "4,997 of 5,000 back by the end of the run",
			"time to 99% back", "5.1s", "time to 100% back", "not reached", "1,010.0/s peak second", "max_connect_rate 1,000.0/s (burst 100)"}},
		{"html", WriteHTML, []string{`<h2 id="h-storm">Reconnect storm</h2>`, "4,997 of 5,000 back by the end of the run",
			"<td>time to 99% back</td><td>5.1s</td>", "<td>time to 100% back</td><td>not reached</td>"}},
		{"json", WriteJSON, []string{`"storm": {`, `"population": "background"`, `"dropped": 5000`, `"recovery_99_ns": 5100000000`,
			`"reached_100": false`, `"peak_per_sec": 1010`, `"max_connect_rate": 1000`, `"recovery_100_ns": 30000000000`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, renderStormReport()); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("%s report lacks %q", tc.name, w)
				}
			}
			b.Reset()
			if err := tc.write(&b, renderTestReport()); err != nil {
				t.Fatal(err)
			}
			for _, absent := range []string{"storm", "recovery_"} {
				if strings.Contains(strings.ToLower(b.String()), absent) {
					t.Errorf("%s report without a drill mentions %q", tc.name, absent)
				}
			}
		})
	}
}

func TestRenderStormHeadline(t *testing.T) {
	for _, tc := range []struct {
		s    Storm
		want string
	}{
		{Storm{}, "nothing dropped: no session was online at the drop"},
		{Storm{Dropped: 200, Back: 200, Reached99: true, Recovery99: 900 * time.Millisecond, Reached100: true, Recovery100: 2 * time.Second},
			"all 200 back after 2s (99% after 900ms)"},
		{Storm{Dropped: 200, Back: 150}, "150 of 200 back by the end of the run"},
	} {
		if got := renderStormHeadline(&tc.s); got != tc.want {
			t.Errorf("renderStormHeadline(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}
