package bench

import (
	"math"
	"slices"
	"testing"
)

func TestPlanSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		given []int
		most  int
		quick bool
		want  []int
	}{
		{"full to the limit", nil, 19936, false, []int{1000, 2000, 5000, 10000, 15000, 19936}},
		{"full, low limit", nil, 4032, false, []int{1000, 2000, 4032}},
		{"full, limit on a step", nil, 5000, false, []int{1000, 2000, 5000}},
		{"full, tiny limit", nil, 960, false, []int{960}},
		{"quick", nil, 19936, true, []int{500, 1000}},
		{"quick, tiny limit", nil, 700, true, []int{500, 700}},
		{"given, clipped and sorted", []int{30000, 100, 100, 0}, 19936, false, []int{100, 19936}},
		{"no room", nil, 0, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := planSteps(tc.given, tc.most, tc.quick); !slices.Equal(got, tc.want) {
				t.Errorf("planSteps(%v, %d, %v) = %v, want %v", tc.given, tc.most, tc.quick, got, tc.want)
			}
		})
	}
	if got := maxSessionsPerProcess(20000); got != 19936 {
		t.Errorf("maxSessionsPerProcess(20000) = %d, want 19936", got)
	}
}

func TestRates(t *testing.T) {
	// 10,000 users in groups of 5 receive 2.5 deliveries per message on
	// average: 20,000 deliveries/s is 0.8 messages/s per user.
	if got := rateFor(20000, 10000, 5); math.Abs(got-0.8) > 1e-12 {
		t.Errorf("rateFor(20000, 10000, 5) = %v, want 0.8", got)
	}
	if got := deliveriesFor(10000, 0.8, 5); math.Abs(got-20000) > 1e-9 {
		t.Errorf("deliveriesFor(10000, 0.8, 5) = %v, want 20000", got)
	}
	if got := deliveriesFor(1, 1, 5); got != 0 {
		t.Errorf("deliveriesFor(1 user) = %v, want 0: a lone user has nobody to message", got)
	}
}

func TestCosts(t *testing.T) {
	// True costs: 10 µs per session-second, 50 µs per delivery.
	const a, b = 10e-6, 50e-6
	for _, tc := range []struct {
		name         string
		in           planInput
		wantA, wantB float64
	}{
		{"idle steps", planInput{
			stepCPU: a, noiseSessions: 10000, noiseDeliveries: 20000, noiseCPU: 10000*a + 20000*b,
		}, a, b},
		{"steps with traffic", planInput{
			stepCPU: a + b*0.25, stepDeliveries: 0.25, noiseSessions: 10000, noiseDeliveries: 20000, noiseCPU: 10000*a + 20000*b,
		}, a, b},
		{"no noise step", planInput{stepCPU: a}, a, 0},
		// Noise made the step look costlier than the whole noise step
		// per session: charge each step's CPU to what dominates it.
		{"inconsistent", planInput{
			stepCPU: 1e-3, noiseSessions: 10000, noiseDeliveries: 20000, noiseCPU: 1,
		}, 1e-3, 1.0 / 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotA, gotB := costs(tc.in)
			if math.Abs(gotA-tc.wantA) > 1e-12 || math.Abs(gotB-tc.wantB) > 1e-12 {
				t.Errorf("costs() = %g, %g, want %g, %g", gotA, gotB, tc.wantA, tc.wantB)
			}
		})
	}
}

func TestMakePlan(t *testing.T) {
	machine := Machine{
		Cores: 2, GOMAXPROCS: 2, MemAvailableBytes: 20 << 30, FileLimit: 20000, EphemeralPorts: [2]int{32768, 60999},
	}
	base := planInput{
		machine: machine, maxFDs: 0.9, maxPorts: 0.9, maxCPU: 0.9, baseFDs: 15,
		held: 100000, stepBytes: 10 << 10, stepCPU: 5e-6,
		noiseSessions: 10000, noiseDeliveries: 20000, noiseCPU: 10000*5e-6 + 20000*20e-6, noiseBytes: 11 << 10,
		receive: 50000, users: 100, rate: 0.5, groupSize: 5,
	}
	t.Run("limits", func(t *testing.T) {
		p := makePlan(base)
		// 0.9 × 20,000 files less 15 the prober holds anyway.
		if p.FDBound != 17985 || p.SessionsPerProcess != 17985 || p.Bound != "fds" {
			t.Errorf("fd bound = %d, per process %d bound by %q; want 17985 by fds", p.FDBound, p.SessionsPerProcess, p.Bound)
		}
		// 0.9 × 28,232 ports.
		if p.PortBound != 25408 {
			t.Errorf("PortBound = %d, want 25408", p.PortBound)
		}
		if p.BytesPerSession != 11<<10 {
			t.Errorf("BytesPerSession = %v, want the noise step's, the larger", p.BytesPerSession)
		}
		if want := 1906501; p.MemorySessions != want { // 20 GiB / 11 KiB
			t.Errorf("MemorySessions = %d, want %d", p.MemorySessions, want)
		}
		if math.Abs(p.CPUSecondsPerSessionSecond-5e-6) > 1e-12 || math.Abs(p.DeliveriesPerCoreSecond-50000) > 1e-6 {
			t.Errorf("costs = %g per session, %v deliveries per core-second; want 5e-6, 50000", p.CPUSecondsPerSessionSecond, p.DeliveriesPerCoreSecond)
		}
		// 1.8 cores, 0.5 of them for 100,000 idle sessions.
		if math.Abs(p.DeliveriesPerSecond-1.3*50000) > 1e-6 {
			t.Errorf("DeliveriesPerSecond = %v, want %v", p.DeliveriesPerSecond, 1.3*50000)
		}
		if p.Config.Shards != 1 || p.Config.Bound != "sessions" || p.Config.Machines != 1 {
			t.Errorf("config plan = %+v, want 1 shard on 1 machine", p.Config)
		}
	})
	t.Run("canary users take files", func(t *testing.T) {
		in := base
		in.canaryUsers = 4
		if p := makePlan(in); p.FDBound != 17981 {
			t.Errorf("FDBound with a canary of 4 = %d, want 17981", p.FDBound)
		}
	})
	t.Run("ports bind", func(t *testing.T) {
		in := base
		in.machine.EphemeralPorts = [2]int{50000, 59999}
		if p := makePlan(in); p.SessionsPerProcess != 9000 || p.Bound != "ports" {
			t.Errorf("with 10,000 ephemeral ports: %d per process bound by %q, want 9000 by ports", p.SessionsPerProcess, p.Bound)
		}
	})
	t.Run("shards by sessions", func(t *testing.T) {
		in := base
		in.users, in.rate = 100000, 0.001
		p := makePlan(in)
		if p.Config.Shards != 6 || p.Config.Bound != "sessions" {
			t.Errorf("100,000 quiet users: %d shards bound by %q, want 6 by sessions", p.Config.Shards, p.Config.Bound)
		}
		// Six shards on one 2-core machine: one core each, not two.
		if p.Config.Machines != 1 || p.Config.GOMAXPROCS != 1 {
			t.Errorf("6 shards on %d machine(s): GOMAXPROCS %d each, want 1 machine and 1", p.Config.Machines, p.Config.GOMAXPROCS)
		}
		in.machine.GOMAXPROCS = 16
		if p := makePlan(in); p.Config.GOMAXPROCS != 2 {
			t.Errorf("6 shards on 16 cores: GOMAXPROCS %d each, want 2", p.Config.GOMAXPROCS)
		}
	})
	t.Run("one shard keeps the runtime's GOMAXPROCS", func(t *testing.T) {
		if p := makePlan(base); p.Config.GOMAXPROCS != 0 {
			t.Errorf("1 shard: GOMAXPROCS %d, want 0 (the runtime's own)", p.Config.GOMAXPROCS)
		}
	})
	t.Run("shards by cpu", func(t *testing.T) {
		in := base
		in.users, in.rate = 20000, 1 // 50,000 deliveries/s: 1 core, plus 0.1 for the sessions
		p := makePlan(in)
		if math.Abs(p.Config.DeliveriesPerSecond-50000) > 1e-9 || math.Abs(p.Config.CPUCores-1.1) > 1e-9 {
			t.Fatalf("config = %+v, want 50,000 deliveries/s on 1.1 cores", p.Config)
		}
		if p.Config.Shards != 2 || p.Config.Bound != "sessions" {
			t.Errorf("20,000 users: %d shards bound by %q, want 2 by sessions", p.Config.Shards, p.Config.Bound)
		}
		in.rate = 4 // 200,000 deliveries/s: 4.1 cores
		p = makePlan(in)
		if p.Config.Shards != 3 || p.Config.Bound != "cpu" || p.Config.Machines != 3 {
			t.Errorf("200,000 deliveries/s: %d shards bound by %q on %d machines, want 3 by cpu on 3", p.Config.Shards, p.Config.Bound, p.Config.Machines)
		}
		if p.Config.GOMAXPROCS != 0 {
			t.Errorf("a shard per machine: GOMAXPROCS %d, want 0 (the runtime's own)", p.Config.GOMAXPROCS)
		}
	})
	t.Run("nothing measured", func(t *testing.T) {
		p := makePlan(planInput{machine: machine, maxFDs: 0.9, maxPorts: 0.9, maxCPU: 0.9, users: 100, rate: 0.5, groupSize: 5})
		if p.Config.Shards != 1 || p.MemorySessions != 0 || p.DeliveriesPerSecond != 0 {
			t.Errorf("plan from nothing = %+v, want 1 shard and no figures", p)
		}
	})
}

// TestFindLimit: a plan says it found what limits the machine only when the
// run reached a limit; steps that all held short of every bound leave the
// figure as the largest step tried.
func TestFindLimit(t *testing.T) {
	machine := Machine{Cores: 2, GOMAXPROCS: 2, MemAvailableBytes: 20 << 30, FileLimit: 20000, EphemeralPorts: [2]int{32768, 60999}}
	step := func(per, procs int, saturated bool) Step {
		return Step{SessionsPerProcess: per, Processes: procs, Sessions: per * procs, Online: per * procs, Saturated: saturated}
	}
	report := func(stop Stop, steps ...Step) *Report {
		r := &Report{Machine: machine, Steps: steps, Stop: stop}
		r.Plan = Plan{Sessions: 0, FDBound: 17985, PortBound: 25408, MemorySessions: 1906501}
		for _, st := range steps {
			if !st.Saturated && st.Online >= st.Sessions {
				r.Plan.Sessions = max(r.Plan.Sessions, st.Sessions)
			}
		}
		return r
	}
	done := Stop{Reason: StopStepsDone}
	for _, tc := range []struct {
		name string
		r    *Report
		want string
	}{
		{"quick, every step held", report(done, step(500, 1, false), step(1000, 1, false)), ""},
		{"saturated", report(Stop{Reason: StopSaturated, Step: 2}, step(1000, 6, false), step(10000, 6, true)), LimitSaturated},
		{"first step saturated", report(Stop{Reason: StopSaturated, Step: 1}, step(1000, 6, true)), LimitSaturated},
		{"not online", report(Stop{Reason: StopNotOnline, Step: 2}, step(1000, 1, false), step(2000, 1, false)), LimitNotOnline},
		{"full, to the file limit", report(done, step(10000, 2, false), step(19936, 2, false)), LimitFDs},
		{"at the fd bound", report(done, step(17985, 1, false)), LimitFDs},
		{"interrupted", report(Stop{Reason: StopInterrupted}, step(19936, 2, false)), ""},
		{"error", report(Stop{Reason: StopError, Step: 2}, step(1000, 1, false)), ""},
		{"nothing ran", report(Stop{}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := findLimit(tc.r); got != tc.want {
				t.Errorf("findLimit(%+v) = %q, want %q", tc.r.Stop, got, tc.want)
			}
		})
	}
	t.Run("ports", func(t *testing.T) {
		r := report(done, step(9000, 1, false))
		r.Plan.PortBound = 9000
		if got := findLimit(r); got != LimitPorts {
			t.Errorf("findLimit(9,000 per process, port bound 9,000) = %q, want %q", got, LimitPorts)
		}
	})
	t.Run("memory", func(t *testing.T) {
		r := report(done, step(5000, 4, false))
		r.Plan.MemorySessions = 20000
		if got := findLimit(r); got != LimitMemory {
			t.Errorf("findLimit(20,000 sessions, memory for 20,000) = %q, want %q", got, LimitMemory)
		}
	})
}
