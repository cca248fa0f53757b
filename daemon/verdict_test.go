package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/imcanary/imcanary/engine"
	"github.com/imcanary/imcanary/metrics"
)

// TestJudge checks the verdict and its cause for each way the target and
// the prober can be, and that nothing is judged worse than it is.
func TestJudge(t *testing.T) {
	now := statusEpoch
	healthy := func() verdictInput {
		return verdictInput{
			now: now, started: now.Add(-time.Hour), startGrace: 40 * time.Second,
			reach:  engine.ReachState{Known: true, Reachable: true, Since: now.Add(-time.Hour)},
			online: 100, users: 100, ready: true,
			recent: RecentStatus{Window: 5 * time.Minute, Objective: 0.999, SLIs: []WindowSLI{
				{Source: "background", Kind: "direct", Expected: 3000, Delivered: 3000, Completeness: ptr(1), Latency: ptr(1)},
				{Source: "background", Kind: "group", Expected: 12000, Delivered: 12000, Completeness: ptr(1), Latency: ptr(1)},
			}},
		}
	}
	tests := []struct {
		name   string
		change func(*verdictInput)
		state  string
		cause  []string // substrings of Cause
		more   []string // substrings of some other entry of Causes
	}{
		{"healthy", func(*verdictInput) {}, VerdictHealthy, []string{"all 100 sessions online", "99.9%", "5m0s"}, nil},
		{"refused", func(in *verdictInput) {
			in.online = 0
			in.reach = engine.ReachState{Known: true, Since: now.Add(-12 * time.Second), Reason: metrics.ConnectRefused,
				Err: errRefused.Error()}
		}, VerdictDown, []string{"target unreachable for 12s: connection refused (dial tcp 127.0.0.1:1: connect: connection refused); 0 of 100 sessions online"}, nil},
		{"404 on upgrade", func(in *verdictInput) {
			in.online, in.ready = 0, false
			in.reach = engine.ReachState{Known: true, Since: now.Add(-time.Minute), Reason: metrics.ConnectHTTP4xx,
				Err: "login u1: dial ws://h/ws: WebSocket upgrade answered HTTP 404 Not Found"}
		}, VerdictDown, []string{"the WebSocket upgrade was answered HTTP 404 Not Found"}, nil},
		{"wrong secret", func(in *verdictInput) {
			in.online, in.ready = 0, false
			in.reach = engine.ReachState{Known: true, Since: now.Add(-time.Minute), Reason: metrics.ConnectUnauthorized,
				Err: `login u1: the target closed the login with 4001 "bad token"`}
		}, VerdictDown, []string{`unauthorized: the target closed the login with 4001 "bad token"`}, nil},
		{"logins fail, sessions stay", func(in *verdictInput) {
			in.online = 97
			in.reach = engine.ReachState{Known: true, Since: now.Add(-time.Minute), Reason: metrics.ConnectRefused, Err: errRefused.Error()}
		}, VerdictDegraded, []string{"new logins failing for 1m0s: connection refused", "97 of 100 sessions online"}, nil},
		{"down beats saturated, and says both", func(in *verdictInput) {
			in.reach = engine.ReachState{Known: true, Since: now.Add(-time.Minute), Reason: metrics.ConnectTimeout, Err: "context deadline exceeded"}
			in.saturation = SaturationStatus{Saturated: true, Since: now.Add(-time.Minute), Causes: []string{"cpu"}}
			in.online = 0
			in.recent.SLIs[1].Completeness = ptr(0.8)
		}, VerdictDown, []string{"timed out"}, []string{"imcanary is saturated (cpu)", "background group real-time completeness 80%"}},
		{"everyone dropped", func(in *verdictInput) { in.online = 0 }, VerdictDown,
			[]string{"no session online: 0 of 100 sessions online; logging in again"}, nil},
		{"everyone dropped, two attempts failed", func(in *verdictInput) {
			in.online = 0
			in.reach.Streak, in.reach.Reason, in.reach.Err = 2, metrics.ConnectRefused, errRefused.Error()
		}, VerdictDown, []string{"2 attempts failed since the last success, the last: connection refused"}, nil},
		{"saturated", func(in *verdictInput) {
			in.saturation = SaturationStatus{Saturated: true, Since: now.Add(-30 * time.Second), Causes: []string{"cpu", "sched_latency"}}
			in.recent.SLIs[0].Completeness = ptr(0.5)
		}, VerdictSaturated, []string{"imcanary is saturated (cpu, sched_latency) since 30s ago", "may be its own"},
			[]string{"background direct real-time completeness 50%"}},
		{"ramping", func(in *verdictInput) {
			in.started, in.ready, in.online = now.Add(-5*time.Second), false, 40
		}, VerdictStarting, []string{"starting: 40 of 100 sessions online"}, nil},
		{"ramping, with loss already", func(in *verdictInput) {
			in.started, in.ready, in.online = now.Add(-5*time.Second), false, 40
			in.recent.SLIs[0].Completeness = ptr(0.9)
		}, VerdictStarting, []string{"starting: 40 of 100 sessions online"}, []string{"background direct real-time completeness 90%"}},
		{"ramp took too long", func(in *verdictInput) {
			in.started, in.ready, in.online = now.Add(-time.Minute), false, 40
		}, VerdictDegraded, []string{"40 of 100 sessions online"}, nil},
		{"2% loss", func(in *verdictInput) {
			w := &in.recent.SLIs[1]
			w.Lost, w.Delivered, w.Completeness, w.Eventual = 240, 11760, ptr(0.98), ptr(0.98)
		}, VerdictDegraded, []string{"background group eventual completeness 98% over the last 5m0s (objective 99.9%): 240 lost of 12,000 owed"}, nil},
		{"pushes dropped, store kept", func(in *verdictInput) {
			w := &in.recent.SLIs[1]
			w.Recovered, w.Delivered, w.Completeness, w.Eventual = 240, 11760, ptr(0.98), ptr(1)
		}, VerdictDegraded, []string{"background group real-time completeness 98% over the last 5m0s (objective 99.9%): 0 lost, 0 late, 240 recovered by catch-up of 12,000 owed"}, nil},
		{"exactly at the objective", func(in *verdictInput) {
			in.recent.SLIs[1].Completeness = ptr(0.999)
		}, VerdictHealthy, nil, nil},
		{"slow", func(in *verdictInput) { in.recent.SLIs[0].Latency = ptr(0.9) }, VerdictDegraded,
			[]string{"background direct latency: 90% of deliveries within 1s"}, nil},
		{"duplicates and reordering", func(in *verdictInput) {
			in.recent.SLIs[0].Duplicate, in.recent.SLIs[1].Reordered = 3, 7
		}, VerdictDegraded, []string{"background direct: 3 duplicate deliveries"}, []string{"background group: 7 deliveries out of order"}},
		{"canary failed", func(in *verdictInput) {
			in.lastCanary = &canaryOutcome{end: now.Add(-10 * time.Second), detail: "direct 3/4 delivered (late)"}
			in.canaryStale = time.Minute
		}, VerdictDegraded, []string{"last canary round failed: direct 3/4 delivered (late)"}, nil},
		{"old canary failure", func(in *verdictInput) {
			in.lastCanary = &canaryOutcome{end: now.Add(-10 * time.Minute), detail: "direct 3/4 delivered (late)"}
			in.canaryStale = time.Minute
		}, VerdictHealthy, nil, nil},
		{"lagging", func(in *verdictInput) { in.lagging = 2 }, VerdictDegraded, []string{"2 sessions lagging"}, nil},
		{"connect failures", func(in *verdictInput) {
			in.recent.Failures = map[string]float64{"timeout": 10, "refused": 2}
		}, VerdictDegraded, []string{"12 connect attempts failed (timeout 10, refused 2) over the last 5m0s"}, nil},
		{"several at once", func(in *verdictInput) {
			in.online = 97
			in.lagging = 1
		}, VerdictDegraded, []string{"97 of 100 sessions online"}, []string{"1 sessions lagging"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := healthy()
			tt.change(&in)
			v := judge(in)
			if v.State != tt.state {
				t.Fatalf("judge() = %s (%q), want %s", v.State, v.Cause, tt.state)
			}
			if len(v.Causes) == 0 || v.Causes[0] != v.Cause {
				t.Errorf("judge() causes %q do not start with the cause %q", v.Causes, v.Cause)
			}
			for _, s := range tt.cause {
				if !strings.Contains(v.Cause, s) {
					t.Errorf("judge() cause = %q, want it to contain %q", v.Cause, s)
				}
			}
			for _, s := range tt.more {
				if !strings.Contains(strings.Join(v.Causes[1:], "\n"), s) {
					t.Errorf("judge() causes = %q, want one of the others to contain %q", v.Causes, s)
				}
			}
		})
	}
}

// TestJudgeStartingIsNotAShortfall: sessions still ramping in are not
// listed as missing.
func TestJudgeStartingIsNotAShortfall(t *testing.T) {
	v := judge(verdictInput{now: statusEpoch, started: statusEpoch.Add(-time.Second), startGrace: time.Minute,
		online: 3, users: 10, recent: RecentStatus{Objective: 0.999}})
	if v.State != VerdictStarting || len(v.Causes) != 1 {
		t.Errorf("judge(ramping) = %+v, want starting and nothing else", v)
	}
}

func TestCount(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {9999, "9,999"}, {10000, "10,000"}, {1234567, "1,234,567"}, {-12345, "-12,345"}, {2.6, "3"}} {
		if got := count(tt.in); got != tt.want {
			t.Errorf("count(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
