package mqtt_test

import (
	"testing"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/conformance"
	"github.com/imcanary/imcanary/probe/mqtt"
	"github.com/imcanary/imcanary/protocols"
)

// TestConformance runs the adapters' common suite against each broker
// .ci/mqtt.sh starts, with the shipped configs/mqtt.yaml (QoS 1, and
// persistent sessions for catch-up) at MQTT 5: a 3.1.1 broker ends a
// session it hands to a new login by closing the connection, with no
// reason to tell a kick from a failure (the adapter's own tests run 3.1.1).
func TestConformance(t *testing.T) { runConformance(t, false) }

// TestConformanceReactor runs it again with the sessions read by the
// population's poller, without a goroutine each (population.reactor).
func TestConformanceReactor(t *testing.T) { runConformance(t, true) }

func runConformance(t *testing.T, reactor bool) {
	cfg, err := protocols.Loader().Load("../../configs/mqtt.yaml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	section := config.Section[mqtt.Config](cfg, "mqtt", mqtt.DefaultConfig())
	section.Version = "5"
	for _, broker := range []struct {
		name, urlVar string
		// kicks says the broker tells a taken-over session why
		// (DISCONNECT 0x8E). Mosquitto 2.0.11 over WebSocket does not:
		// it logs "already connected, closing old connection" and the
		// old session sees the connection closed (1006), no DISCONNECT.
		kicks bool
		// slowVar names an instance of the broker that queues little
		// for a session, "" for none.
		slowVar string
	}{{"mosquitto", mosquittoVar, false, mosquittoSlowVar}, {"mochi", mochiVar, true, ""}} {
		t.Run(broker.name, func(t *testing.T) {
			url := brokerURL(t, broker.urlVar)
			srv := conformance.Server{
				Reactor: reactor,
				Adapter: mqtt.Adapter, CatchUp: true,
				Start: func(t *testing.T, _ conformance.Faults, via func(string) string) conformance.Instance {
					tg := probe.Target{URL: conformance.Via(t, url, via), Section: section}
					in := conformance.Instance{Target: tg}
					if broker.kicks {
						// A second CONNECT with the same client
						// identifier: the broker ends the first
						// (MQTT 5.0 §3.1.4, take-over).
						in.Kick = func(user string) { conformance.LoginAgain(t, mqtt.Adapter, tg, user, probe.Device{}) }
						in.KickReason = metrics.ReasonConflict
					}
					return in
				},
			}
			if broker.slowVar != "" {
				// It drops what a session's queue of 100 cannot
				// hold, and keeps the session: loss, no close.
				srv.SlowStart = func(t *testing.T, via func(string) string) conformance.Instance {
					return conformance.Instance{Target: probe.Target{URL: conformance.Via(t, brokerURL(t, broker.slowVar), via), Section: section}}
				}
			}
			conformance.Run(t, srv)
		})
	}
}
