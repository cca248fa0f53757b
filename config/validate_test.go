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
		{"protocol unknown", func(c *Config) { c.Target.Protocol = "irc" }, `target.protocol: "irc": must be one of ` + quoteList(testLoader.Protocols())},
		{"protocol empty", func(c *Config) { c.Target.Protocol = "" }, `target.protocol: "": must be one of ` + quoteList(testLoader.Protocols())},
		{"protocol misspelt", func(c *Config) { c.Target.Protocol = "referenc" }, `target.protocol: "referenc": did you mean "reference"? It must be one of ` + quoteList(testLoader.Protocols())},
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
		{"section value bad", func(c *Config) { setChat(c, func(s *chatSection) { s.Domain = "" }) }, `target.chat.domain: "": must be a domain name`},
		{"section duration short", func(c *Config) { setChat(c, func(s *chatSection) { s.TokenTTL = time.Second }) }, `target.chat.token_ttl: 1s: must be at least 1m`},
		{"section of no protocol in use", func(c *Config) { c.Target.Sections = nil }, ""},
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
		{"max connect rate 1", func(c *Config) { c.Population.MaxConnectRate = 1 }, ""},
		{"max connect rate fraction", func(c *Config) { c.Population.MaxConnectRate = 0.5 }, ""},
		{"max connect rate max", func(c *Config) { c.Population.MaxConnectRate = 1_000_000 }, ""},
		{"max connect rate 0", func(c *Config) { c.Population.MaxConnectRate = 0 }, `population.max_connect_rate: 0: must be positive`},
		{"max connect rate negative", func(c *Config) { c.Population.MaxConnectRate = -5 }, `population.max_connect_rate: -5: must be positive`},
		{"max connect rate over max", func(c *Config) { c.Population.MaxConnectRate = 1_000_001 }, `population.max_connect_rate: 1.000001e+06: must be at most 1000000`},
		{"max connect rate infinite", func(c *Config) { c.Population.MaxConnectRate = math.Inf(1) }, `population.max_connect_rate: +Inf: must be at most 1000000`},
		{"max connect rate NaN", func(c *Config) { c.Population.MaxConnectRate = math.NaN() }, `population.max_connect_rate: NaN: must be a number`},
		{"source addrs range", func(c *Config) { c.Population.SourceAddrs = "127.0.0.1-127.0.0.16" }, ""},
		{"source addrs mixed", func(c *Config) { c.Population.SourceAddrs = "127.0.0.2, 127.0.0.5-127.0.0.9,::1" }, ""},
		{"source addrs bad entry", func(c *Config) { c.Population.SourceAddrs = "127.0.0.2,127.0.0.x" }, `population.source_addrs: "127.0.0.2,127.0.0.x": entry "127.0.0.x" is not an IP address`},
		{"source addrs range too long", func(c *Config) { c.Population.SourceAddrs = "127.0.0.1-127.0.1.1" }, `population.source_addrs: "127.0.0.1-127.0.1.1": entry "127.0.0.1-127.0.1.1" spans 257 addresses; a range may span at most 256`},
		{"data dir empty", func(c *Config) { c.DataDir = "" }, `data_dir: "": must not be empty`},
		{"data dir relative", func(c *Config) { c.DataDir = "data" }, ""},
		{"history max runs 1", func(c *Config) { c.History.MaxRuns = 1 }, ""},
		{"history max runs 0", func(c *Config) { c.History.MaxRuns = 0 }, `history.max_runs: 0: must be at least 1`},
		{"history max age 1ns", func(c *Config) { c.History.MaxAge = 1 }, ""},
		{"history max age 0", func(c *Config) { c.History.MaxAge = 0 }, `history.max_age: 0s: must be positive`},
		{"history max age negative", func(c *Config) { c.History.MaxAge = -time.Hour }, `history.max_age: -1h0m0s: must be positive`},
		{"history max canary rounds 1", func(c *Config) { c.History.MaxCanaryRounds = 1 }, ""},
		{"history max canary rounds 0", func(c *Config) { c.History.MaxCanaryRounds = 0 }, `history.max_canary_rounds: 0: must be at least 1`},
		{"canary schedule disabled", func(c *Config) { c.Canary.Schedule = "" }, ""},
		{"canary schedule five fields", func(c *Config) { c.Canary.Schedule = "*/5 * * * *" }, ""},
		{"canary schedule hourly", func(c *Config) { c.Canary.Schedule = "@hourly" }, ""},
		{"canary schedule time zone", func(c *Config) { c.Canary.Schedule = "CRON_TZ=UTC 0 3 * * *" }, ""},
		{"canary schedule seconds field", func(c *Config) { c.Canary.Schedule = "0 */5 * * * *" }, `canary.schedule: "0 */5 * * * *": must be a cron schedule or empty: expected exactly 5 fields, found 6: [0 */5 * * * *]`},
		{"canary schedule blank", func(c *Config) { c.Canary.Schedule = " " }, `canary.schedule: " ": must be a cron schedule or empty: expected exactly 5 fields, found 0: []`},
		{"canary schedule out of range", func(c *Config) { c.Canary.Schedule = "60 * * * *" }, `canary.schedule: "60 * * * *": must be a cron schedule or empty: end of range (60) above maximum (59): 60`},
		{"canary schedule unknown descriptor", func(c *Config) { c.Canary.Schedule = "@often" }, `canary.schedule: "@often": must be a cron schedule or empty: unrecognized descriptor: @often`},
		{"canary schedule bad every", func(c *Config) { c.Canary.Schedule = "@every 30" }, `canary.schedule: "@every 30": must be a cron schedule or empty: failed to parse duration @every 30: time: missing unit in duration "30"`},
		// cron v3.0.1 itself panics on this one.
		{"canary schedule bare time zone", func(c *Config) { c.Canary.Schedule = "TZ=UTC" }, `canary.schedule: "TZ=UTC": must be a cron schedule or empty: time zone prefix must be followed by a space and the schedule`},
		{"canary schedule time zone and tab", func(c *Config) { c.Canary.Schedule = "TZ=UTC\t0 3 * * *" }, "canary.schedule: \"TZ=UTC\\t0 3 * * *\": must be a cron schedule or empty: provided bad location UTC\t0: unknown time zone UTC\t0"},
		{"canary schedule time zone and tab only", func(c *Config) { c.Canary.Schedule = "TZ=UTC\t@daily" }, `canary.schedule: "TZ=UTC\t@daily": must be a cron schedule or empty: time zone prefix must be followed by a space and the schedule`},
		{"canary deadline 1ns", func(c *Config) { c.Canary.Deadline = 1 }, ""},
		{"canary deadline 0", func(c *Config) { c.Canary.Deadline = 0 }, `canary.deadline: 0s: must be positive`},
		{"canary users 2", func(c *Config) { c.Canary.Users = 2 }, ""},
		{"canary users 1", func(c *Config) { c.Canary.Users = 1 }, `canary.users: 1: must be at least 2`},
		{"canary users 100", func(c *Config) { c.Canary.Users = 100 }, ""},
		{"canary users 101", func(c *Config) { c.Canary.Users = 101 }, `canary.users: 101: must be at most 100`},
		{"canary messages 1", func(c *Config) { c.Canary.Messages = 1 }, ""},
		{"canary messages 0", func(c *Config) { c.Canary.Messages = 0 }, `canary.messages: 0: must be at least 1`},
		{"canary messages 100", func(c *Config) { c.Canary.Messages = 100 }, ""},
		{"canary messages 101", func(c *Config) { c.Canary.Messages = 101 }, `canary.messages: 101: must be at most 100`},
		{"canary jitter 0", func(c *Config) { c.Canary.Jitter = 0 }, ""},
		{"canary jitter negative", func(c *Config) { c.Canary.Jitter = -1 }, `canary.jitter: -1ns: must not be negative`},
		{"canary retry_after off", func(c *Config) { c.Canary.RetryAfter = 0 }, ""},
		{"canary retry_after 10s", func(c *Config) { c.Canary.RetryAfter = 10 * time.Second }, ""},
		{"canary retry_after negative", func(c *Config) { c.Canary.RetryAfter = -time.Second }, `canary.retry_after: -1s: must be positive, or 0 for no retry`},
		{"canary retry_after the interval", func(c *Config) { c.Canary.RetryAfter = 30 * time.Second },
			`canary.retry_after: 30s: must be shorter than canary.schedule's interval (30s for "@every 30s"): a retry any later is the scheduled round`},
		{"canary retry_after within the shortest gap", func(c *Config) { c.Canary.Schedule, c.Canary.RetryAfter = "0 9,17 * * *", 7*time.Hour }, ""},
		{"canary retry_after past the shortest gap", func(c *Config) { c.Canary.Schedule, c.Canary.RetryAfter = "0 9,17 * * *", 9*time.Hour },
			`canary.retry_after: 9h0m0s: must be shorter than canary.schedule's interval (8h0m0s for "0 9,17 * * *"): a retry any later is the scheduled round`},
		{"across shards", func(c *Config) { c.Population.AcrossShards = true }, ""},
		{"across shards with membership churn", func(c *Config) {
			c.Population.AcrossShards = true
			c.Population.Behaviours = []Behaviour{{Name: "c", Share: 1, Rate: 0.1, MembershipChurn: time.Minute}}
		}, "population.across_shards: true: cannot be set with a behaviour class that has membership_churn (population.behaviours): a sender cannot see the membership changes of users in other shards"},
		{"membership churn on shards of their own", func(c *Config) {
			c.Population.Behaviours = []Behaviour{{Name: "c", Share: 1, Rate: 0.1, MembershipChurn: time.Minute}}
		}, ""},
		{"canary retry_after without a canary", func(c *Config) { c.Canary.Schedule, c.Canary.RetryAfter = "", time.Hour }, ""},
		{
			"all problems reported",
			func(c *Config) { c.Population.Users, c.Population.GroupSize = 0, 0 },
			"population.users: 0: must be at least 1\npopulation.group_size: 0: must be at least 2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testLoader.Default()
			tt.change(&c)
			err := testLoader.Validate(c)
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

// validProfile is a profile with every key set as Load would leave it.
func validProfile(name string) Profile {
	p := profileDefaults
	p.Name, p.Users = name, 10
	p.Deadline, p.LostAfter = 10*time.Second, 20*time.Second
	return p
}

func TestValidateProfile(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Profile)
		want   string // "" for valid; the key is relative to soak.profiles[1]
	}{
		{"valid", func(*Profile) {}, ""},
		{"name 1 character", func(p *Profile) { p.Name = "a" }, ""},
		{"name 32 characters", func(p *Profile) { p.Name = strings.Repeat("a", 32) }, ""},
		{"name 33 characters", func(p *Profile) { p.Name = strings.Repeat("a", 33) }, `name: "` + strings.Repeat("a", 33) + `": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"name empty", func(p *Profile) { p.Name = "" }, `name: "": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"name capital", func(p *Profile) { p.Name = "Nightly" }, `name: "Nightly": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"name leading dash", func(p *Profile) { p.Name = "-x" }, `name: "-x": must match ^[a-z0-9][a-z0-9-]{0,31}$`},
		{"name digits and dashes", func(p *Profile) { p.Name = "0-burst-2" }, ""},
		{"name duplicate", func(p *Profile) { p.Name = "first" }, `name: "first": must be unique: soak.profiles[0] has the same name`},
		{"schedule cron", func(p *Profile) { p.Schedule = "0 3 * * *" }, ""},
		{"schedule every", func(p *Profile) { p.Schedule = "@every 1h" }, ""},
		{"schedule bad", func(p *Profile) { p.Schedule = "nightly" }, `schedule: "nightly": must be a cron schedule or empty: expected exactly 5 fields, found 1: [nightly]`},
		{"schedule bare time zone", func(p *Profile) { p.Schedule = "CRON_TZ=UTC" }, `schedule: "CRON_TZ=UTC": must be a cron schedule or empty: time zone prefix must be followed by a space and the schedule`},
		{"users 2", func(p *Profile) { p.Users = 2 }, ""},
		{"users 1", func(p *Profile) { p.Users = 1 }, `users: 1: must be at least 2`},
		{"users 0", func(p *Profile) { p.Users = 0 }, `users: 0: must be at least 2`},
		{"users max", func(p *Profile) { p.Users = 1_000_000 }, ""},
		{"users over max", func(p *Profile) { p.Users = 1_000_001 }, `users: 1000001: must be at most 1000000`},
		{"group size 2", func(p *Profile) { p.GroupSize = 2 }, ""},
		{"group size 1", func(p *Profile) { p.GroupSize = 1 }, `group_size: 1: must be at least 2`},
		{"rate tiny", func(p *Profile) { p.Rate = 0.001 }, ""},
		{"rate 0", func(p *Profile) { p.Rate = 0 }, `rate: 0: must be positive`},
		{"rate negative", func(p *Profile) { p.Rate = -1 }, `rate: -1: must be positive`},
		{"rate max", func(p *Profile) { p.Rate = 1000 }, ""},
		{"rate over max", func(p *Profile) { p.Rate = 1000.5 }, `rate: 1000.5: must be at most 1000`},
		{"rate NaN", func(p *Profile) { p.Rate = math.NaN() }, `rate: NaN: must be a number`},
		{"ramp 0", func(p *Profile) { p.Ramp = 0 }, ""},
		{"ramp negative", func(p *Profile) { p.Ramp = -1 }, `ramp: -1ns: must not be negative`},
		{"duration 1ns", func(p *Profile) { p.Duration = 1 }, ""},
		{"duration 0", func(p *Profile) { p.Duration = 0 }, `duration: 0s: must be positive`},
		{"settle below duration", func(p *Profile) { p.Settle = p.Duration - time.Second }, ""},
		{"settle duration", func(p *Profile) { p.Settle = p.Duration }, `settle: 1m0s: must be at least 0 and below soak.profiles[1].duration (1m0s): a run judges what is sent after it`},
		{"settle negative", func(p *Profile) { p.Settle = -time.Second }, `settle: -1s: must be at least 0 and below soak.profiles[1].duration (1m0s): a run judges what is sent after it`},
		{"drain 0", func(p *Profile) { p.Drain = 0 }, ""},
		{"drain negative", func(p *Profile) { p.Drain = -time.Second }, `drain: -1s: must not be negative`},
		{"deadline 0", func(p *Profile) { p.Deadline = 0 }, `deadline: 0s: must be positive`},
		{"lost after twice the deadline", func(p *Profile) { p.LostAfter = 2 * p.Deadline }, ""},
		{"lost after under twice the deadline", func(p *Profile) { p.LostAfter = 2*p.Deadline - 1 }, `lost_after: 19.999999999s: must be at least twice soak.profiles[1].deadline (20s)`},
		{"late logins 0.999", func(p *Profile) { p.LateLogins, p.LateAfter = 0.999, time.Second }, ""},
		{"late logins 1", func(p *Profile) { p.LateLogins, p.LateAfter = 1, time.Second }, `late_logins: 1: must be at least 0 and less than 1`},
		{"late logins negative", func(p *Profile) { p.LateLogins = -0.1 }, `late_logins: -0.1: must be at least 0 and less than 1`},
		{"late logins NaN", func(p *Profile) { p.LateLogins = math.NaN() }, `late_logins: NaN: must be at least 0 and less than 1`},
		{"late after without late logins", func(p *Profile) { p.LateAfter = time.Hour }, ""},
		{"late after negative", func(p *Profile) { p.LateAfter = -1 }, `late_after: -1ns: must not be negative`},
		{"late after 0 with late logins", func(p *Profile) { p.LateLogins = 0.5 }, `late_after: 0s: must be positive when soak.profiles[1].late_logins (0.5) is above 0`},
		{"late after 1ns", func(p *Profile) { p.LateLogins, p.LateAfter = 0.5, 1 }, ""},
		{"late after just inside duration", func(p *Profile) { p.LateLogins, p.LateAfter = 0.5, p.Duration-1 }, ""},
		{"late after at duration", func(p *Profile) { p.LateLogins, p.LateAfter = 0.5, p.Duration }, `late_after: 1m0s: must be less than soak.profiles[1].duration (1m0s) when soak.profiles[1].late_logins is above 0`},
		{"max loss 0", func(p *Profile) { p.Thresholds.MaxLoss = 0 }, ""},
		{"max loss 1", func(p *Profile) { p.Thresholds.MaxLoss = 1 }, ""},
		{"max loss over 1", func(p *Profile) { p.Thresholds.MaxLoss = 1.5 }, `thresholds.max_loss: 1.5: must be between 0 and 1`},
		{"max loss negative", func(p *Profile) { p.Thresholds.MaxLoss = -0.001 }, `thresholds.max_loss: -0.001: must be between 0 and 1`},
		{"max loss NaN", func(p *Profile) { p.Thresholds.MaxLoss = math.NaN() }, `thresholds.max_loss: NaN: must be between 0 and 1`},
		{"max late 0", func(p *Profile) { p.Thresholds.MaxLate = 0 }, ""},
		{"max late 1", func(p *Profile) { p.Thresholds.MaxLate = 1 }, ""},
		{"max late over 1", func(p *Profile) { p.Thresholds.MaxLate = 1.01 }, `thresholds.max_late: 1.01: must be between 0 and 1`},
		{"max late negative", func(p *Profile) { p.Thresholds.MaxLate = -1 }, `thresholds.max_late: -1: must be between 0 and 1`},
		{"max refused 0", func(p *Profile) { p.Thresholds.MaxRefused = 0 }, ""},
		{"max refused over 1", func(p *Profile) { p.Thresholds.MaxRefused = 2 }, `thresholds.max_refused: 2: must be between 0 and 1`},
		{"p99 ack 1ns", func(p *Profile) { p.Thresholds.P99Ack = 1 }, ""},
		{"p99 ack 0", func(p *Profile) { p.Thresholds.P99Ack = 0 }, `thresholds.p99_ack: 0s: must be positive`},
		{"p99 delivery 1ns", func(p *Profile) { p.Thresholds.P99Delivery = 1 }, ""},
		{"p99 delivery 0", func(p *Profile) { p.Thresholds.P99Delivery = 0 }, `thresholds.p99_delivery: 0s: must be positive`},
		{"min online ratio 0", func(p *Profile) { p.Thresholds.MinOnlineRatio = 0 }, ""},
		{"min online ratio 1", func(p *Profile) { p.Thresholds.MinOnlineRatio = 1 }, ""},
		{"min online ratio over 1", func(p *Profile) { p.Thresholds.MinOnlineRatio = 1.1 }, `thresholds.min_online_ratio: 1.1: must be between 0 and 1`},
		{"min online ratio negative", func(p *Profile) { p.Thresholds.MinOnlineRatio = -0.1 }, `thresholds.min_online_ratio: -0.1: must be between 0 and 1`},
		{"max disconnects 0", func(p *Profile) { p.Thresholds.MaxDisconnects = 0 }, ""},
		{"max disconnects negative", func(p *Profile) { p.Thresholds.MaxDisconnects = -1 }, `thresholds.max_disconnects: -1: must not be negative`},
		{
			"all problems reported",
			func(p *Profile) { p.Users, p.Thresholds.MaxLoss = 0, 2 },
			"users: 0: must be at least 2\nsoak.profiles[1].thresholds.max_loss: 2: must be between 0 and 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The profile under test is the second, so that the index
			// in the key is seen to be the profile's own.
			c := testLoader.Default()
			p := validProfile("second")
			tt.change(&p)
			c.Soak.Profiles = []Profile{validProfile("first"), p}
			err := testLoader.Validate(c)
			var got string
			if err != nil {
				got = err.Error()
			}
			want := tt.want
			if want != "" {
				want = "soak.profiles[1]." + want
			}
			if got != want {
				t.Errorf("Validate(%q) = %v, want %v", tt.name, got, want)
			}
			if err == nil {
				return
			}
			ve, ok := errors.AsType[*ValidationError](err)
			if !ok {
				t.Fatalf("Validate(%q) = %T, want it to hold a *ValidationError", tt.name, err)
			}
			if !strings.HasPrefix(ve.Key, "soak.profiles[1].") {
				t.Errorf("Validate(%q) key = %q, want it in soak.profiles[1]", tt.name, ve.Key)
			}
		})
	}
}

// TestValidateDuplicateInvalidName checks that a name that is both invalid
// and repeated is reported once per profile, as invalid.
func TestValidateDuplicateInvalidName(t *testing.T) {
	c := testLoader.Default()
	c.Soak.Profiles = []Profile{validProfile("Bad"), validProfile("Bad")}
	want := `soak.profiles[0].name: "Bad": must match ^[a-z0-9][a-z0-9-]{0,31}$` + "\n" +
		`soak.profiles[1].name: "Bad": must match ^[a-z0-9][a-z0-9-]{0,31}$`
	if err := testLoader.Validate(c); err == nil || err.Error() != want {
		t.Errorf("Validate() = %v, want %v", err, want)
	}
}

// TestProtocolsExtensible checks that a loader made with one more
// protocol accepts it, with Validate untouched.
func TestProtocolsExtensible(t *testing.T) {
	ld := NewLoader(Protocol{Name: "reference", InProcess: true}, Protocol{Name: "irc"})
	c := ld.Default()
	c.Target.Protocol = "irc"
	c.Target.URL = "ws://127.0.0.1:6667/irc"
	if err := ld.Validate(c); err != nil {
		t.Errorf("Validate(%q) = %v, want nil", c.Target.Protocol, err)
	}
	c.Target.URL = ""
	if err := ld.Validate(c); err == nil || !strings.Contains(err.Error(), "target.url") {
		t.Errorf("Validate(irc without url) = %v, want an error naming target.url", err)
	}
	if err := testLoader.Validate(c); err == nil || !strings.Contains(err.Error(), `target.protocol: "irc"`) {
		t.Errorf("Validate(irc) by a loader without it = %v, want an error naming target.protocol", err)
	}
}

// setChat edits the chat section of c.
func setChat(c *Config, edit func(*chatSection)) {
	s := Section(*c, "chat", chatProtocol.Section.(chatSection))
	edit(&s)
	c.Target.Sections = map[string]any{"chat": s}
}
