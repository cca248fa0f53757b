package config

import (
	"fmt"
	"time"
)

// The adapters import this package, so its tests load with protocols of
// their own: the reference protocol, which runs in-process and keeps an
// old name, and "chat", which has a section of its own with defaults, help
// and rules, as an adapter's would.

// chatSection is the chat protocol's section, target.chat.
type chatSection struct {
	Domain   string        `koanf:"domain"`
	Register bool          `koanf:"register"`
	Resume   bool          `koanf:"resume"`
	TokenTTL time.Duration `koanf:"token_ttl"`
}

var chatProtocol = Protocol{
	Name:    "chat",
	Section: chatSection{Domain: "localhost", Register: true, TokenTTL: 24 * time.Hour},
	Help: map[string]string{
		"domain":    "domain of the probe users",
		"register":  "create users by registration",
		"resume":    "resume sessions (off by default)",
		"token_ttl": "lifetime of the tokens",
	},
	Validate: func(s any) []*ValidationError {
		c := s.(chatSection)
		var out []*ValidationError
		if c.Domain == "" {
			out = append(out, &ValidationError{Key: "domain", Value: c.Domain, Err: fmt.Errorf("must be a domain name")})
		}
		if c.TokenTTL < time.Minute {
			out = append(out, &ValidationError{Key: "token_ttl", Value: c.TokenTTL, Err: fmt.Errorf("must be at least 1m")})
		}
		return out
	},
}

var testLoader = NewLoader(
	Protocol{Name: "reference", Aliases: []string{"embedded"}, InProcess: true},
	chatProtocol,
)
