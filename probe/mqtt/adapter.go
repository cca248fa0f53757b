package mqtt

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is mqtt's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "mqtt",
		Section: DefaultConfig(),
		Help: map[string]string{
			"version":          `MQTT version: "3.1.1" or "5"`,
			"session_expiry":   "MQTT 5: how long the broker keeps a device's session after it disconnects (catch-up on)",
			"topic_prefix":     "first topic levels of every topic (PREFIX/dm/TO/FROM, PREFIX/g/GROUP)",
			"qos":              "1: each publish acked by PUBACK; 0: a publish counts as accepted once written",
			"client_id_prefix": "start of each device's client identifier (PREFIX + USER + '-' + DEVICE)",
			"username":         "CONNECT user name; the password is the target secret, when set",
			"max_packet":       "largest MQTT packet accepted from the broker, in bytes",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	Secret: probe.SecretOptional,
	SecretFits: func(section any, secret bool) error {
		return passwordFits(section.(Config), secret)
	},
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{URL: t.URL, Header: t.Header, Password: t.Secret, Heartbeat: t.Heartbeat, Logger: t.Logger})
	},
}
