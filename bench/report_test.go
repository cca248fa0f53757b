package bench

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// sampleReport is a report as a full run on a two-core machine writes it.
func sampleReport() *Report {
	step := func(per, procs int, bps float64, sat bool, causes ...string) Step {
		s := Step{
			SessionsPerProcess: per, Processes: procs, Sessions: per * procs, Online: per * procs,
			LoginsPerSecond: 5200, RampSeconds: float64(per) / 5200, LoginCPUSeconds: 150e-6, TargetLoginCPUSeconds: 250e-6,
			RSSBytes: int64(20<<20 + float64(per)*bps), BytesPerSession: bps, HeapBytesPerSession: bps * 0.7,
			OpenFiles: per + 11, Goroutines: 40 + per/1000, CPUCores: float64(per*procs) * 3e-6, CPUSecondsPerSessionSecond: 3e-6,
			GCPerMinute: 1, GCShare: 0.1,
			MachineCores: 0.4, TargetCores: 0.1, OtherCores: 0.05, Load1: 1.5,
			Causes: causes, Discounted: []string{}, Saturated: sat, Attempts: 1,
		}
		if s.Causes == nil {
			s.Causes = []string{}
		}
		return s
	}
	r := &Report{
		Version: ReportVersion, Mode: "full", Started: time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC), Seconds: 612,
		Machine: Machine{Cores: 2, GOMAXPROCS: 2, MemTotalBytes: 24 << 30, MemAvailableBytes: 22 << 30, FileLimit: 20000,
			EphemeralPorts: [2]int{32768, 60999}, Load1: 0.5},
		Setup: Setup{Processes: 6, Target: "reference", GroupSize: 5, HeartbeatSeconds: 30, ConnectRate: 10000,
			ConnectLimiter: "population.max_connect_rate", SourceAddrs: true, SettleSeconds: 10, WindowSeconds: 20,
			NoiseSessions: 10000, NoiseDeliveriesPerSecond: 20000, Saturation: map[string]string{"saturation.max_cpu": "0.9"}},
		Throughput: Throughput{Connections: 100, Rounds: 3, WindowSeconds: 5, FrameBytes: 173, OfferedPerSecond: 20000,
			Bare:     Client{Sent: 360000, Deliveries: 300000, CPUSeconds: 5, WallSeconds: 15, DeliveriesPerCoreSecond: 60000, DeliveriesPerSecond: 20000, CoresUsed: 1.0 / 3},
			Imcanary: Client{Sent: 360000, Deliveries: 300000, CPUSeconds: 6, WallSeconds: 15, DeliveriesPerCoreSecond: 50000, DeliveriesPerSecond: 20000, CoresUsed: 0.4},
			Ratio:    50000.0 / 60000},
		Baseline: Baseline{RSSBytes: 20 << 20, OpenFiles: 12, TargetRSSBytes: 15 << 20},
		Logins:   Logins{Sessions: 19936, Workers: 64, LoginsPerSecond: 6500, CPUSecondsPerLogin: 120e-6, TargetCPUSecondsPerLogin: 200e-6},
		Noise: func() Step {
			s := step(10000, 1, 11<<10, false)
			s.Rate, s.DeliveriesPerSecond, s.DeliveriesPerCoreSecond = 0.8, 20000, 40000
			s.ReceiveLagP99Seconds, s.ReceiveLagOver2ms, s.SendLagP99Seconds = 0.0008, 0.002, 0.004
			return s
		}(),
		Steps: []Step{
			step(1000, 6, 10<<10, false),
			step(10000, 6, 9<<10, false),
			func() Step {
				// The collector running without garbage to collect,
				// as under a memory limit the sessions outgrew.
				s := step(19936, 6, 9<<10, true, "sched_latency")
				s.GCPerMinute, s.GCShare, s.GCBusy = 165, 0.87, true
				return s
			}(),
		},
		Stop: Stop{Reason: "saturated", Step: 3, Detail: "saturation detector fired: sched_latency"},
		Plan: makePlan(planInput{
			machine: Machine{Cores: 2, GOMAXPROCS: 2, MemAvailableBytes: 22 << 30, FileLimit: 20000, EphemeralPorts: [2]int{32768, 60999}},
			maxFDs:  0.9, maxPorts: 0.9, maxCPU: 0.9, baseFDs: 11, held: 60000,
			stepBytes: 9 << 10, stepCPU: 3e-6, noiseSessions: 10000, noiseDeliveries: 20000, noiseCPU: 0.53, noiseBytes: 11 << 10,
			receive: 50000, users: 100, rate: 0.5, groupSize: 5,
		}),
		Warnings: []string{"an example note"},
	}
	setLimit(r) // as Run does once Stop is final
	return r
}

// TestReportGolden keeps the report's JSON field names and its text layout
// stable: a change shows as a diff of testdata (go test -update rewrites).
func TestReportGolden(t *testing.T) {
	r := sampleReport()
	for _, tc := range []struct {
		file  string
		write func(*bytes.Buffer) error
	}{
		{"report.json", func(b *bytes.Buffer) error { return WriteJSON(b, r) }},
		{"report.txt", func(b *bytes.Buffer) error { return WriteText(b, r) }},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.file)
			if *update {
				if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Bytes(), want) {
				t.Errorf("%s differs from testdata (go test -update rewrites it):\n%s", tc.file, b.String())
			}
		})
	}
}

// TestHeldLine: the plan's first line claims what the machine holds only
// when a limit was reached, and otherwise says the figure is the largest
// step tried.
func TestHeldLine(t *testing.T) {
	quick := func() *Report {
		r := &Report{
			Mode:    "quick",
			Machine: Machine{FileLimit: 1 << 20, EphemeralPorts: [2]int{32768, 60999}},
			Steps: []Step{
				{SessionsPerProcess: 500, Processes: 1, Sessions: 500, Online: 500},
				{SessionsPerProcess: 1000, Processes: 1, Sessions: 1000, Online: 1000},
			},
			Stop: Stop{Reason: StopStepsDone},
			Plan: Plan{Sessions: 1000, DeliveriesPerSecond: 12345, FDBound: 943000, PortBound: 25408, MemorySessions: 2000000},
		}
		setLimit(r)
		return r
	}
	r := quick()
	if r.Plan.LimitFound || r.Plan.Limit != "" {
		t.Fatalf("quick run within every bound: limit_found %v, limit %q; want false, \"\"", r.Plan.LimitFound, r.Plan.Limit)
	}
	if got, want := heldLine(r), "Held 1,000 sessions at 12,345 deliveries/s, the largest step tried; no limit was reached"; !strings.HasPrefix(got, want) {
		t.Errorf("heldLine(quick) = %q, want it to start %q", got, want)
	}

	sat := quick()
	sat.Steps[1].Saturated, sat.Steps[1].Causes = true, []string{"receive_lag"}
	sat.Stop = Stop{Reason: StopSaturated, Step: 2, Detail: "saturation detector fired: receive_lag"}
	sat.Plan.Sessions = 500
	setLimit(sat)
	if want := "This machine holds 500 sessions at 12,345 deliveries/s: the next step, 1,000 sessions, saturated a prober (receive_lag)."; heldLine(sat) != want || !sat.Plan.LimitFound {
		t.Errorf("heldLine(saturated) = %q (limit_found %v), want %q (true)", heldLine(sat), sat.Plan.LimitFound, want)
	}

	stopped := quick()
	stopped.Stop = Stop{Reason: StopInterrupted, Detail: "context canceled"}
	setLimit(stopped)
	if got := heldLine(stopped); stopped.Plan.LimitFound || !strings.Contains(got, "before the run stopped (interrupted); no limit was reached") {
		t.Errorf("heldLine(interrupted) = %q (limit_found %v), want no limit and the run stopped", got, stopped.Plan.LimitFound)
	}

	// No wording but the limits' claims the machine holds the figure.
	for _, r := range []*Report{quick(), stopped} {
		if got := heldLine(r); strings.Contains(got, "holds") {
			t.Errorf("heldLine(no limit) = %q: claims what the machine holds", got)
		}
	}

	// The text report carries the line, and the JSON the fields.
	var b bytes.Buffer
	if err := WriteText(&b, quick()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "the largest step tried; no limit was reached") || strings.Contains(b.String(), "This machine holds 1,000") {
		t.Errorf("WriteText(quick) plan:\n%s\nwant the largest step tried, no claim the machine holds it", b.String())
	}
	b.Reset()
	if err := WriteJSON(&b, quick()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"limit_found": false,`) || !strings.Contains(b.String(), `"limit": "",`) {
		t.Errorf("WriteJSON(quick) lacks limit_found false and an empty limit:\n%s", b.String())
	}
}

// TestWriteTextGroupsCounts: every count of 1,000 and up in the text report
// has thousands separators, so no line shows 20000 beside 17,989; port
// numbers are names, not counts, and stay as the kernel prints them.
func TestWriteTextGroupsCounts(t *testing.T) {
	r := sampleReport()
	r.Throughput.Connections, r.Logins.Workers = 1000, 1024
	r.Plan.Config.Shards, r.Plan.Config.Machines = 1200, 1100
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	ports := fmt.Sprintf("%d-%d", r.Machine.EphemeralPorts[0], r.Machine.EphemeralPorts[1])
	if !strings.Contains(b.String(), "ephemeral ports "+ports) {
		t.Errorf("WriteText lacks the port range %s as the kernel writes it", ports)
	}
	ungrouped := regexp.MustCompile(`(^|[^\d,.])\d{4,}([^\d,]|$)`)
	for i, line := range strings.Split(strings.ReplaceAll(b.String(), ports, ""), "\n") {
		if m := ungrouped.FindString(line); m != "" {
			t.Errorf("line %d has an ungrouped count %q: %q", i+1, m, line)
		}
	}
	for _, want := range []string{"file limit 20,000", "1,000 connections", "(1,024 in flight", "run 1,200 shard(s)", "on 1,100 machine(s)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("WriteText lacks %q", want)
		}
	}
}
