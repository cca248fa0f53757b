package centrifugo_test

import (
	"os"
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/centrifugo"
	"github.com/imcanary/imcanary/probe/internal/conformance"
)

// TestConformance runs the adapters' common suite against the real
// Centrifugo that .ci/centrifugo.sh starts (IMCANARYTEST_CENTRIFUGO_URL,
// IMCANARYTEST_CENTRIFUGO_SECRET).
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	url, secret := os.Getenv("IMCANARYTEST_CENTRIFUGO_URL"), os.Getenv("IMCANARYTEST_CENTRIFUGO_SECRET")
	if url == "" || secret == "" {
		t.Skip("IMCANARYTEST_CENTRIFUGO_URL and IMCANARYTEST_CENTRIFUGO_SECRET unset: no Centrifugo to test against")
	}
	conformance.Run(t, conformance.Server{
		Reactor: reactor,
		Adapter: centrifugo.Adapter, CatchUp: true, WrongSecret: true,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.Instance{Target: probe.Target{
				URL: conformance.Via(t, url, via), Secret: []byte(secret), Section: centrifugo.DefaultConfig(),
			}}
		},
		// The second instance, whose client queue holds 64 KiB: a
		// reader that stops is closed with 3008 within a second of
		// 16 KiB messages.
		SlowStart: func(t *testing.T, via func(string) string) conformance.Instance {
			slow := os.Getenv("IMCANARYTEST_CENTRIFUGO_SLOW_URL")
			if slow == "" {
				t.Skip("IMCANARYTEST_CENTRIFUGO_SLOW_URL unset: no Centrifugo with a small client queue")
			}
			return conformance.Instance{Target: probe.Target{
				URL: conformance.Via(t, slow, via), Secret: []byte(secret), Section: centrifugo.DefaultConfig(),
			}}
		},
		SlowReason: metrics.ReasonSlowConsumer, SlowMessageSize: 16 << 10,
		// Once the drill has run, the instance often closes no slow
		// reader within a second drill's time (its queues still drain):
		// the drill runs once, the way the daemon reads by default.
		SlowOnce: true,
	})
}
