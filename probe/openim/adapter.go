package openim

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is openim's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "openim",
		Section: DefaultConfig(),
		Help: map[string]string{
			"api_url":         "OpenIM's REST API, http://HOST:10002 (target.url is the gateway, ws://HOST:10001)",
			"admin_user_id":   "the admin whose token the API secret gets (share.yml imAdminUserID)",
			"platforms":       "platform ids the devices of a user log in as, one per device",
			"max_connections": "most HTTP connections to the REST API",
			"max_frame":       "largest frame accepted from the gateway, in bytes",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	// The API secret (share.yml secret) gets the admin token, which
	// registers users and gets theirs.
	Secret:   probe.SecretRequired,
	SecretIs: "the API secret (share.yml secret), which gets the admin token",
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{URL: t.URL, Header: t.Header, Secret: t.Secret, Heartbeat: t.Heartbeat, Logger: t.Logger})
	},
}
