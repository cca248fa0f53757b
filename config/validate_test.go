package config

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"listen empty", func(c *Config) { c.HTTP.Listen = "" }, `http.listen: "": must not be empty`},
		{"listen no port", func(c *Config) { c.HTTP.Listen = "localhost" }, `http.listen: "localhost": must be host:port: missing port in address`},
		{"listen empty port", func(c *Config) { c.HTTP.Listen = "localhost:" }, `http.listen: "localhost:": must be host:port: missing port`},
		{"listen all interfaces", func(c *Config) { c.HTTP.Listen = ":9464" }, ""},
		{"listen ipv6", func(c *Config) { c.HTTP.Listen = "[::1]:9464" }, ""},
		{"name empty", func(c *Config) { c.Target.Name = "" }, `target.name: "": must not be empty`},
		{"name bad utf-8", func(c *Config) { c.Target.Name = "a\xffb" }, `target.name: "a\xffb": must be valid UTF-8`},
		{"name 64 characters", func(c *Config) { c.Target.Name = strings.Repeat("é", 64) }, ""},
		{"name 65 characters", func(c *Config) { c.Target.Name = strings.Repeat("a", 65) }, `target.name: "` + strings.Repeat("a", 65) + `": must be at most 64 characters`},
		{"name any text", func(c *Config) { c.Target.Name = "Prod EU / 1" }, ""},
		{"protocol unknown", func(c *Config) { c.Target.Protocol = "xmpp" }, `target.protocol: "xmpp": must be one of "embedded"`},
		{"protocol empty", func(c *Config) { c.Target.Protocol = "" }, `target.protocol: "": must be one of "embedded"`},
		{"url ws", func(c *Config) { c.Target.URL = "ws://127.0.0.1:8080/ws" }, ""},
		{"url wss", func(c *Config) { c.Target.URL = "wss://im.example/ws" }, ""},
		{"url http", func(c *Config) { c.Target.URL = "http://im.example/ws" }, `target.url: "http://im.example/ws": must be a ws:// or wss:// URL`},
		{"url no scheme", func(c *Config) { c.Target.URL = "im.example:80" }, `target.url: "im.example:80": must be a ws:// or wss:// URL`},
		{"url unparsable", func(c *Config) { c.Target.URL = "ws://im.example:port/" }, `target.url: "ws://im.example:port/": must be a ws:// or wss:// URL: invalid port ":port" after host`},
		{"url no host", func(c *Config) { c.Target.URL = "ws:///ws" }, `target.url: "ws:///ws": must have a host`},
		{"users 0", func(c *Config) { c.Population.Users = 0 }, `population.users: 0: must be at least 1`},
		{"users max", func(c *Config) { c.Population.Users = 1_000_000 }, ""},
		{"users over max", func(c *Config) { c.Population.Users = 1_000_001 }, `population.users: 1000001: must be at most 1000000`},
		{"ramp 0", func(c *Config) { c.Population.Ramp = 0 }, ""},
		{"ramp negative", func(c *Config) { c.Population.Ramp = -time.Second }, `population.ramp: -1s: must not be negative`},
		{"group size 1", func(c *Config) { c.Population.GroupSize = 1 }, `population.group_size: 1: must be at least 2`},
		{"rate 0", func(c *Config) { c.Population.Rate = 0 }, ""},
		{"rate negative", func(c *Config) { c.Population.Rate = -0.5 }, `population.rate: -0.5: must not be negative`},
		{"rate over max", func(c *Config) { c.Population.Rate = 1000.5 }, `population.rate: 1000.5: must be at most 1000`},
		{"rate infinite", func(c *Config) { c.Population.Rate = math.Inf(1) }, `population.rate: +Inf: must be at most 1000`},
		{"rate NaN", func(c *Config) { c.Population.Rate = math.NaN() }, `population.rate: NaN: must be a number`},
		{"heartbeat min", func(c *Config) { c.Population.Heartbeat = 100 * time.Millisecond }, ""},
		{"heartbeat under min", func(c *Config) { c.Population.Heartbeat = 99 * time.Millisecond }, `population.heartbeat: 99ms: must be at least 100ms`},
		{"deadline 0", func(c *Config) { c.Population.Deadline, c.Population.LostAfter = 0, 0 }, `population.deadline: 0s: must be positive`},
		{"lost after twice the deadline", func(c *Config) { c.Population.LostAfter = 2 * c.Population.Deadline }, ""},
		{"lost after under twice the deadline", func(c *Config) { c.Population.LostAfter = 19 * time.Second }, `population.lost_after: 19s: must be at least twice population.deadline (20s)`},
		{"prefix bad", func(c *Config) { c.Population.Prefix = "Bad_Prefix" }, `population.prefix: "Bad_Prefix": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"prefix leading dash", func(c *Config) { c.Population.Prefix = "-x" }, `population.prefix: "-x": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"prefix 32", func(c *Config) { c.Population.Prefix = strings.Repeat("a", 32) }, ""},
		{"prefix 33", func(c *Config) { c.Population.Prefix = strings.Repeat("a", 33) }, `population.prefix: "` + strings.Repeat("a", 33) + `": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"message size max", func(c *Config) { c.Population.MessageSize = 65536 }, ""},
		{"message size over max", func(c *Config) { c.Population.MessageSize = 65537 }, `population.message_size: 65537: must be at most 65536`},
		{"message size negative", func(c *Config) { c.Population.MessageSize = -1 }, `population.message_size: -1: must not be negative`},
		{"backoff initial 0", func(c *Config) { c.Population.Backoff.Initial = 0 }, `population.backoff.initial: 0s: must be positive`},
		{"backoff max equal", func(c *Config) { c.Population.Backoff.Max = c.Population.Backoff.Initial }, ""},
		{"backoff max under initial", func(c *Config) { c.Population.Backoff.Max = time.Millisecond }, `population.backoff.max: 1ms: must be at least population.backoff.initial (500ms)`},
		{
			"all problems reported",
			func(c *Config) { c.Population.Users, c.Population.GroupSize = 0, 0 },
			"population.users: 0: must be at least 1\npopulation.group_size: 0: must be at least 2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.change(&c)
			err := c.Validate()
			var got string
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate(%q) = %v, want %v", tt.name, got, tt.want)
			}
			if err == nil {
				return
			}
			if _, ok := errors.AsType[*ValidationError](err); !ok {
				t.Errorf("Validate(%q) = %T, want it to hold a *ValidationError", tt.name, err)
			}
		})
	}
}

// TestProtocolsExtensible checks that a protocol appended by later work is
// accepted without touching Validate.
func TestProtocolsExtensible(t *testing.T) {
	saved := Protocols
	t.Cleanup(func() { Protocols = saved })
	Protocols = append(Protocols[:len(Protocols):len(Protocols)], "xmpp")

	c := Default()
	c.Target.Protocol = "xmpp"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(%q) = %v, want nil", c.Target.Protocol, err)
	}
}
