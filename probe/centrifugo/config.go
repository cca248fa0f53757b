package centrifugo

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Config is the centrifugo section of the configuration, target.centrifugo.
type Config struct {
	// GroupNamespace is the channel namespace of group chats.
	GroupNamespace string `koanf:"group_namespace"`
	// DirectNamespace is the namespace of the user-limited direct channels.
	DirectNamespace string `koanf:"direct_namespace"`
	// TokenTTL is the lifetime of the connection JWTs imcanary signs.
	TokenTTL time.Duration `koanf:"token_ttl"`
	// Recovery on resubscribe and history fetches are target.catch_up's,
	// as for every protocol whose server keeps history.
}

// DefaultConfig is the section's default.
func DefaultConfig() Config {
	return Config{GroupNamespace: "chat", DirectNamespace: "dm", TokenTTL: 24 * time.Hour}
}

// namespaceRE is what a Centrifugo namespace may be named.
var namespaceRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
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
}
