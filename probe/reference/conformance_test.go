package reference_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/reference"
	"github.com/imcanary/imcanary/refserver"
)

// TestConformance runs the adapters' common suite against the reference
// server, with its faults.
func TestConformance(t *testing.T) { conformance.Run(t, conformanceServer(false, nil, nil)) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { conformance.Run(t, conformanceServer(true, nil, nil)) }

// TestConformanceReactorTLS runs it over wss://, with the sessions
// watched: the TLS is made inside the connection the poller reads
// (wsframe), and every subtest must pass as over plain TCP.
func TestConformanceReactorTLS(t *testing.T) {
	// httptest's certificate, for 127.0.0.1, and a pool that trusts it.
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	ts.Close()
	server := &tls.Config{Certificates: ts.TLS.Certificates}
	client := &tls.Config{RootCAs: ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	conformance.Run(t, conformanceServer(true, server, client))
}

// conformanceServer is the reference server for the suite, over TLS of
// server if it is not nil, which the driver trusts through client.
func conformanceServer(reactor bool, server, client *tls.Config) conformance.Server {
	a := reference.Adapter
	if client != nil {
		a.New = func(tg probe.Target) (probe.Driver, error) {
			return reference.New(reference.Options{URL: tg.URL, Header: tg.Header, Secret: tg.Secret, Heartbeat: tg.Heartbeat, TLS: client})
		}
	}
	return conformance.Server{
		Reactor: reactor,
		Adapter: a, CatchUp: true, Faulty: true, WrongSecret: true,
		Start: func(t *testing.T, f conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.ReferenceTLS(t, server, refserver.Options{}, f, via, a, probe.Target{Secret: secret})
		},
		// A 64-frame queue and a 64 KiB socket buffer: a reader that
		// stops overflows them within a second of 16 KiB messages.
		SlowStart: func(t *testing.T, via func(string) string) conformance.Instance {
			return conformance.ReferenceTLS(t, server, refserver.Options{SendQueue: 64, SendBuffer: 64 << 10}, conformance.Faults{}, via, a, probe.Target{Secret: secret})
		},
		SlowReason: metrics.ReasonSlowConsumer, SlowMessageSize: 16 << 10,
	}
}
