package xmpp

import (
	"fmt"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is xmpp's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "xmpp",
		Section: DefaultConfig(),
		Help: map[string]string{
			"domain":      "XMPP domain of the probe users",
			"muc_service": "MUC service of the group rooms (default conference.DOMAIN)",
			"register":    "create users by in-band registration (XEP-0077)",
			"resume":      "stream-management resumption (hides loss for minutes; off by default)",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	Secret: probe.SecretKept,
	New: func(t probe.Target) (probe.Driver, error) {
		if t.Secret == nil {
			return nil, fmt.Errorf("xmpp derives the users' passwords from the target secret: set target.secret_file or %s", config.SecretEnv)
		}
		return New(t.Section.(Config), Options{
			URL: t.URL, Header: t.Header, Heartbeat: t.Heartbeat,
			Password: func(user string) string { return Password(t.Secret, user) },
		})
	},
}
