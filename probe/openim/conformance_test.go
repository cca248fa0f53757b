package openim_test

import (
	"testing"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/openim"
	"github.com/imcanary/imcanary/probe/openim/openimtest"
)

// TestConformance runs the adapters' common suite against openimtest, with
// its faults.
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReal runs it against the real OpenIM v3.8.3 that
// .ci/openim.sh starts: provisioning, sessions, a population's pushes,
// a dead peer, catch-up, the kick, the secret and a slow reader, without
// faults (a real server cannot inject them). Scale 6: every message goes
// through Kafka, Redis and FerretDB before it is pushed; at scale 4 (a
// catch-up grace of 2.7 s) CI's full run still saw one direct message of
// 51 fetched before its push. Rate 1: OpenIM
// takes one conversation's messages one after another (100 sent at once
// to one user were pushed over 15 s here), and at the suite's 5 a second
// per user, in its few conversations, pushes in CI's full run queued past
// catch-up's grace (40 of 153 fetched first).
//
// The slow reader: OpenIM writes each push under a 10 s deadline and
// then drops the connection. A slow reader's socket (a slow link's 32 KiB
// window) takes a few dozen 4 KiB pushes to fill, at 2 messages a second
// from each other user; here the gateway's first write timed out 28 s
// into the pause. The reader notices the close only when it reads again,
// at the pause's end: 60 s leaves room for a slower machine. The others'
// pushes wait meanwhile (the gateway's batch push returns once every
// recipient's write has), so catch-up fetches many of theirs first.
//
// The drill runs on a server of its own (IMCANARYTEST_OPENIM_SLOW_*): the
// suite's subtests run in parallel, and on a server shared with it the
// population subtest failed, beside the drill and again a minute after it
// (29 of 48 direct messages fetched before their push).
func TestConformanceReal(t *testing.T) {
	srv := realTarget(t)
	instance := func(t *testing.T, srv realServer, via func(string) string) conformance.Instance {
		section := openim.DefaultConfig()
		section.APIURL = srv.api
		tg := probe.Target{URL: conformance.Via(t, srv.ws, via), Secret: srv.secret, Section: section}
		return conformance.Instance{
			Target:     tg,
			Kick:       func(user string) { conformance.LoginAgain(t, openim.Adapter, tg, user, probe.Device{}) },
			KickReason: metrics.ReasonConflict,
		}
	}
	conformance.Run(t, conformance.Server{
		Adapter: openim.Adapter, CatchUp: true, WrongSecret: true, Scale: 6, Rate: 1,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			return instance(t, srv, via)
		},
		SlowStart: func(t *testing.T, via func(string) string) conformance.Instance {
			return instance(t, realSlowTarget(t), via)
		},
		SlowReason: metrics.ReasonError, SlowMessageSize: 4 << 10, SlowPause: time.Minute, SlowRate: 2,
	})
}

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	conformance.Run(t, conformance.Server{
		Reactor: reactor,
		Adapter: openim.Adapter, CatchUp: true, Faulty: true, WrongSecret: true,
		Start: func(t *testing.T, f conformance.Faults, via func(string) string) conformance.Instance {
			return startGateway(t, openimtest.Options{Faults: openimtest.Faults{DropPush: f.DropPush, DuplicatePush: f.Duplicate}}, via)
		},
		// OpenIM writes each push under a deadline (10 s; 300 ms here)
		// and closes a connection whose write failed, with no reason on
		// the wire: the adapter can only say error.
		SlowStart: func(t *testing.T, via func(string) string) conformance.Instance {
			return startGateway(t, openimtest.Options{WriteTimeout: 300 * time.Millisecond}, via)
		},
		SlowReason: metrics.ReasonError, SlowMessageSize: 16 << 10,
	})
}

// startGateway starts an openimtest gateway with o, its WebSocket through
// via, as a conformance instance.
func startGateway(t *testing.T, o openimtest.Options, via func(string) string) conformance.Instance {
	gw := newGateway(t, o)
	section := openim.DefaultConfig()
	section.APIURL = gw.APIURL()
	tg := probe.Target{URL: conformance.Via(t, gw.WSURL(), via), Secret: []byte(secret), Section: section}
	return conformance.Instance{
		Target: tg,
		Injected: func() (uint64, uint64) {
			st := gw.Stats()
			return uint64(st.PushesDuplicated - st.PushesDuplicatedOwn), uint64(st.PushesDropped - st.PushesDroppedOwn)
		},
		// A second login on the same platform: OpenIM's
		// default policy kicks the first.
		Kick:       func(user string) { conformance.LoginAgain(t, openim.Adapter, tg, user, probe.Device{}) },
		KickReason: metrics.ReasonConflict,
	}
}
