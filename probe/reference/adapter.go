package reference

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is the reference protocol's entry in the registry of protocols.
// Its old name, "embedded", is still accepted.
var Adapter = probe.Adapter{
	Config: config.Protocol{Name: "reference", Aliases: []string{"embedded"}, InProcess: true},
	Secret: probe.SecretOptional,
	New: func(t probe.Target) (probe.Driver, error) {
		return New(Options{URL: t.URL, Header: t.Header, Secret: t.Secret, Heartbeat: t.Heartbeat})
	},
}
