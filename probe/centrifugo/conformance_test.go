package centrifugo_test

import (
	"os"
	"testing"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/centrifugo"
	"github.com/imcanary/imcanary/probe/internal/conformance"
)

// TestConformance runs the adapters' common suite against the real
// Centrifugo that .ci/centrifugo.sh starts (IMCANARYTEST_CENTRIFUGO_URL,
// IMCANARYTEST_CENTRIFUGO_SECRET).
func TestConformance(t *testing.T) {
	url, secret := os.Getenv("IMCANARYTEST_CENTRIFUGO_URL"), os.Getenv("IMCANARYTEST_CENTRIFUGO_SECRET")
	if url == "" || secret == "" {
		t.Skip("IMCANARYTEST_CENTRIFUGO_URL and IMCANARYTEST_CENTRIFUGO_SECRET unset: no Centrifugo to test against")
	}
	conformance.Run(t, conformance.Server{
		Adapter: centrifugo.Adapter, CatchUp: true, WrongSecret: true,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.Instance{Target: probe.Target{
				URL: conformance.Via(t, url, via), Secret: []byte(secret), Section: centrifugo.DefaultConfig(),
			}}
		},
	})
}
