package xmpp_test

import (
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/xmpp"
)

// TestConformance runs the adapters' common suite against the archiving
// Prosody that .ci/prosody.sh starts (IMCANARYTEST_PROSODY_ARCHIVE_URL):
// the one whose archive (XEP-0313) catch-up reads.
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	url := prosodyArchiveURL(t)
	section := xmpp.DefaultConfig()
	conformance.Run(t, conformance.Server{
		Reactor: reactor,
		Adapter: xmpp.Adapter, CatchUp: true, WrongSecret: true,
		// A login is a SCRAM hash on Prosody's single thread.
		Scale: 2,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			tg := probe.Target{URL: conformance.Via(t, url, via), Secret: []byte("conformance-secret"), Section: section}
			return conformance.Instance{
				Target: tg,
				// A second login on the same resource: Prosody's
				// default (conflict_resolve kick_old) ends the first
				// with a conflict stream error.
				Kick:       func(user string) { conformance.LoginAgain(t, xmpp.Adapter, tg, user, probe.Device{}) },
				KickReason: metrics.ReasonConflict,
			}
		},
	})
}
