package centrifugo

import (
	"errors"
	"fmt"
	"time"

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
		Validate: func(section any) []*config.ValidationError {
			c := section.(Config)
			var out []*config.ValidationError
			for _, ns := range [][2]string{{"group_namespace", c.GroupNamespace}, {"direct_namespace", c.DirectNamespace}} {
				if !namespaceRE.MatchString(ns[1]) {
					out = append(out, &config.ValidationError{Key: ns[0], Value: ns[1], Err: fmt.Errorf("must match %s", namespaceRE)})
				}
			}
			if c.TokenTTL < time.Minute {
				out = append(out, &config.ValidationError{Key: "token_ttl", Value: c.TokenTTL, Err: errors.New("must be at least 1m")})
			}
			return out
		},
	},
	Secret:   probe.SecretRequired,
	SecretIs: "the token HMAC secret (client.token.hmac_secret_key), which signs its connection tokens",
	New: func(t probe.Target) (probe.Driver, error) {
		c := t.Section.(Config)
		return New(Options{
			URL: t.URL, Header: t.Header, Secret: t.Secret, GroupNamespace: c.GroupNamespace, DirectNamespace: c.DirectNamespace,
			TokenTTL: c.TokenTTL, Heartbeat: t.Heartbeat,
		})
	},
}
