package xmpp

import (
	"errors"
	"fmt"
	"strings"

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
		Validate: func(section any) []*config.ValidationError {
			c := section.(Config)
			var out []*config.ValidationError
			if c.Domain == "" || strings.ContainsAny(c.Domain, "@/ ") {
				out = append(out, &config.ValidationError{Key: "domain", Value: c.Domain, Err: errors.New("must be a domain name")})
			}
			if strings.ContainsAny(c.MUCService, "@/ ") {
				out = append(out, &config.ValidationError{Key: "muc_service", Value: c.MUCService, Err: errors.New("must be a domain name")})
			}
			return out
		},
	},
	Secret: probe.SecretKept,
	New: func(t probe.Target) (probe.Driver, error) {
		if t.Secret == nil {
			return nil, fmt.Errorf("xmpp derives the users' passwords from the target secret: set target.secret_file or %s", config.SecretEnv)
		}
		c := t.Section.(Config)
		return New(Options{
			URL: t.URL, Header: t.Header, Domain: c.Domain, MUCService: c.MUCService, Register: c.Register, Resume: c.Resume,
			Heartbeat: t.Heartbeat,
			Password:  func(user string) string { return Password(t.Secret, user) },
		})
	},
}
