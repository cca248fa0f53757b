package xmpp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/imcanary/imcanary/config"
)

// Config is the xmpp section of the configuration, target.xmpp. Each probe
// user's password is derived from the target secret (see Password), so one
// secret, from a file or the environment, provisions and logs in every user
// and no password is ever written down.
type Config struct {
	// Domain is the XMPP domain of the probe users (user@Domain).
	Domain string `koanf:"domain"`
	// MUCService hosts the group rooms; empty means conference.Domain.
	MUCService string `koanf:"muc_service"`
	// Register creates the users by in-band registration (XEP-0077); off,
	// they must exist already with their derived passwords.
	Register bool `koanf:"register"`
	// Resume turns on stream-management resumption. Off by default: a
	// server that hibernates a dropped session queues its messages for
	// minutes, and loss then shows up minutes late.
	Resume bool `koanf:"resume"`
}

// DefaultConfig is the section's default.
func DefaultConfig() Config { return Config{Domain: "localhost", Register: true} }

// Password is user's password for the target secret: the lowercase hex
// HMAC-SHA256 of the user name, the same derivation as the reference
// server's login tokens, so that users registered by earlier versions
// still log in.
func Password(secret []byte, user string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(user))
	return hex.EncodeToString(m.Sum(nil))
}

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
	var out []*config.ValidationError
	if c.Domain == "" || strings.ContainsAny(c.Domain, "@/ ") {
		out = append(out, &config.ValidationError{Key: "domain", Value: c.Domain, Err: errors.New("must be a domain name")})
	}
	if strings.ContainsAny(c.MUCService, "@/ ") {
		out = append(out, &config.ValidationError{Key: "muc_service", Value: c.MUCService, Err: errors.New("must be a domain name")})
	}
	return out
}
