package centrifugo

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is centrifugo's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "centrifugo",
		Section: DefaultConfig(),
		Help: map[string]string{
			"group_namespace":  "channel namespace of group chats",
			"direct_namespace": "namespace of user-limited direct channels",
			"token_ttl":        "lifetime of the connection tokens imcanary signs",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	Secret:   probe.SecretRequired,
	SecretIs: "the token HMAC secret (client.token.hmac_secret_key), which signs its connection tokens",
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{URL: t.URL, Header: t.Header, Secret: t.Secret, Heartbeat: t.Heartbeat})
	},
}
