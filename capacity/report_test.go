package capacity

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
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
			OpenFiles: per + 11, CPUCores: float64(per*procs) * 3e-6, CPUSecondsPerSessionSecond: 3e-6,
			MachineCores: 0.4, TargetCores: 0.1, OtherCores: 0.05, Load1: 1.5,
			Causes: causes, Discounted: []string{}, Saturated: sat, Attempts: 1,
		}
		if s.Causes == nil {
			s.Causes = []string{}
		}
		return s
	}
	return &Report{
		Version: ReportVersion, Mode: "full", Started: time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC), Seconds: 612,
		Machine: Machine{Cores: 2, GOMAXPROCS: 2, MemTotalBytes: 24 << 30, MemAvailableBytes: 22 << 30, FileLimit: 20000,
			EphemeralPorts: [2]int{32768, 60999}, Load1: 0.5},
		Setup: Setup{Processes: 6, Target: "embedded", GroupSize: 5, HeartbeatSeconds: 30, ConnectRate: 10000,
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
			step(19936, 6, 9<<10, true, "sched_latency"),
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
