package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite the testdata/invalid-*.err golden files")

const example = "../configs/imcanary.yaml"

// TestLoadInvalid loads every testdata/invalid-*.yaml and compares the error
// with the .err file beside it, byte for byte: the messages are part of the
// interface operators see.
func TestLoadInvalid(t *testing.T) {
	paths, err := filepath.Glob("testdata/invalid-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no testdata/invalid-*.yaml files")
	}
	for _, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			golden := strings.TrimSuffix(path, ".yaml") + ".err"
			_, err := testLoader.Load(path, nil, nil)
			if err == nil {
				t.Fatalf("testLoader.Load(%q) = nil, want an error", path)
			}
			if *update {
				if err := os.WriteFile(golden, []byte(err.Error()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			b, rerr := os.ReadFile(golden)
			if rerr != nil {
				t.Fatalf("%v (run go test -update to create it)", rerr)
			}
			if want := strings.TrimSuffix(string(b), "\n"); err.Error() != want {
				t.Errorf("testLoader.Load(%q) = %v, want %v", path, err, want)
			}
		})
	}
}

func TestDefaultIsValid(t *testing.T) {
	if err := testLoader.Validate(testLoader.Default()); err != nil {
		t.Errorf("testLoader.Validate(testLoader.Default()) = %v, want nil", err)
	}
}

func TestLoadPartial(t *testing.T) {
	const path = "testdata/valid-partial.yaml"
	got, err := testLoader.Load(path, nil, nil)
	if err != nil {
		t.Fatalf("testLoader.Load(%q) = %v, want nil error", path, err)
	}
	want := testLoader.Default()
	want.Target.Name = "staging"
	want.Population.Users = 7
	if !reflect.DeepEqual(got, want) {
		t.Errorf("testLoader.Load(%q) = %+v, want %+v", path, got, want)
	}
}

func TestLoadNoSources(t *testing.T) {
	got, err := testLoader.Load("", nil, nil)
	if err != nil || !reflect.DeepEqual(got, testLoader.Default()) {
		t.Errorf("testLoader.Load(%q) = %+v, %v, want %+v, nil", "", got, err, testLoader.Default())
	}
}

func TestLoadMissingFile(t *testing.T) {
	const path = "testdata/does-not-exist.yaml"
	_, err := testLoader.Load(path, nil, nil)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("testLoader.Load(%q) = %v, want an error naming the file that wraps os.ErrNotExist", path, err)
	}
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "imcanary.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func parseFlags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("imcanary", pflag.ContinueOnError)
	// main's own flags share the set and must be ignored by Load.
	fs.String("config.file", "", "path of the configuration file")
	testLoader.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestLoadPrecedence checks file < environment < flags, key by key.
func TestLoadPrecedence(t *testing.T) {
	path := writeConfig(t, `
target:
  name: from-file
population:
  users: 1
  group_size: 3
  ramp: 1s
  prefix: file
`)
	tests := []struct {
		name  string
		env   []string
		args  []string
		check func(Config) error
	}{
		{
			name: "file over defaults",
			check: func(c Config) error {
				return want(c.Population.Users, 1, c.Population.Rate, testLoader.Default().Population.Rate)
			},
		},
		{
			name: "environment over file",
			env:  []string{"IMCANARY_POPULATION_USERS=2", "IMCANARY_POPULATION_RAMP=2s"},
			check: func(c Config) error {
				return want(c.Population.Users, 2, c.Population.Ramp, 2*time.Second, c.Population.GroupSize, 3)
			},
		},
		{
			name: "flag over environment",
			env:  []string{"IMCANARY_POPULATION_USERS=2", "IMCANARY_POPULATION_GROUP_SIZE=4"},
			args: []string{"--population.users=9", "--population.ramp=5s", "--config.file=x.yaml"},
			check: func(c Config) error {
				return want(c.Population.Users, 9, c.Population.Ramp, 5*time.Second,
					c.Population.GroupSize, 4, c.Population.Prefix, "file")
			},
		},
		{
			name: "unset flag keeps lower sources",
			env:  []string{"IMCANARY_TARGET_NAME=from-env"},
			args: []string{},
			check: func(c Config) error {
				return want(c.Target.Name, "from-env", c.Population.Users, 1)
			},
		},
		{
			name: "flag set to its default still wins",
			env:  []string{"IMCANARY_POPULATION_USERS=2"},
			args: []string{"--population.users=100"},
			check: func(c Config) error {
				return want(c.Population.Users, 100)
			},
		},
		{
			name: "nested key from environment",
			env:  []string{"IMCANARY_POPULATION_BACKOFF_MAX=1m", "IMCANARY_TARGET_URL=wss://im.example:443/ws"},
			check: func(c Config) error {
				return want(c.Population.Backoff.Max, time.Minute, c.Target.URL, "wss://im.example:443/ws")
			},
		},
		{
			name: "variables without the prefix are not ours",
			env:  []string{"HOME=/root", "imcanary_population_users=5", "IMCANARY", "PATH=/bin"},
			check: func(c Config) error {
				return want(c.Population.Users, 1)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fs *pflag.FlagSet
			if tt.args != nil {
				fs = parseFlags(t, tt.args...)
			}
			got, err := testLoader.Load(path, tt.env, fs)
			if err != nil {
				t.Fatalf("testLoader.Load(%q) = %v, want nil error", path, err)
			}
			if err := tt.check(got); err != nil {
				t.Errorf("testLoader.Load(%q) with env %q, flags %q: %v", path, tt.env, tt.args, err)
			}
		})
	}
}

// want compares pairs of got, want values and describes the first mismatch.
func want(pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] != pairs[i+1] {
			return fmt.Errorf("got %v, want %v", pairs[i], pairs[i+1])
		}
	}
	return nil
}

// TestLoadErrors loads bad environments and flags; each problem of every
// source is reported, in the order file, environment, flags, validation.
func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{
			name: "unknown variable",
			env:  []string{"IMCANARY_POPULATION_USERZ=5"},
			want: `unknown environment variable "IMCANARY_POPULATION_USERZ": did you mean "IMCANARY_POPULATION_USERS"?`,
		},
		{
			name: "unknown variable near one that is no key",
			env:  []string{"IMCANARY_HEALTH_PASWORD=x"},
			want: `unknown environment variable "IMCANARY_HEALTH_PASWORD": did you mean "IMCANARY_HEALTH_PASSWORD"?`,
		},
		{
			name: "unknown variable near nothing",
			env:  []string{"IMCANARY_POPULATION_SIZE=5"},
			want: `unknown environment variable "IMCANARY_POPULATION_SIZE"`,
		},
		{
			name: "bad boolean in environment",
			env:  []string{"IMCANARY_TARGET_CHAT_REGISTER=maybe"},
			want: `environment variable IMCANARY_TARGET_CHAT_REGISTER: target.chat.register: "maybe": must be true or false`,
		},
		{
			name: "bad boolean flag",
			args: []string{"--target.chat.resume=yes"},
			want: `flag --target.chat.resume: target.chat.resume: "yes": must be true or false`,
		},
		{
			name: "every source's problems",
			env:  []string{"IMCANARY_POPULATION_USERS=abc", "IMCANARY_POPULATION_USER=5", "IMCANARY_CANARY_USERS=1"},
			args: []string{"--population.rate=fast", "--population.group_size=1"},
			want: `unknown environment variable "IMCANARY_POPULATION_USER": did you mean "IMCANARY_POPULATION_USERS"?` + "\n" +
				`environment variable IMCANARY_POPULATION_USERS: population.users: "abc": must be a whole number` + "\n" +
				`flag --population.rate: population.rate: "fast": must be a number` + "\n" +
				`flag --population.group_size: population.group_size: 1: must be at least 2` + "\n" +
				`environment variable IMCANARY_CANARY_USERS: canary.users: 1: must be at least 2`,
		},
		{
			// The default deadline (10s) standing in for the bad one
			// must not make the flag's lost_after look wrong.
			name: "rule with a rejected key",
			env:  []string{"IMCANARY_POPULATION_DEADLINE=2"},
			args: []string{"--population.lost_after=5s", "--population.lag_threshold=1s"},
			want: `environment variable IMCANARY_POPULATION_DEADLINE: population.deadline: "2": must be a duration with a unit, such as "500ms", "10s" or "1m30s"`,
		},
		{
			// Rejected in the flags, valid in the environment: the
			// environment's value is used, and only the flag blamed.
			name: "rejected flag over a valid variable",
			env:  []string{"IMCANARY_POPULATION_USERS=5"},
			args: []string{"--population.users=5x"},
			want: `flag --population.users: population.users: "5x": must be a whole number`,
		},
		{
			name: "every unknown variable",
			env:  []string{"IMCANARY_B=1", "IMCANARY_A=2"},
			want: "unknown environment variable \"IMCANARY_B\"\nunknown environment variable \"IMCANARY_A\"",
		},
		{
			name: "section as variable",
			env:  []string{"IMCANARY_POPULATION=5"},
			want: `unknown environment variable "IMCANARY_POPULATION"`,
		},
		{
			name: "bad duration in environment",
			env:  []string{"IMCANARY_POPULATION_RAMP=10"},
			want: `environment variable IMCANARY_POPULATION_RAMP: population.ramp: "10": must be a duration with a unit, such as "500ms", "10s" or "1m30s"`,
		},
		{
			name: "empty number in environment",
			env:  []string{"IMCANARY_POPULATION_USERS="},
			want: `environment variable IMCANARY_POPULATION_USERS: population.users: "": must be a whole number`,
		},
		{
			name: "invalid value from environment",
			env:  []string{"IMCANARY_POPULATION_USERS=0"},
			want: `environment variable IMCANARY_POPULATION_USERS: population.users: 0: must be at least 1`,
		},
		{
			name: "bad duration flag",
			args: []string{"--population.ramp=5x"},
			want: `flag --population.ramp: population.ramp: "5x": must be a duration with a unit, such as "500ms", "10s" or "1m30s"`,
		},
		{
			name: "bad number flag",
			args: []string{"--population.rate=fast"},
			want: `flag --population.rate: population.rate: "fast": must be a number`,
		},
		{
			name: "invalid value from flag",
			env:  []string{"IMCANARY_POPULATION_DEADLINE=1s"},
			args: []string{"--population.lost_after=500ms"},
			want: `flag --population.lost_after: population.lost_after: 500ms: must be at least twice population.deadline (2s)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fs *pflag.FlagSet
			if tt.args != nil {
				fs = parseFlags(t, tt.args...)
			}
			_, err := testLoader.Load("", tt.env, fs)
			if err == nil || err.Error() != tt.want {
				t.Errorf("testLoader.Load(%q) with env %q, flags %q = %v, want %v", "", tt.env, tt.args, err, tt.want)
			}
		})
	}
}

// TestLoadValidationErrorType checks that callers can reach the structured
// error through the source prefix.
func TestLoadValidationErrorType(t *testing.T) {
	const path = "testdata/invalid-users-zero.yaml"
	_, err := testLoader.Load(path, nil, nil)
	ve, ok := errors.AsType[*ValidationError](err)
	if !ok || ve.Key != "population.users" || ve.Value != 0 {
		t.Errorf("testLoader.Load(%q) = %#v, want a *ValidationError for population.users = 0", path, err)
	}
}

// TestSecretIgnored checks that the variables imcanary reads that are not
// keys (the token-signing secret, the health check's password), which share
// the IMCANARY_ prefix, are neither unknown variables nor copied anywhere.
func TestSecretIgnored(t *testing.T) {
	const secret = "hunter2-do-not-copy"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(OtherEnv) < 2 {
		t.Fatalf("OtherEnv = %v, want the secret's and the health password's", OtherEnv)
	}
	for _, v := range OtherEnv {
		if !strings.HasPrefix(v.Name, EnvPrefix) || len(v.UsedBy) == 0 || v.Usage == "" {
			t.Errorf("OtherEnv has %+v; want an IMCANARY_ name, what uses it and what it holds", v)
		}
		if _, ok := testLoader.byEnv[v.Name]; ok {
			t.Errorf("OtherEnv has %s, which is a key's variable", v.Name)
		}
		tests := []struct {
			name    string
			env     []string
			wantErr bool
		}{
			{name: "alone", env: []string{v.Name + "=" + secret}},
			{name: "beside a key", env: []string{v.Name + "=" + secret, "IMCANARY_TARGET_SECRET_FILE=" + secretFile}},
			{name: "beside an error", env: []string{v.Name + "=" + secret, "IMCANARY_POPULATION_USERS=x"}, wantErr: true},
			{name: "beside an unknown variable", env: []string{v.Name + "=" + secret, "IMCANARY_NOPE=1"}, wantErr: true},
		}
		for _, tt := range tests {
			t.Run(v.Name+"/"+tt.name, func(t *testing.T) {
				c, err := testLoader.Load("", tt.env, nil)
				if (err != nil) != tt.wantErr {
					t.Fatalf("testLoader.Load(%q) with env %q = %v, want error %v", "", tt.env, err, tt.wantErr)
				}
				if s := fmt.Sprintf("%+v %v", c, err); strings.Contains(s, secret) {
					t.Errorf("testLoader.Load(%q) with env %q = %s, want no trace of the secret", "", tt.env, s)
				}
			})
		}
	}
	if !slices.ContainsFunc(OtherEnv, func(v EnvVar) bool { return v.Name == SecretEnv }) ||
		!slices.ContainsFunc(OtherEnv, func(v EnvVar) bool { return v.Name == HealthPasswordEnv }) {
		t.Errorf("OtherEnv = %v, want %s and %s in it", OtherEnv, SecretEnv, HealthPasswordEnv)
	}
	if slices.Contains(testLoader.Keys(), "target.secret") {
		t.Errorf("testLoader.Keys() contains target.secret; the secret must never be a configuration key")
	}
}

func TestKeys(t *testing.T) {
	want := []string{
		"canary.deadline",
		"canary.jitter",
		"canary.max_clock_uncertainty",
		"canary.messages",
		"canary.retry_after",
		"canary.schedule",
		"canary.users",
		"data_dir",
		"history.max_age",
		"history.max_canary_rounds",
		"history.max_runs",
		"http.listen",
		"population.across_shards",
		"population.backoff.initial",
		"population.backoff.max",
		"population.deadline",
		"population.devices",
		"population.group_size",
		"population.groups",
		"population.heartbeat",
		"population.lag_threshold",
		"population.lost_after",
		"population.max_connect_rate",
		"population.message_size",
		"population.prefix",
		"population.ramp",
		"population.rate",
		"population.reactor",
		"population.session_lifetime",
		"population.slow_readers.fraction",
		"population.slow_readers.pause",
		"population.slow_readers.pause_every",
		"population.slow_readers.read_delay",
		"population.source_addrs",
		"population.users",
		"saturation.interval",
		"saturation.max_cpu",
		"saturation.max_fds",
		"saturation.max_gc_pause",
		"saturation.max_ports",
		"saturation.max_receive_lag",
		"saturation.max_sched_latency",
		"saturation.max_send_lag",
		"saturation.window",
		"shard",
		"slo.objective",
		"target.catch_up",
		"target.chat.domain",
		"target.chat.register",
		"target.chat.resume",
		"target.chat.token_ttl",
		"target.name",
		"target.protocol",
		"target.secret_file",
		"target.url",
	}
	if got := testLoader.Keys(); !slices.Equal(got, want) {
		t.Errorf("testLoader.Keys() = %v, want %v", got, want)
	}
	for _, k := range want {
		if d := testLoader.doc(k); d.usage == "" || d.uses&CommandRun == 0 {
			t.Errorf("doc(%q) = %+v; every key needs a flag description, and the daemon reads every key", k, d)
		}
	}
	// The protocols' keys are described by their Help.
	if len(keyDocs) != len(want)-len(chatProtocol.Help) {
		t.Errorf("len(keyDocs) = %d, want %d (a description for a key that does not exist)", len(keyDocs), len(want))
	}
}

func TestEnvName(t *testing.T) {
	tests := []struct{ key, want string }{
		{"population.group_size", "IMCANARY_POPULATION_GROUP_SIZE"},
		{"target.url", "IMCANARY_TARGET_URL"},
		{"population.backoff.max", "IMCANARY_POPULATION_BACKOFF_MAX"},
		{"data_dir", "IMCANARY_DATA_DIR"},
		{"history.max_canary_rounds", "IMCANARY_HISTORY_MAX_CANARY_ROUNDS"},
		{"canary.schedule", "IMCANARY_CANARY_SCHEDULE"},
		{"population", ""},
		{"soak", ""},
		{"soak.profiles", ""},
		{"target.secret", ""},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := testLoader.EnvName(tt.key); got != tt.want {
				t.Errorf("testLoader.EnvName(%q) = %q, want %q", tt.key, got, tt.want)
			}
		})
	}
	// Two keys that differ only in "." versus "_" would share a variable.
	if len(testLoader.byEnv) != len(testLoader.s.leaves) {
		t.Errorf("%d keys map to %d environment variables, want one each", len(testLoader.s.leaves), len(testLoader.byEnv))
	}
}

func TestRegisterFlags(t *testing.T) {
	fs := pflag.NewFlagSet("imcanary", pflag.ContinueOnError)
	testLoader.RegisterFlags(fs)
	tests := []struct{ name, typ, def, usage string }{
		{"http.listen", "string", "127.0.0.1:9464", `--http.listen string   address (host:port) of the HTTP server for /metrics, /healthz and /readyz (default "127.0.0.1:9464")`},
		{"target.url", "string", "", "--target.url string   WebSocket URL"},
		{"target.chat.register", "bool", "true", "--target.chat.register   chat: create users by registration (default true)"},
		{"target.chat.resume", "bool", "false", "--target.chat.resume   chat: resume sessions (off by default)\n"},
		{"population.users", "int", "100", "--population.users int   number of simulated users kept online (default 100)"},
		{"population.ramp", "duration", "10s", "--population.ramp duration   duration over which the users' first logins are spread (default 10s)"},
		{"population.rate", "float64", "0.5", "--population.rate float   messages per second per user, alternating direct and group (default 0.5)"},
		{"population.backoff.initial", "duration", "500ms", "(default 500ms)"},
		{"data_dir", "string", "./imcanary-data", `(default "./imcanary-data")`},
		{"history.max_age", "duration", "720h0m0s", "(default 720h0m0s)"},
		{"history.max_runs", "int", "200", "(default 200)"},
		{"canary.schedule", "string", "@every 30s", `(default "@every 30s")`},
		{"canary.users", "int", "4", "(default 4)"},
		{"target.protocol", "string", "reference", "protocol driver of the target: reference, chat"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fs.Lookup(tt.name)
			if f == nil {
				t.Fatalf("Lookup(%q) = nil, want a flag", tt.name)
			}
			if f.DefValue != tt.def || f.Value.Type() != tt.typ {
				t.Errorf("Lookup(%q) has default %q and type %q, want %q and %q", tt.name, f.DefValue, f.Value.Type(), tt.def, tt.typ)
			}
			one := pflag.NewFlagSet("one", pflag.ContinueOnError)
			one.AddFlag(f)
			// Spaces are alignment, which depends on the other flags.
			if got := strings.Join(strings.Fields(one.FlagUsages()), " "); !strings.Contains(got+"\n", strings.Join(strings.Fields(tt.usage), " ")) {
				t.Errorf("usage of --%s = %q, want it to contain %q", tt.name, got, tt.usage)
			}
		})
	}
	var n int
	fs.VisitAll(func(*pflag.Flag) { n++ })
	if n != len(testLoader.Keys()) {
		t.Errorf("RegisterFlags defined %d flags, want %d", n, len(testLoader.Keys()))
	}

	// The defaults shown in help must load back to testLoader.Default().
	var args []string
	fs.VisitAll(func(f *pflag.Flag) { args = append(args, "--"+f.Name+"="+f.DefValue) })
	c, err := testLoader.Load("", nil, parseFlags(t, args...))
	if err != nil || !reflect.DeepEqual(c, testLoader.Default()) {
		t.Errorf("Load with every flag at its shown default = %+v, %v, want %+v, nil", c, err, testLoader.Default())
	}
}

// TestBoolFlags: a boolean key given alone is true, as pflag's own
// booleans are; given a value, that value.
func TestBoolFlags(t *testing.T) {
	tests := []struct {
		args             []string
		register, resume bool
	}{
		{nil, true, false},
		{[]string{"--target.chat.resume"}, true, true},
		{[]string{"--target.chat.register=false", "--target.chat.resume=true"}, false, true},
		{[]string{"--target.chat.register=0"}, false, false},
	}
	for _, tt := range tests {
		c, err := testLoader.Load("", nil, parseFlags(t, tt.args...))
		if err != nil || Section(c, "chat", chatSection{}).Register != tt.register || Section(c, "chat", chatSection{}).Resume != tt.resume {
			t.Errorf("Load with flags %q = register %v, resume %v, %v; want %v, %v, nil", tt.args,
				Section(c, "chat", chatSection{}).Register, Section(c, "chat", chatSection{}).Resume, err, tt.register, tt.resume)
		}
	}
}

// TestKeysFor: the daemon takes every key; the one-shot commands take
// what they use, which some keys decide on purpose (the test in
// cmd/imcanary follows the commands' code for the rest).
func TestKeysFor(t *testing.T) {
	if got := testLoader.KeysFor(CommandRun); !slices.Equal(got, testLoader.Keys()) {
		t.Errorf("testLoader.KeysFor(CommandRun) = %v, want every key", got)
	}
	tests := []struct {
		cmd        Command
		has, lacks []string
	}{
		{CommandCanary,
			[]string{"target.url", "target.secret_file", "canary.users", "canary.deadline", "canary.messages", "population.heartbeat", "saturation.window", "data_dir"},
			[]string{"http.listen", "canary.schedule", "canary.jitter", "history.max_runs", "population.users", "population.rate", "shard", "slo.objective"}},
		{CommandSoak,
			[]string{"target.url", "history.max_runs", "history.max_age", "history.max_canary_rounds", "data_dir", "population.deadline", "population.message_size", "shard"},
			[]string{"http.listen", "canary.schedule", "canary.users", "population.users", "population.slow_readers.fraction"}},
	}
	for _, tt := range tests {
		got := testLoader.KeysFor(tt.cmd)
		for _, k := range tt.has {
			if !slices.Contains(got, k) {
				t.Errorf("testLoader.KeysFor(%d) lacks %s", tt.cmd, k)
			}
		}
		for _, k := range tt.lacks {
			if slices.Contains(got, k) {
				t.Errorf("testLoader.KeysFor(%d) has %s, which that command does not use", tt.cmd, k)
			}
		}
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		testLoader.RegisterCommandFlags(fs, tt.cmd)
		var names []string
		fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
		if !slices.Equal(names, got) {
			t.Errorf("testLoader.RegisterCommandFlags(%d) defined %v, want %v", tt.cmd, names, got)
		}
	}
}

// FuzzLoad feeds arbitrary files to Load: it may reject them but must not
// panic, and whatever it accepts must be valid.
func FuzzLoad(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	seeds = append(seeds, example, scenarios)
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("population: {users: 1e3, rate: .nan, ramp: 0}"))
	f.Add([]byte("population: {users: 18446744073709551615}"))
	f.Add([]byte("target: &a {name: *a}"))
	f.Add([]byte("? [a, b]\n: 1\n"))
	f.Add([]byte("canary: {schedule: 'CRON_TZ=UTC'}\nsoak: {profiles: [~, {name: a, users: 2, schedule: 'TZ=X\t@daily', thresholds: {max_loss: 0}}]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := testLoader.Load(path, nil, nil)
		if err != nil {
			return
		}
		if err := testLoader.Validate(c); err != nil {
			t.Errorf("testLoader.Load(%q) = %+v, nil, but Validate() = %v", b, c, err)
		}
	})
}
