package probe

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Adapter is one IM protocol as the daemon's registry lists it: what the
// configuration knows of it (its name and its own section of keys), what
// it needs of the target secret, and how its driver is made. Each adapter
// package provides its own; adding a protocol is that package and one line
// in the registry.
type Adapter struct {
	Config config.Protocol
	Secret SecretNeed
	// SecretOf, if set, says what the protocol needs of the secret for
	// its section, in Secret's place: a mapped protocol needs it to sign
	// tokens, to derive passwords, or not at all.
	SecretOf func(section any) SecretNeed
	// SecretIs says what the target secret is to the protocol, for the
	// error that asks for one: "the token secret, which signs its
	// connection tokens".
	SecretIs string
	// SecretFits, if set, says what is wrong with using the target secret
	// (secret: one is configured) with the section: a combination the
	// server can only refuse, such as an MQTT 3.1.1 password without a
	// user name. Config check and run refuse it before anything dials.
	SecretFits func(section any, secret bool) error
	// New makes the driver for the target t.
	New func(t Target) (Driver, error)
}

// SecretNeed returns what the protocol needs of the target secret for the
// configured section.
func (a Adapter) SecretNeed(section any) SecretNeed {
	if a.SecretOf != nil {
		return a.SecretOf(section)
	}
	return a.Secret
}

// SecretNeed is what a protocol needs of the target secret
// (target.secret_file, or the environment).
type SecretNeed int

const (
	// SecretOptional: the driver signs its logins with the secret when
	// there is one (the reference server accepts any token without).
	SecretOptional SecretNeed = iota
	// SecretRequired: the driver cannot log in without it.
	SecretRequired
	// SecretKept: the driver derives the users' passwords from it; with
	// none configured, one is made and kept in data_dir, so that users
	// registered today can still log in after a restart.
	SecretKept
)

// Target is the server under test as a driver is made for it.
type Target struct {
	// URL is its WebSocket endpoint.
	URL string
	// Header goes with every request to it: imcanary's User-Agent and
	// the configured target.headers.
	Header http.Header
	// Secret signs the logins, nil when there is none.
	Secret []byte
	// Heartbeat is each session's keepalive interval.
	Heartbeat time.Duration
	// Section is the protocol's own section of the configuration, of the
	// type of its Adapter.Config.Section.
	Section any
	// DataDir is data_dir: where a driver keeps what it learnt of the
	// server (ids it assigned) across restarts.
	DataDir string
	// Logger is the process's logger.
	Logger *slog.Logger
}
