package mattermost_test

import (
	"testing"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/mattermost"
)

// TestConformance runs the adapters' common suite against the Mattermost
// that .ci/mattermost.sh starts, with the shipped configs/mattermost.yaml.
// Its REST API and WebSocket share the one address the suite proxies.
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	url := server(t)
	section := shippedConfig(t)
	conformance.Run(t, conformance.Server{
		Reactor: reactor,
		Adapter: mattermost.Adapter, CatchUp: true, WrongSecret: true,
		// Every login is a bcrypt hash and every post a database
		// write on a server that shares the machine's two cores.
		Scale: 2,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.Instance{Target: probe.Target{URL: conformance.Via(t, url, via), Secret: secret, Section: section}}
		},
	})
}
