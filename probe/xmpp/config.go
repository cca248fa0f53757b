package xmpp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
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

// Password is user's password for the target secret: the lowercase hex
// HMAC-SHA256 of the user name, the same derivation as the reference
// server's login tokens, so that users registered by earlier versions
// still log in.
func Password(secret []byte, user string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(user))
	return hex.EncodeToString(m.Sum(nil))
}
