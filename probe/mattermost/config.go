package mattermost

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Config is the target.mattermost section.
type Config struct {
	// EmailDomain is the domain of the e-mail address each user is
	// created with (USER@EMAIL_DOMAIN): Mattermost wants one, and never
	// mails it with notifications off.
	EmailDomain string `koanf:"email_domain"`
	// MaxSends bounds the POST /posts in flight, over every session.
	MaxSends int `koanf:"max_sends"`
	// SendRetries is how many times a post that got no answer, a 5xx or
	// a 429 is tried again with the same pending_post_id, which the
	// server answers with the post it already made (for 30 s).
	SendRetries int `koanf:"send_retries"`
	// MaxConnections bounds the HTTP connections of the REST calls
	// (sends, logins, catch-up), over every session.
	MaxConnections int `koanf:"max_connections"`
	// MaxBody bounds one REST answer read from the server.
	MaxBody int `koanf:"max_body"`
	// MaxFrame bounds one WebSocket frame read from the server.
	MaxFrame int `koanf:"max_frame"`
	// CatchupPosts bounds the posts one channel's catch-up fetches, in
	// pages of 200.
	CatchupPosts int `koanf:"catchup_posts"`
}

// DefaultConfig is the section's default.
func DefaultConfig() Config {
	return Config{
		EmailDomain: "imcanary.invalid", MaxSends: 256, SendRetries: 3,
		MaxConnections: 1024, MaxBody: 4 << 20, MaxFrame: 1 << 20, CatchupPosts: 1000,
	}
}

// username is what Mattermost allows in a username (model.IsValidUsername),
// at most 64 bytes.
var username = regexp.MustCompile(`^[a-z0-9.\-_]+$`)

var domain = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$`)

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
	var out []*config.ValidationError
	bad := func(key string, v any, err error) {
		out = append(out, &config.ValidationError{Key: key, Value: v, Err: err})
	}
	if !domain.MatchString(c.EmailDomain) || len(c.EmailDomain) > 128 {
		bad("email_domain", c.EmailDomain, errors.New("must be a domain name such as imcanary.invalid"))
	}
	if c.MaxSends < 1 || c.MaxSends > 65536 {
		bad("max_sends", c.MaxSends, errors.New("must be between 1 and 65536"))
	}
	if c.SendRetries < 0 || c.SendRetries > 10 {
		bad("send_retries", c.SendRetries, errors.New("must be between 0 and 10"))
	}
	if c.MaxConnections < 1 || c.MaxConnections > 1<<20 {
		bad("max_connections", c.MaxConnections, errors.New("must be between 1 and 1048576"))
	}
	if c.MaxBody < 64<<10 || c.MaxBody > 1<<30 {
		bad("max_body", c.MaxBody, fmt.Errorf("must be between %d and %d bytes", 64<<10, 1<<30))
	}
	if c.MaxFrame < 16<<10 || c.MaxFrame > 64<<20 {
		bad("max_frame", c.MaxFrame, fmt.Errorf("must be between %d and %d bytes", 16<<10, 64<<20))
	}
	if c.CatchupPosts < 1 || c.CatchupPosts > 100000 {
		bad("catchup_posts", c.CatchupPosts, errors.New("must be between 1 and 100000"))
	}
	return out
}

// requestTimeout bounds one REST call.
const requestTimeout = 30 * time.Second
