package openim_test

import (
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/openim"
	"github.com/imcanary/imcanary/probe/openim/openimtest"
)

// TestConformance runs the adapters' common suite against openimtest, with
// its faults. The real OpenIM that runs here stores no message (see
// real_test.go), so it cannot take the suite.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Server{
		Adapter: openim.Adapter, CatchUp: true, Faulty: true, WrongSecret: true,
		Start: func(t *testing.T, f conformance.Faults, via func(string) string) conformance.Instance {
			gw := newGateway(t, openimtest.Options{Faults: openimtest.Faults{DropPush: f.DropPush, DuplicatePush: f.Duplicate}})
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
		},
	})
}
