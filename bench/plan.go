package bench

import (
	"math"
	"slices"
)

// fileReserve is the open files a prober keeps apart from its sessions: the
// daemon refuses a population of more than RLIMIT_NOFILE less this (its
// listener, epoll, /proc reads, log and data files).
const fileReserve = 64

// maxSessionsPerProcess is the largest population a prober accepts under
// the file limit.
func maxSessionsPerProcess(fileLimit int64) int {
	return int(max(0, fileLimit-fileReserve))
}

// Session steps, per process. Full runs climb in roughly doubling steps to
// the file limit, so that a cost that grows faster than the sessions shows
// between two of them; quick runs take two small ones.
var (
	fullSteps  = []int{1000, 2000, 5000, 10000, 15000}
	quickSteps = []int{500, 1000}
)

// planSteps returns the sessions per process of each step: the given ones,
// or the defaults, clipped to most; a full run ends at most itself, the
// largest population the file limit allows.
func planSteps(given []int, most int, quick bool) []int {
	if most < 1 {
		return nil
	}
	var steps []int
	switch {
	case len(given) > 0:
		for _, s := range given {
			if s > 0 {
				steps = append(steps, min(s, most))
			}
		}
	case quick:
		for _, s := range quickSteps {
			steps = append(steps, min(s, most))
		}
	default:
		for _, s := range fullSteps {
			if s < most {
				steps = append(steps, s)
			}
		}
		steps = append(steps, most)
	}
	slices.Sort(steps)
	return slices.Compact(steps)
}

// rateFor returns the messages per second per user that make users in
// groups of groupSize receive deliveries per second: each user alternates
// a direct message (one delivery) and a group message (groupSize-1), so a
// message brings groupSize/2 deliveries on average.
func rateFor(deliveries float64, users, groupSize int) float64 {
	if users < 1 || groupSize < 2 {
		return 0
	}
	return deliveries / float64(users) / (float64(groupSize) / 2)
}

// deliveriesFor is the inverse of rateFor.
func deliveriesFor(users int, rate float64, groupSize int) float64 {
	if users < 2 || groupSize < 2 {
		return 0
	}
	return float64(users) * rate * float64(groupSize) / 2
}

// planInput is what the plan is made from.
type planInput struct {
	machine Machine
	// Limits from the configuration's saturation section.
	maxFDs, maxPorts, maxCPU float64
	// canaryUsers are the sessions a shard's canary adds (0 if off).
	canaryUsers int
	// baseFDs are the files a prober holds besides its sessions.
	baseFDs int
	// held is the most sessions held without saturation, all probers
	// together.
	held int
	// From the largest step held: bytes per session, CPU in core-seconds
	// per session-second, and deliveries per second per session.
	stepBytes, stepCPU, stepDeliveries float64
	// From the self-noise step: its sessions, deliveries per second, CPU
	// in cores, and bytes per session (its ledgers hold streams).
	noiseSessions                         int
	noiseDeliveries, noiseCPU, noiseBytes float64
	// receive is the flood's imcanary figure.
	receive float64
	// The configuration to size.
	file      string
	users     int
	rate      float64
	groupSize int
}

// costs splits the prober's CPU into a cost per session a (core-seconds
// per session-second, heartbeats and sweeps) and a cost per delivery b
// (core-seconds, sending included), from the two steps that load them in
// different proportions: a session step, at stepDeliveries per session,
// and the self-noise step, mostly deliveries. It solves
//
//	stepCPU  = a + b·stepDeliveries
//	noiseCPU = a·noiseSessions + b·noiseDeliveries
//
// and falls back to charging each step's CPU to what dominates it when
// the two are too alike to tell apart or the noise of a busy machine
// makes a cost negative.
func costs(in planInput) (a, b float64) {
	n, d := float64(in.noiseSessions), in.noiseDeliveries
	if d <= 0 {
		return in.stepCPU, 0
	}
	if den := d - n*in.stepDeliveries; den > 0 {
		b = (in.noiseCPU - n*in.stepCPU) / den
		a = in.stepCPU - b*in.stepDeliveries
		if a >= 0 && b > 0 {
			return a, b
		}
	}
	return in.stepCPU, in.noiseCPU / d
}

// makePlan turns the measurements into a plan. It is arithmetic only, so
// that it can be tested on its own.
func makePlan(in planInput) Plan {
	p := Plan{
		Sessions:                       in.held,
		BytesPerSession:                max(in.stepBytes, in.noiseBytes),
		ReceiveDeliveriesPerCoreSecond: in.receive,
	}
	m := in.machine
	// A shard is flagged saturated past max_fds of the file limit, and
	// refuses to start past the limit less its reserve.
	p.FDBound = max(0, min(
		int(math.Floor(in.maxFDs*float64(m.FileLimit)))-in.baseFDs,
		maxSessionsPerProcess(m.FileLimit),
	)-in.canaryUsers)
	if ports := m.EphemeralPorts[1] - m.EphemeralPorts[0] + 1; m.EphemeralPorts[0] > 0 {
		p.PortBound = int(math.Floor(in.maxPorts * float64(ports)))
	}
	p.SessionsPerProcess, p.Bound = p.FDBound, "fds"
	if p.PortBound > 0 && p.PortBound < p.FDBound {
		p.SessionsPerProcess, p.Bound = p.PortBound, "ports"
	}

	idle, perDelivery := costs(in)
	p.CPUSecondsPerSessionSecond = idle
	if perDelivery > 0 {
		p.DeliveriesPerCoreSecond = 1 / perDelivery
	}
	cores := float64(m.GOMAXPROCS) * in.maxCPU
	if p.BytesPerSession > 0 {
		p.MemorySessions = int(float64(m.MemAvailableBytes) / p.BytesPerSession)
	}
	if idle > 0 {
		p.CPUSessions = int(cores / idle)
	}
	p.DeliveriesPerSecond = max(0, (cores-float64(in.held)*idle)*p.DeliveriesPerCoreSecond)

	c := ConfigPlan{File: in.file, Users: in.users, Rate: in.rate, GroupSize: in.groupSize}
	c.DeliveriesPerSecond = deliveriesFor(in.users, in.rate, in.groupSize)
	c.CPUCores = float64(in.users)*idle + c.DeliveriesPerSecond*perDelivery
	c.Shards, c.Bound = 1, "sessions"
	if p.SessionsPerProcess > 0 {
		c.Shards = ceilDiv(float64(in.users), float64(p.SessionsPerProcess))
	}
	if cores > 0 {
		if byCPU := ceilDiv(c.CPUCores, cores); byCPU > c.Shards {
			c.Shards, c.Bound = byCPU, "cpu"
		}
	}
	c.Machines = 1
	if cores > 0 {
		c.Machines = max(c.Machines, ceilDiv(c.CPUCores, cores))
	}
	if m.MemAvailableBytes > 0 {
		c.Machines = max(c.Machines, ceilDiv(float64(in.users)*p.BytesPerSession, float64(m.MemAvailableBytes)))
	}
	if perMachine := ceilDiv(float64(c.Shards), float64(c.Machines)); perMachine > 1 {
		c.GOMAXPROCS = sharedGOMAXPROCS(m.GOMAXPROCS, perMachine)
	}
	p.Config = c
	return p
}

// sharedGOMAXPROCS is the GOMAXPROCS for each of shards Go processes that
// share procs cores: their share, at least 1. Each process left at the
// machine's count runs its collector's workers (a quarter of GOMAXPROCS)
// beside the others', and an idle prober's collections then queue for
// cores behind its neighbours'.
func sharedGOMAXPROCS(procs, shards int) int {
	return max(1, procs/max(shards, 1))
}

// ceilDiv is ⌈a/b⌉, at least 1.
func ceilDiv(a, b float64) int {
	if b <= 0 || a <= 0 {
		return 1
	}
	return max(1, int(math.Ceil(a/b-1e-9)))
}

// setLimit fills r's Plan.Limit and Plan.LimitFound from findLimit.
func setLimit(r *Report) {
	r.Plan.Limit = findLimit(r)
	r.Plan.LimitFound = r.Plan.Limit != ""
}

// findLimit says which limit, if any, r's run reached (Plan.Limit), from
// why its steps ended and what the largest step held came to. It runs once
// Stop is final: a run that ended in an error or was interrupted found no
// limit, whatever it held.
func findLimit(r *Report) string {
	switch r.Stop.Reason {
	case StopSaturated:
		return LimitSaturated
	case StopNotOnline:
		return LimitNotOnline
	case StopStepsDone:
	default:
		return ""
	}
	// Every step held; the largest one held (all online, not saturated)
	// may have reached a bound.
	per := 0
	for _, st := range r.Steps {
		if st.Online >= st.Sessions && !st.Saturated {
			per = max(per, st.SessionsPerProcess)
		}
	}
	p := r.Plan
	switch {
	case per == 0:
		return ""
	case p.FDBound > 0 && per >= p.FDBound, per >= maxSessionsPerProcess(r.Machine.FileLimit):
		return LimitFDs
	case p.PortBound > 0 && per >= p.PortBound:
		return LimitPorts
	case p.MemorySessions > 0 && p.Sessions >= p.MemorySessions:
		return LimitMemory
	}
	return ""
}
