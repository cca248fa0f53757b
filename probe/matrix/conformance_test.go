package matrix_test

import (
	"testing"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
	"github.com/imcanary/imcanary/probe/matrix"
)

// TestConformance runs the adapters' common suite against the Dendrite
// that .ci/matrix.sh starts, with the shipped configs/matrix.yaml but a
// short poll: a /sync the server holds past its poll, a dial and the
// grace is a dead server. Scale 2, as for XMPP and Mattermost: every
// message is a database write and a JetStream publish in Dendrite, and
// on CI's loaded machine a 2 s deadline saw 28 sends of one run unacked.
func TestConformance(t *testing.T) {
	url, secret := server(t)
	section := shippedConfig(t)
	section.PollTimeout = 2 * time.Second
	conformance.Run(t, conformance.Server{
		Adapter: matrix.Adapter, CatchUp: true, WrongSecret: true, Scale: 2,
		Silence: section.PollTimeout + longpoll.DefaultDialTimeout + longpoll.DefaultGrace,
		Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
			return conformance.Instance{Target: probe.Target{URL: conformance.Via(t, url, via), Secret: secret, Section: section}}
		},
	})
}
