// Package config holds imcanary's typed configuration: its defaults, how it is
// loaded (YAML file, then IMCANARY_* environment, then flags) and how it is
// validated. Every error names the key and the value that are wrong.
package config

import "time"

// Config is the whole configuration of one imcanary daemon.
type Config struct {
	HTTP       HTTP       `koanf:"http"`
	Target     Target     `koanf:"target"`
	Population Population `koanf:"population"`
}

// HTTP configures the daemon's own HTTP server (/metrics, /healthz, /readyz).
type HTTP struct {
	// Listen is the address of the HTTP server.
	Listen string `koanf:"listen"`
}

// Target names the IM server under test and how to reach it.
type Target struct {
	// Name is the value of the target label on every series.
	Name string `koanf:"name"`
	// Protocol selects the driver: "embedded" (the reference target's own
	// protocol); later issues add xmpp and centrifugo.
	Protocol string `koanf:"protocol"`
	// URL is the WebSocket URL. Empty with protocol "embedded" means: start
	// an embedded target in this process on a free loopback port.
	URL string `koanf:"url"`
	// SecretFile holds the secret that signs login tokens. The environment
	// variable IMCANARY_TARGET_SECRET is used when it is empty. The secret
	// itself never appears in the configuration tree, logs or metrics.
	SecretFile string `koanf:"secret_file"`
}

// Population is the background population of simulated users.
type Population struct {
	// Users is how many users are kept online.
	Users int `koanf:"users"`
	// Ramp spreads the users' first logins evenly over this duration.
	Ramp time.Duration `koanf:"ramp"`
	// GroupSize is the size of each chat group; users are grouped in order.
	GroupSize int `koanf:"group_size"`
	// Rate is messages per second per user, alternating direct and group.
	Rate float64 `koanf:"rate"`
	// Heartbeat is the interval between keepalive pings of each session.
	Heartbeat time.Duration `koanf:"heartbeat"`
	// Deadline is the delivery deadline measured from the intended send
	// time: a delivery after it is late. It is also the ack timeout.
	Deadline time.Duration `koanf:"deadline"`
	// LostAfter is how long after its intended send time a missing message
	// is declared lost. It must be at least twice Deadline: a message that
	// arrives between the two is late, not lost, and a message the server
	// never acknowledged is known as such only a Deadline after its send.
	LostAfter time.Duration `koanf:"lost_after"`
	// Prefix starts every user and group name, so that provisioning is
	// idempotent across restarts and never collides with other data.
	Prefix string `koanf:"prefix"`
	// MessageSize pads probe message bodies to at least this many bytes.
	MessageSize int `koanf:"message_size"`
	// Backoff bounds the reconnect delay (exponential with full jitter).
	Backoff Backoff `koanf:"backoff"`
}

// Backoff is a capped exponential backoff with full jitter.
type Backoff struct {
	// Initial is the cap of the first retry's delay.
	Initial time.Duration `koanf:"initial"`
	// Max is the cap of every retry's delay.
	Max time.Duration `koanf:"max"`
}

// Default returns the configuration used for every key a source leaves unset.
func Default() Config {
	return Config{
		HTTP: HTTP{Listen: "127.0.0.1:9464"},
		Target: Target{
			Name:     "embedded",
			Protocol: "embedded",
		},
		Population: Population{
			Users:       100,
			Ramp:        10 * time.Second,
			GroupSize:   5,
			Rate:        0.5,
			Heartbeat:   30 * time.Second,
			Deadline:    10 * time.Second,
			LostAfter:   30 * time.Second,
			Prefix:      "imcanary",
			MessageSize: 0,
			Backoff:     Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second},
		},
	}
}
