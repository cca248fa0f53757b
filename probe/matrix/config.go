package matrix

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Config is the matrix section of the configuration, target.matrix.
type Config struct {
	// ServerName is the homeserver's name, the part of a user id after
	// the colon (@alice:SERVER_NAME).
	ServerName string `koanf:"server_name"`
	// AliasPrefix starts the local part of every room alias imcanary
	// creates (#PREFIX_g_GROUP, #PREFIX_d_A_B): the alias is how
	// provisioning finds a room again after a restart.
	AliasPrefix string `koanf:"alias_prefix"`
	// PollTimeout is how long the server may hold each /sync open when it
	// has nothing new (the timeout parameter).
	PollTimeout time.Duration `koanf:"poll_timeout"`
	// TimelineLimit is the most events a /sync answer carries per room;
	// past it the server says the timeline is limited, and the events it
	// skipped are fetched with /messages when catch-up is on.
	TimelineLimit int `koanf:"timeline_limit"`
	// CatchupPages bounds the /messages pages one limited room is filled
	// with, of 100 events each, looking for the device's last event (and
	// one more to take the few just past it, see pastMark).
	CatchupPages int `koanf:"catchup_pages"`
	// MaxSends bounds the send requests in flight, over every session.
	MaxSends int `koanf:"max_sends"`
	// SendRetries is how many times a send that got no answer, or a 5xx
	// or 429, is tried again with the same transaction id, which the
	// server answers with the event it already made.
	SendRetries int `koanf:"send_retries"`
	// MaxConnections bounds the HTTP connections to the server: the
	// sessions' polls and the sends in flight together.
	MaxConnections int `koanf:"max_connections"`
	// MaxBody bounds one response read from the server.
	MaxBody int `koanf:"max_body"`
}

// DefaultConfig is the section's default.
func DefaultConfig() Config {
	return Config{
		ServerName: "localhost", AliasPrefix: "imc", PollTimeout: 30 * time.Second,
		TimelineLimit: 50, CatchupPages: 20, MaxSends: 256, SendRetries: 3,
		MaxConnections: 4096, MaxBody: 4 << 20,
	}
}

// localPart is what Matrix allows in a user id's local part (the
// historical grammar is wider; new users must keep to this).
var localPart = regexp.MustCompile(`^[a-z0-9._=/+-]+$`)

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
	var out []*config.ValidationError
	bad := func(key string, v any, err error) {
		out = append(out, &config.ValidationError{Key: key, Value: v, Err: err})
	}
	if c.ServerName == "" || len(c.ServerName) > 255 {
		bad("server_name", c.ServerName, errors.New("must be the homeserver's name, 1 to 255 bytes"))
	}
	if !localPart.MatchString(c.AliasPrefix) || len(c.AliasPrefix) > 32 {
		bad("alias_prefix", c.AliasPrefix, errors.New("must be 1 to 32 of a-z 0-9 . _ = / + -"))
	}
	if c.PollTimeout < 0 || c.PollTimeout > 5*time.Minute {
		bad("poll_timeout", c.PollTimeout, errors.New("must be between 0 and 5m"))
	}
	if c.TimelineLimit < 1 || c.TimelineLimit > 1000 {
		bad("timeline_limit", c.TimelineLimit, errors.New("must be between 1 and 1000"))
	}
	if c.CatchupPages < 1 || c.CatchupPages > 1000 {
		bad("catchup_pages", c.CatchupPages, errors.New("must be between 1 and 1000"))
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
	return out
}
