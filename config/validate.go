package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Protocols lists the values target.protocol accepts. The package that wires
// the protocol drivers appends each driver's name beside its entry in the
// driver map, before loading the configuration.
var Protocols = []string{"embedded"}

// ValidationError is a configuration value that was rejected: the key, the
// value as it was given and the reason.
type ValidationError struct {
	Key   string // dotted key, such as "population.users"
	Value any    // the rejected value, as given or as decoded
	Err   error  // the reason, such as "must be at least 1"
}

// Error formats the error as "key: value: reason", with string values quoted
// so that an empty or blank value is visible.
func (e *ValidationError) Error() string {
	v := fmt.Sprintf("%v", e.Value)
	if s, ok := e.Value.(string); ok {
		v = fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%s: %s: %v", e.Key, v, e.Err)
}

// Unwrap returns the reason.
func (e *ValidationError) Unwrap() error { return e.Err }

// Limits on values. The upper bounds are far above sensible settings: they
// exist so that a typo (an extra zero or three) is an error at startup
// rather than a daemon that exhausts its host or floods the target.
const (
	maxNameLen     = 64 // in characters: it is a label value on every series
	maxUsers       = 1_000_000
	maxRate        = 1000 // messages per second per user
	minHeartbeat   = 100 * time.Millisecond
	maxMessageSize = 64 << 10 // bytes
)

var prefixRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// Validate checks every value and every rule between values. It returns nil
// or an errors.Join of *ValidationError, one per problem, in key order of the
// Config struct.
func (c Config) Validate() error {
	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, p)
	}
	return errors.Join(errs...)
}

func (c Config) problems() []*ValidationError {
	var out []*ValidationError
	fail := func(key string, value any, format string, args ...any) {
		out = append(out, &ValidationError{Key: key, Value: value, Err: fmt.Errorf(format, args...)})
	}

	if c.HTTP.Listen == "" {
		fail("http.listen", c.HTTP.Listen, "must not be empty")
	} else if _, port, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		// *net.AddrError repeats the address; keep only its reason.
		if ae, ok := errors.AsType[*net.AddrError](err); ok {
			err = errors.New(ae.Err)
		}
		fail("http.listen", c.HTTP.Listen, "must be host:port: %w", err)
	} else if port == "" {
		fail("http.listen", c.HTTP.Listen, "must be host:port: missing port")
	}

	t := c.Target
	switch {
	case t.Name == "":
		fail("target.name", t.Name, "must not be empty")
	case !utf8.ValidString(t.Name):
		fail("target.name", t.Name, "must be valid UTF-8")
	case utf8.RuneCountInString(t.Name) > maxNameLen:
		fail("target.name", t.Name, "must be at most %d characters", maxNameLen)
	}
	if !slices.Contains(Protocols, t.Protocol) {
		fail("target.protocol", t.Protocol, "must be one of %s", quoteList(Protocols))
	}
	if t.URL != "" {
		if u, err := url.Parse(t.URL); err != nil {
			if ue, ok := errors.AsType[*url.Error](err); ok {
				err = ue.Err
			}
			fail("target.url", t.URL, "must be a ws:// or wss:// URL: %w", err)
		} else if u.Scheme != "ws" && u.Scheme != "wss" {
			fail("target.url", t.URL, "must be a ws:// or wss:// URL")
		} else if u.Host == "" {
			fail("target.url", t.URL, "must have a host")
		}
	}

	p := c.Population
	if p.Users < 1 {
		fail("population.users", p.Users, "must be at least 1")
	} else if p.Users > maxUsers {
		fail("population.users", p.Users, "must be at most %d", maxUsers)
	}
	if p.Ramp < 0 {
		fail("population.ramp", p.Ramp, "must not be negative")
	}
	if p.GroupSize < 2 {
		fail("population.group_size", p.GroupSize, "must be at least 2")
	}
	switch {
	case math.IsNaN(p.Rate):
		fail("population.rate", p.Rate, "must be a number")
	case p.Rate < 0:
		fail("population.rate", p.Rate, "must not be negative")
	case p.Rate > maxRate:
		fail("population.rate", p.Rate, "must be at most %d", maxRate)
	}
	if p.Heartbeat < minHeartbeat {
		fail("population.heartbeat", p.Heartbeat, "must be at least %v", minHeartbeat)
	}
	if p.Deadline <= 0 {
		fail("population.deadline", p.Deadline, "must be positive")
	}
	// Twice the deadline, because a message the server never acked is
	// known to be void only a deadline after it was sent, and receivers
	// must hear that before they write its gap off as lost.
	if p.Deadline > 0 && p.LostAfter < 2*p.Deadline {
		fail("population.lost_after", p.LostAfter, "must be at least twice population.deadline (%v)", 2*p.Deadline)
	}
	if !prefixRE.MatchString(p.Prefix) {
		fail("population.prefix", p.Prefix, "must match %s", prefixRE)
	}
	if p.MessageSize < 0 {
		fail("population.message_size", p.MessageSize, "must not be negative")
	} else if p.MessageSize > maxMessageSize {
		fail("population.message_size", p.MessageSize, "must be at most %d", maxMessageSize)
	}
	b := p.Backoff
	if b.Initial <= 0 {
		fail("population.backoff.initial", b.Initial, "must be positive")
	}
	if b.Max < b.Initial {
		fail("population.backoff.max", b.Max, "must be at least population.backoff.initial (%v)", b.Initial)
	}
	return out
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}
