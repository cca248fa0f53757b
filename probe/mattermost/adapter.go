package mattermost

import (
	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

// Adapter is mattermost's entry in the registry of protocols.
var Adapter = probe.Adapter{
	Config: config.Protocol{
		Name:    "mattermost",
		Schemes: []string{"http", "https"},
		Section: DefaultConfig(),
		Help: map[string]string{
			"email_domain":    "domain of the e-mail address each user is created with",
			"max_sends":       "most POST /posts in flight, over every session",
			"send_retries":    "retries of a post that got no answer (same pending_post_id)",
			"max_connections": "most HTTP connections of the REST calls, over every session",
			"max_body":        "largest REST answer accepted from the server, in bytes",
			"max_frame":       "largest WebSocket frame accepted from the server, in bytes",
			"catchup_posts":   "most posts one channel's catch-up fetches",
		},
		Validate: func(section any) []*config.ValidationError { return section.(Config).Validate() },
	},
	// Users sign up on an open server with passwords derived from the
	// target secret, made and kept in data_dir when none is configured,
	// so that a restart logs the same users in again.
	Secret: probe.SecretKept,
	New: func(t probe.Target) (probe.Driver, error) {
		return New(t.Section.(Config), Options{URL: t.URL, Header: t.Header, Secret: t.Secret, Heartbeat: t.Heartbeat, Logger: t.Logger})
	},
}
