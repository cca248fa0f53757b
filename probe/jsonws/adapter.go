package jsonws

import (
	"errors"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is the jsonws protocol's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "jsonws",
		Section: DefaultConfig(),
		Help:    help,
		// The section of a configuration that uses another protocol
		// is checked too, as every protocol's is: a mapping kept in a
		// file is wrong whichever protocol the file picks today.
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
		Required: func(section any, t config.Target) error {
			c := section.(Config)
			if c.Empty() {
				return errNoMapping
			}
			if t.CatchUp != config.CatchUpOff && c.Delivery.Seq != "" && c.CatchUp.Fetch == "" {
				// Gaps would be found and never fetched: each would
				// count lost, as with catch-up off, while the
				// configuration says it is on.
				return errors.New("target.catch_up is on and delivery.seq numbers the conversations, but catch_up.fetch is not set: a gap could never be fetched. Set catch_up.fetch (and catch_up.done), or target.catch_up: off")
			}
			return nil
		},
	},
	SecretIs: "the key that signs the tokens of target.jsonws.token (jwt, hmac)",
	SecretOf: func(section any) probe.SecretNeed {
		c := section.(Config)
		switch {
		case c.Token.Source == "jwt" || c.Token.Source == "hmac":
			// The server checks what the secret signs.
			return probe.SecretRequired
		case usesPassword(c):
			// The passwords are imcanary's own: kept in data_dir
			// when no secret is configured.
			return probe.SecretKept
		}
		return probe.SecretOptional
	},
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{
			URL: t.URL, Header: t.Header, Secret: t.Secret, Heartbeat: t.Heartbeat,
			DataDir: t.DataDir, Logger: t.Logger,
		})
	},
}

// usesPassword reports whether a template of c uses {{.Password}}.
func usesPassword(c Config) bool {
	if c.Empty() {
		return false
	}
	m, errs := compile(c)
	return len(errs) == 0 && m.password
}
