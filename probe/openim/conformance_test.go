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
// its faults. The real OpenIM that runs here stores no message (see
// real_test.go), so it cannot take the suite.
func TestConformance(t *testing.T) { runConformance(t, false) }

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
