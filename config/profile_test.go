package config

import (
	"bufio"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const scenarios = "../configs/soak-scenarios.yaml"

// loadProfiles loads body as a configuration file and returns its profiles.
func loadProfiles(t *testing.T, body string, env ...string) []Profile {
	t.Helper()
	path := writeConfig(t, body)
	c, err := testLoader.Load(path, env, nil)
	if err != nil {
		t.Fatalf("testLoader.Load(%q) = %v, want nil error", body, err)
	}
	return c.Soak.Profiles
}

// TestProfileDefaults checks that keys a profile leaves out (or leaves
// empty) get their defaults while keys it gives, zeros included, are kept.
func TestProfileDefaults(t *testing.T) {
	minimal := profileDefaults
	minimal.Name, minimal.Users = "smoke", 10
	minimal.Deadline, minimal.LostAfter = 10*time.Second, 20*time.Second

	tests := []struct {
		name   string
		body   string
		change func(*Profile) // applied to minimal
	}{
		{
			name:   "name and users only",
			body:   "{name: smoke, users: 10}",
			change: func(*Profile) {},
		},
		{
			name:   "explicit zero max_loss stays zero",
			body:   "{name: smoke, users: 10, thresholds: {max_loss: 0}}",
			change: func(p *Profile) { p.Thresholds.MaxLoss = 0 },
		},
		{
			name:   "explicit zeros everywhere they are valid",
			body:   "{name: smoke, users: 10, ramp: 0s, drain: 0, thresholds: {max_late: 0, min_online_ratio: 0}}",
			change: func(p *Profile) { p.Ramp, p.Drain, p.Thresholds.MaxLate, p.Thresholds.MinOnlineRatio = 0, 0, 0, 0 },
		},
		{
			name:   "empty values are unset",
			body:   "{name: smoke, users: 10, ramp: , rate: ~, thresholds: }",
			change: func(*Profile) {},
		},
		{
			name:   "empty threshold is unset",
			body:   "{name: smoke, users: 10, thresholds: {max_loss: }}",
			change: func(*Profile) {},
		},
		{
			name: "given keys kept, the rest merged",
			body: "{name: smoke, users: 10, schedule: '@daily', group_size: 3, rate: 0.25, duration: 5m, late_logins: 0.5, late_after: 1m, thresholds: {p99_ack: 250ms, max_disconnects: 3}}",
			change: func(p *Profile) {
				p.Schedule, p.GroupSize, p.Rate, p.Duration = "@daily", 3, 0.25, 5*time.Minute
				p.LateLogins, p.LateAfter = 0.5, time.Minute
				p.Thresholds.P99Ack, p.Thresholds.MaxDisconnects = 250*time.Millisecond, 3
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := minimal
			tt.change(&want)
			got := loadProfiles(t, "soak: {profiles: ["+tt.body+"]}")
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Errorf("testLoader.Load(%q) profiles = %+v, want [%+v]", tt.body, got, want)
			}
		})
	}

	// Defaults are merged per profile: one profile's keys never leak into
	// another's.
	got := loadProfiles(t, `
soak:
  profiles:
    - {name: a, users: 2, thresholds: {max_loss: 0}}
    - {name: b, users: 3}
`)
	if len(got) != 2 || got[0].Thresholds.MaxLoss != 0 || got[1].Thresholds.MaxLoss != 0.001 {
		t.Errorf("max_loss of [a b] = %+v, want [0 0.001]", got)
	}
}

// TestProfileDeadline checks that deadline follows population.deadline from
// whichever source sets it, and lost_after follows the profile's deadline.
func TestProfileDeadline(t *testing.T) {
	tests := []struct {
		name          string
		body          string
		env           []string
		deadline      time.Duration
		lostAfter     time.Duration
		populationDue time.Duration
	}{
		{
			name:     "omitted: population.deadline default",
			body:     "{name: a, users: 2}",
			deadline: 10 * time.Second, lostAfter: 20 * time.Second,
		},
		{
			name:     "omitted: population.deadline from the file",
			body:     "{name: a, users: 2}\npopulation: {deadline: 3s, lost_after: 6s}",
			deadline: 3 * time.Second, lostAfter: 6 * time.Second,
		},
		{
			name:     "omitted: population.deadline from the environment",
			body:     "{name: a, users: 2}",
			env:      []string{"IMCANARY_POPULATION_DEADLINE=4s"},
			deadline: 4 * time.Second, lostAfter: 8 * time.Second,
		},
		{
			name:     "zero is omitted",
			body:     "{name: a, users: 2, deadline: 0s, lost_after: 0}",
			deadline: 10 * time.Second, lostAfter: 20 * time.Second,
		},
		{
			name:     "given deadline, lost_after follows it",
			body:     "{name: a, users: 2, deadline: 2s}",
			deadline: 2 * time.Second, lostAfter: 4 * time.Second,
		},
		{
			name:     "both given",
			body:     "{name: a, users: 2, deadline: 2s, lost_after: 1m}",
			deadline: 2 * time.Second, lostAfter: time.Minute,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			profile, rest, _ := strings.Cut(tt.body, "\n")
			got := loadProfiles(t, "soak: {profiles: ["+profile+"]}\n"+rest, tt.env...)
			if len(got) != 1 || got[0].Deadline != tt.deadline || got[0].LostAfter != tt.lostAfter {
				t.Errorf("testLoader.Load(%q) with env %q deadline, lost_after = %+v, want %v, %v", tt.body, tt.env, got, tt.deadline, tt.lostAfter)
			}
		})
	}
}

func TestLoadProfileErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		env  []string
		want string
	}{
		{
			name: "profiles from the environment",
			env:  []string{"IMCANARY_SOAK_PROFILES=nightly"},
			want: `unknown environment variable "IMCANARY_SOAK_PROFILES": soak.profiles is a list, which only the configuration file can set`,
		},
		{
			name: "soak not a mapping",
			body: "soak: [a]",
			want: "soak: [a]: must be a mapping of keys",
		},
		{
			name: "profiles a scalar",
			body: "soak: {profiles: 5}",
			want: "soak.profiles: 5: must be a list",
		},
		{
			name: "wrong type in a profile",
			body: "soak: {profiles: [{name: a, users: 2}, {name: b, users: many, ramp: 10}]}",
			want: `soak.profiles[1].users: "many": must be a whole number` + "\n" +
				`soak.profiles[1].ramp: 10: must be a duration with a unit, such as "500ms", "10s" or "1m30s"`,
		},
		{
			name: "thresholds not a mapping",
			body: "soak: {profiles: [{name: a, users: 2, thresholds: 0.1}]}",
			want: "soak.profiles[0].thresholds: 0.1: must be a mapping of keys",
		},
		{
			name: "wrong type in thresholds",
			body: "soak: {profiles: [{name: a, users: 2, thresholds: {max_disconnects: 1.5}}]}",
			want: "soak.profiles[0].thresholds.max_disconnects: 1.5: must be a whole number",
		},
		{
			name: "dotted key in a profile",
			body: "soak: {profiles: [{name: a, users: 2, thresholds.max_loss: 0}]}",
			want: `unknown key "soak.profiles[0].thresholds.max_loss": nest it instead of writing dots in one key`,
		},
		{
			name: "error from the file, not the environment",
			body: "soak: {profiles: [{name: a, users: 2, late_logins: 0.5, late_after: 1m}]}",
			env:  []string{"IMCANARY_POPULATION_USERS=3"},
			want: "soak.profiles[0].late_after: 1m0s: must be less than soak.profiles[0].duration (1m0s) when soak.profiles[0].late_logins is above 0",
		},
		{
			name: "storm without its recovery thresholds",
			body: "soak: {profiles: [{name: a, users: 2, storm: {fraction: 0.5, after: 10s}}]}",
			want: "soak.profiles[0].thresholds.recovery_99: 0s: must be positive when soak.profiles[0].storm.fraction (0.5) is above 0: it is the drill's verdict\n" +
				"soak.profiles[0].thresholds.recovery_100: 0s: must be positive when soak.profiles[0].storm.fraction (0.5) is above 0: it is the drill's verdict",
		},
		{
			name: "storm after the send phase",
			body: "soak: {profiles: [{name: a, users: 2, storm: {fraction: 1, after: 1m}, thresholds: {recovery_99: 10s, recovery_100: 20s}}]}",
			want: "soak.profiles[0].storm.after: 1m0s: must be less than soak.profiles[0].duration (1m0s) when soak.profiles[0].storm.fraction is above 0",
		},
		{
			name: "storm fraction above 1, recovery thresholds the wrong way round",
			body: "soak: {profiles: [{name: a, users: 2, storm: {fraction: 1.5, after: 10s}, thresholds: {recovery_99: 30s, recovery_100: 20s}}]}",
			want: "soak.profiles[0].storm.fraction: 1.5: must be at least 0 and at most 1\n" +
				"soak.profiles[0].thresholds.recovery_99: 30s: must be at most soak.profiles[0].thresholds.recovery_100 (20s)",
		},
		{
			name: "search of an unknown value",
			body: "soak: {profiles: [{name: a, users: 2, search: {vary: speed, max: 10}}]}",
			want: `soak.profiles[0].search.vary: "speed": must be "" (no search), "rate", "users" or "group_size"`,
		},
		{
			name: "search that starts above its max, grows by 1, with no precision",
			body: "soak: {profiles: [{name: a, users: 2, rate: 5, search: {vary: rate, max: 4, factor: 1, precision: 0}}]}",
			want: "soak.profiles[0].search.max: 4: must be above soak.profiles[0].rate (5), where the search starts\n" +
				"soak.profiles[0].search.factor: 1: must be above 1 and at most 10\n" +
				"soak.profiles[0].search.precision: 0: must be above 0 and below 1",
		},
		{
			name: "search of group sizes past the users",
			body: "soak: {profiles: [{name: a, users: 10, schedule: \"@every 1h\", search: {vary: group_size, max: 20}}]}",
			want: "soak.profiles[0].search.max: 20: must be at most soak.profiles[0].users (10): a group holds at most every user",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var path, want string
			if tt.body != "" {
				path = writeConfig(t, tt.body)
				// Every line of a file's error starts with its path.
				want = path + ": " + strings.ReplaceAll(tt.want, "\n", "\n"+path+": ")
			} else {
				want = tt.want
			}
			_, err := testLoader.Load(path, tt.env, nil)
			if err == nil || err.Error() != want {
				t.Errorf("testLoader.Load(%q) with env %q = %v, want %v", tt.body, tt.env, err, want)
			}
		})
	}
}

func TestConfigProfile(t *testing.T) {
	c := testLoader.Default()
	c.Soak.Profiles = []Profile{validProfile("a"), validProfile("b")}
	c.Soak.Profiles[1].Users = 42
	tests := []struct {
		name      string
		wantOK    bool
		wantUsers int
	}{
		{"a", true, 10},
		{"b", true, 42},
		{"c", false, 0},
		{"", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := c.Profile(tt.name)
			if ok != tt.wantOK || p.Users != tt.wantUsers || (ok && p.Name != tt.name) {
				t.Errorf("Profile(%q) = %+v, %v, want users %d, %v", tt.name, p, ok, tt.wantUsers, tt.wantOK)
			}
		})
	}
}

// TestSoakScenarios loads the shipped example profiles and holds them to
// what the file promises: every published scenario is there, and each fits
// one 2-core machine next to its reference server.
func TestSoakScenarios(t *testing.T) {
	c, err := testLoader.Load(scenarios, nil, nil)
	if err != nil {
		t.Fatalf("testLoader.Load(%q) = %v, want nil error", scenarios, err)
	}
	var names []string
	for _, p := range c.Soak.Profiles {
		names = append(names, p.Name)
	}
	want := []string{
		"openim-small-reliability",
		"openim-sampled",
		"openim-large-group",
		"openim-native-reliability",
		"openim-native-reliability-ci",
		"openim-native-sampled",
		"talkwire-loopback-1",
		"talkwire-loopback-2",
		"talkwire-group-sweep",
		"netty-burst",
		"nightly",
		"lb-restart-storm",
	}
	if !slices.Equal(names, want) {
		t.Errorf("profile names in %s = %q, want %q", scenarios, names, want)
	}

	const maxUsers, maxRate = 2000, 2000.0
	for _, p := range c.Soak.Profiles {
		if p.Users > maxUsers {
			t.Errorf("%s: users = %d, want at most %d", p.Name, p.Users, maxUsers)
		}
		if r := float64(p.Users) * p.Rate; r > maxRate {
			t.Errorf("%s: users × rate = %v msg/s, want at most %v", p.Name, r, maxRate)
		}
	}

	// The features that make each scenario what it is.
	checks := []struct {
		name string
		ok   func(Profile) bool
		want string
	}{
		{"lb-restart-storm", func(p Profile) bool {
			return p.Storm.Fraction == 0.5 && p.Storm.After < p.Duration && p.Thresholds.Recovery100 > 0 && p.Thresholds.MaxLoss == 0
		}, "half dropped during sending, judged on recovery and loss"},
		{"openim-small-reliability", func(p Profile) bool {
			return p.Users == 200 && p.LateLogins == 0.5 && p.Thresholds.MaxLoss == 0 && p.Groups == "200x5"
		}, "200 users, half late, no loss, each in 5 groups"},
		{"openim-large-group", func(p Profile) bool {
			return p.Groups == "1x1000" && len(p.Behaviours) == 2 && p.Behaviours[1].Rate == 0
		}, "one group of 1000, few senders and silent listeners"},
		{"openim-sampled", func(p Profile) bool { return p.Users == 2000 && p.Rate == 0.05 }, "2000 users at 0.05 msg/s"},
		{"openim-native-reliability", func(p Profile) bool {
			return p.Users == 200 && p.Devices == 2 && p.LateLogins == 0.5 && p.Thresholds.MaxLoss == 0 && p.Groups == "200x5"
		}, "the reliability test for protocol openim: two platforms a user, half late, no loss"},
		{"openim-native-sampled", func(p Profile) bool {
			return p.Users == 2000 && p.Rate == 0.05 && p.LateLogins == 0.2 && p.Ramp >= time.Minute
		}, "the sampled test for protocol openim: 2000 users, a fifth late, logins over minutes"},
		{"talkwire-loopback-1", func(p Profile) bool { return p.Users == 1000 && p.Rate == 1 && p.GroupSize == 50 }, "1000 users at 1 msg/s in groups of 50"},
		{"talkwire-loopback-2", func(p Profile) bool { return p.Users == 1000 && p.GroupSize == 250 && p.Thresholds.MaxLoss > 0 }, "1000 users in groups of 250, loss tolerated"},
		{"talkwire-group-sweep", func(p Profile) bool {
			return p.Users == 1000 && p.Rate == 1 && p.Search.Vary == SearchGroupSize && p.SearchStart() == 10 && p.Search.Max == 250 &&
				p.Thresholds.MaxDisconnects == 0 && p.Thresholds.P99Delivery == time.Second
		}, "1000 users at 1 msg/s, the group size searched from 10 to 250, judged on delivery latency and dropped sessions"},
		{"netty-burst", func(p Profile) bool { return p.Duration <= time.Minute && float64(p.Users)*p.Rate >= 1000 }, "a burst of at most a minute at 1000 msg/s or more"},
		{"nightly", func(p Profile) bool { return p.Schedule == "0 3 * * *" }, `schedule "0 3 * * *"`},
	}
	for _, ck := range checks {
		if p, ok := c.Profile(ck.name); !ok || !ck.ok(p) {
			t.Errorf("Profile(%q) = %+v, %v, want %s", ck.name, p, ok, ck.want)
		}
	}
}

// TestExampleProfile keeps the commented profile in configs/imcanary.yaml
// honest: uncommented, it must load to the nightly profile it describes.
func TestExampleProfile(t *testing.T) {
	f, err := os.Open(example)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The example starts at "  # profiles:" and runs to the end of that
	// comment block; removing one level of "# " uncomments it and leaves
	// the explanations (written "# # ...") as comments.
	var body strings.Builder
	body.WriteString("soak:\n")
	in := false
	for s := bufio.NewScanner(f); s.Scan(); {
		line := s.Text()
		if line == "  # profiles:" {
			in = true
		}
		if !in {
			continue
		}
		rest, ok := strings.CutPrefix(line, "  #")
		if !ok {
			break
		}
		body.WriteString("  " + strings.TrimPrefix(rest, " ") + "\n")
	}
	if !in {
		t.Fatalf("%s has no commented example starting with %q", example, "  # profiles:")
	}

	got := loadProfiles(t, body.String())
	want := Profile{
		Name:      "nightly",
		Schedule:  "0 3 * * *",
		Users:     5000,
		GroupSize: 10,
		Devices:   1,
		Rate:      0.5,
		Ramp:      time.Minute,
		Duration:  30 * time.Minute,
		Drain:     30 * time.Second,
		Deadline:  10 * time.Second,
		LostAfter: 20 * time.Second,
		Search:    Search{Factor: 2, Precision: 0.05},
		Thresholds: Thresholds{
			MaxLoss:                 0.0001,
			MaxLate:                 0.001,
			MaxRefused:              0.001,
			MinRealtimeCompleteness: 0.99,
			P99Ack:                  500 * time.Millisecond,
			P99Delivery:             time.Second,
			MinOnlineRatio:          1,
			MaxDisconnects:          0,
		},
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("commented example in %s = %+v, want [%+v]\n%s", example, got, want, body.String())
	}
}
