package matrix

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is matrix's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "matrix",
		Schemes: []string{"http", "https"},
		Section: DefaultConfig(),
		Help: map[string]string{
			"server_name":     "homeserver name: the part of user ids after the colon",
			"alias_prefix":    "start of the local part of every room alias imcanary creates",
			"poll_timeout":    "how long the server may hold each /sync open",
			"timeline_limit":  "most events per room in one /sync answer; past it the timeline is limited",
			"catchup_pages":   "most /messages pages (100 events each) one limited room is filled with",
			"max_sends":       "most send requests in flight, over every session",
			"send_retries":    "retries of a send that got no answer (same transaction id)",
			"max_connections": "most HTTP connections to the server, polls and sends together",
			"max_body":        "largest response accepted from the server, in bytes",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	// The registration shared secret: users are registered with it, and
	// their passwords derived from it.
	Secret:   probe.SecretRequired,
	SecretIs: "the registration shared secret (registration_shared_secret), which registers the users",
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{URL: t.URL, Header: t.Header, Secret: t.Secret, Logger: t.Logger})
	},
}
