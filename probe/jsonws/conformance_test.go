package jsonws_test

import (
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/refserver"
)

// TestConformance runs the adapters' common suite through the shipped
// mapping of the reference protocol, against the reference server with
// its faults.
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	section := mappedReference(t)
	conformance.Run(t, conformance.Server{
		Reactor: reactor,
		Adapter: jsonws.Adapter, CatchUp: true, Faulty: true, WrongSecret: true,
		Start: func(t *testing.T, f conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.Reference(t, refserver.Options{}, f, via, jsonws.Adapter, probe.Target{Secret: secret, Section: section})
		},
		// A 64-frame queue and a 64 KiB socket buffer: a reader that
		// stops overflows them within a second of 16 KiB messages.
		SlowStart: func(t *testing.T, via func(string) string) conformance.Instance {
			return conformance.Reference(t, refserver.Options{SendQueue: 64, SendBuffer: 64 << 10}, conformance.Faults{}, via, jsonws.Adapter, probe.Target{Secret: secret, Section: section})
		},
		SlowReason: metrics.ReasonSlowConsumer, SlowMessageSize: 16 << 10,
	})
}
