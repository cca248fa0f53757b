package mqtt

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/imcanary/imcanary/config"
)

// Config is the mqtt section of the configuration, target.mqtt.
type Config struct {
	// Version is the MQTT version spoken: "3.1.1" or "5".
	Version string `koanf:"version"`
	// SessionExpiry is how long an MQTT 5 broker keeps a device's
	// session, and queues for it, after its connection ends (catch-up
	// on). MQTT 3.1.1 has no such field: the broker's own setting rules
	// (mosquitto's persistent_client_expiration).
	SessionExpiry time.Duration `koanf:"session_expiry"`
	// TopicPrefix roots every topic imcanary publishes and subscribes to
	// (the topic scheme is in the package comment).
	TopicPrefix string `koanf:"topic_prefix"`
	// QoS is the quality of service of every publish and subscription:
	// 1 (PUBACK acknowledges each message) or 0 (no acknowledgement: a
	// message counts as accepted once written to the socket).
	QoS int `koanf:"qos"`
	// ClientIDPrefix starts every client identifier; the rest is the
	// user and the device, so that each device of each user has the one
	// a persistent session is found by.
	ClientIDPrefix string `koanf:"client_id_prefix"`
	// Username is sent in CONNECT when set. The password, if the broker
	// wants one, is the target secret (target.secret_file).
	Username string `koanf:"username"`
	// MaxPacket bounds one MQTT packet read from the broker.
	MaxPacket int `koanf:"max_packet"`
}

// DefaultConfig is the section's default.
func DefaultConfig() Config {
	return Config{Version: "3.1.1", SessionExpiry: time.Hour, TopicPrefix: "imcanary", QoS: 1, ClientIDPrefix: "imc-", MaxPacket: 1 << 20}
}

// Validate returns what is wrong with the section, naming each key.
func (c Config) Validate() []*config.ValidationError {
	var out []*config.ValidationError
	bad := func(key string, v any, err error) {
		out = append(out, &config.ValidationError{Key: key, Value: v, Err: err})
	}
	if c.Version != "3.1.1" && c.Version != "5" {
		bad("version", c.Version, errors.New(`must be "3.1.1" or "5"`))
	}
	if c.SessionExpiry < time.Second || c.SessionExpiry > time.Duration(1<<32-1)*time.Second {
		bad("session_expiry", c.SessionExpiry, errors.New("must be between 1s and 2^32-1 seconds"))
	}
	if err := topicLevels(c.TopicPrefix); err != nil {
		bad("topic_prefix", c.TopicPrefix, err)
	}
	if c.QoS != 0 && c.QoS != 1 {
		bad("qos", c.QoS, errors.New("must be 0 or 1"))
	}
	if strings.ContainsAny(c.ClientIDPrefix, "\x00") || len(c.ClientIDPrefix) > 64 {
		bad("client_id_prefix", c.ClientIDPrefix, errors.New("must be at most 64 bytes, without NUL"))
	}
	if c.MaxPacket < 1<<10 || c.MaxPacket > maxRemaining {
		bad("max_packet", c.MaxPacket, fmt.Errorf("must be between 1024 and %d bytes", maxRemaining))
	}
	return out
}

// passwordFits refuses a password without a user name in MQTT 3.1.1,
// which forbids it (§3.1.2.9): mosquitto closes every such CONNECT
// ("password without username"), so that each login would fail as a
// protocol error of the broker's.
func passwordFits(c Config, password bool) error {
	if password && c.Username == "" && c.Version == "3.1.1" {
		return errors.New(`target.mqtt.username: empty while a target secret is set: MQTT 3.1.1 sends a password only with a user name (§3.1.2.9), and brokers close such a CONNECT; set target.mqtt.username, or unset the secret (target.secret_file, ` + config.SecretEnv + `)`)
	}
	return nil
}

// topicLevels checks that s can be a part of a topic name: not empty, no
// wildcard, no NUL, no empty level.
func topicLevels(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case strings.ContainsAny(s, "+#\x00"):
		return errors.New("must not contain '+', '#' or NUL")
	case strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/") || strings.Contains(s, "//"):
		return errors.New("must not have an empty topic level")
	case strings.HasPrefix(s, "$"):
		return errors.New("must not start with '$' (the broker's own topics)")
	}
	return nil
}
