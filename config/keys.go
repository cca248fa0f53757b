package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// EnvPrefix starts every environment variable that Load reads.
const EnvPrefix = "IMCANARY_"

// SecretEnv is the environment variable that holds the secret signing login
// tokens when target.secret_file is empty. It shares EnvPrefix but is not a
// configuration key: Load skips it so that the secret never enters Config.
const SecretEnv = EnvPrefix + "TARGET_SECRET"

// HealthPasswordEnv holds the basic-auth password of imcanary health when
// it is given no --basic-auth.password-file.
const HealthPasswordEnv = EnvPrefix + "HEALTH_PASSWORD"

// EnvVar is an environment variable that shares EnvPrefix but is not a
// configuration key.
type EnvVar struct {
	Name string
	// UsedBy are the commands that read it.
	UsedBy []string
	// Usage says what it holds, for help.
	Usage string
}

// OtherEnv lists the IMCANARY_* variables that are not configuration keys,
// each with the commands that read it. Load skips them without reading
// their values: strict parsing must not reject what imcanary documents for
// its other commands (a container's health check shares the daemon's
// environment), and the secrets they hold must never reach Config, an
// error or a log line.
var OtherEnv = []EnvVar{
	{Name: SecretEnv, UsedBy: []string{"run", "canary", "soak", "refserver", "bench"},
		Usage: "the secret that signs login tokens, when target.secret_file is empty"},
	{Name: HealthPasswordEnv, UsedBy: []string{"health"},
		Usage: "the password of --basic-auth.username, when --basic-auth.password-file is not given"},
}

// otherEnv reports whether name is one of OtherEnv.
func otherEnv(name string) bool {
	return slices.ContainsFunc(OtherEnv, func(v EnvVar) bool { return v.Name == name })
}

// leaf is one configuration key: a field of Config, or of a protocol's
// section, that holds a value rather than a nested section.
type leaf struct {
	key   string // dotted koanf path, e.g. "population.backoff.max"
	env   string // e.g. "IMCANARY_POPULATION_BACKOFF_MAX"
	index []int  // field index path for reflect.Value.FieldByIndex
	// protocol is the name of the protocol whose section holds the key,
	// "" for a key of Config; index is then into the section's struct.
	protocol string
}

// schema is the key set of one struct type: Config itself, or the element of
// a list such as soak.profiles, whose keys are relative to one element.
type schema struct {
	leaves   []leaf
	byKey    map[string]leaf
	sections map[string]bool // paths that must hold a mapping
	// lists maps a key holding a list of sections to the schema of one
	// element. Lists are file-only: an environment variable or a flag
	// holds one scalar, so they have no env name and no flag.
	lists map[string]*schema
	// listLeaves locate the lists, which a diff compares whole.
	listLeaves []leaf
	// names are every key, section and list, sorted: what an unknown key
	// may have been meant to be.
	names []string
}

// newSchema derives the key set of t from its koanf tags, and of each
// protocol's section under target.NAME from the section's, so that flags,
// environment names and the unknown-key check can never drift from the
// structs.
func newSchema(t reflect.Type, protocols ...Protocol) *schema {
	s := &schema{
		byKey:    make(map[string]leaf),
		sections: make(map[string]bool),
		lists:    make(map[string]*schema),
	}
	s.collect(t, nil, nil, "")
	for _, p := range protocols {
		if p.Section != nil {
			s.collect(reflect.TypeOf(p.Section), []string{"target", p.Name}, nil, p.Name)
		}
	}
	for _, l := range s.leaves {
		s.byKey[l.key] = l
	}
	// Every proper prefix of a key ("population", "population.backoff")
	// is a section, and so is every prefix of a list ("soak").
	for _, key := range slices.Concat(slices.Collect(maps.Keys(s.byKey)), slices.Collect(maps.Keys(s.lists))) {
		parts := strings.Split(key, ".")
		for i := 1; i < len(parts); i++ {
			s.sections[strings.Join(parts[:i], ".")] = true
		}
	}
	s.names = slices.Sorted(slices.Values(slices.Concat(
		slices.Collect(maps.Keys(s.byKey)), slices.Collect(maps.Keys(s.sections)), slices.Collect(maps.Keys(s.lists)))))
	return s
}

// collect walks t depth-first in field order; protocol is the protocol
// whose section t is, "" for Config. A field without a koanf tag is a
// programming error, so it panics when the schema is made rather than
// silently becoming a key nobody can spell; "-" marks a field the loader
// fills in itself.
func (s *schema) collect(t reflect.Type, path []string, index []int, protocol string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			panic(fmt.Sprintf("config: field %s.%s has no koanf tag", t.Name(), f.Name))
		}
		p := append(slices.Clip(path), tag)
		idx := append(slices.Clip(index), i)
		key := strings.Join(p, ".")
		switch {
		case isSection(f.Type):
			s.collect(f.Type, p, idx, protocol)
		case f.Type.Kind() == reflect.Slice && isSection(f.Type.Elem()):
			s.lists[key] = newSchema(f.Type.Elem())
			s.listLeaves = append(s.listLeaves, leaf{key: key, index: idx, protocol: protocol})
		default:
			s.leaves = append(s.leaves, leaf{
				key:      key,
				env:      EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_")),
				index:    idx,
				protocol: protocol,
			})
		}
	}
}

// isSection reports whether a field of type t holds nested keys.
func isSection(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]()
}

// Keys returns every configuration key that holds a single value, sorted, in
// the dotted form used by flags and error messages ("population.group_size").
// The lists (soak.profiles, target.headers) are not among them: only the
// file can set them.
func (ld *Loader) Keys() []string {
	keys := make([]string, 0, len(ld.s.leaves))
	for _, l := range ld.s.leaves {
		keys = append(keys, l.key)
	}
	slices.Sort(keys)
	return keys
}

// EnvName returns the environment variable that sets key, such as
// IMCANARY_POPULATION_GROUP_SIZE for population.group_size, or "" if key is
// not a configuration key.
func (ld *Loader) EnvName(key string) string {
	return ld.s.byKey[key].env
}

// defaultOf returns the default value of the key l, from Default or its
// protocol's section.
func (ld *Loader) defaultOf(l leaf) reflect.Value {
	if l.protocol == "" {
		return reflect.ValueOf(ld.def).FieldByIndex(l.index)
	}
	p, _ := ld.protocol(l.protocol)
	return reflect.ValueOf(p.Section).FieldByIndex(l.index)
}

// valueOf returns the value of the key l in c.
func (ld *Loader) valueOf(c Config, l leaf) any {
	if l.protocol == "" {
		return reflect.ValueOf(c).FieldByIndex(l.index).Interface()
	}
	p, _ := ld.protocol(l.protocol)
	return reflect.ValueOf(Section(c, p.Name, p.Section)).FieldByIndex(l.index).Interface()
}

// Changed returns the keys whose values differ between a and b, in the
// order of the structs: every key that holds one value, and each list
// (soak.profiles) as a whole. A reload asks it what a new configuration
// changes.
func (ld *Loader) Changed(a, b Config) []string {
	var keys []string
	for _, l := range slices.Concat(ld.s.leaves, ld.s.listLeaves) {
		if !reflect.DeepEqual(ld.valueOf(a, l), ld.valueOf(b, l)) {
			keys = append(keys, l.key)
		}
	}
	return keys
}

// flatDefaults returns the defaults as a flat key → value map with the
// fields' own types, the input of the confmap provider.
func (ld *Loader) flatDefaults() map[string]any {
	m := make(map[string]any, len(ld.s.leaves))
	for _, l := range ld.s.leaves {
		v := ld.defaultOf(l)
		if (v.Kind() == reflect.Map || v.Kind() == reflect.Slice) && v.IsNil() {
			// A mapping or list a protocol's section holds (a jsonws
			// rule) has no default: one loaded as nil would be a nil
			// map for the file's to merge into.
			continue
		}
		m[l.key] = v.Interface()
	}
	return m
}

// keyDocs describes each key: its flag usage, and the commands whose code
// reads it, which are the ones that offer it as a flag. Every key is the
// daemon's; the one-shot commands take only what changes what they do (a
// test follows their code and fails if one reads a key it does not offer).
// Another test checks that keyDocs covers exactly Keys(), so a new field
// cannot ship without a description.
var keyDocs = map[string]keyDoc{
	"http.listen":           {"address (host:port) of the HTTP server for /metrics, /healthz and /readyz", CommandRun},
	"target.name":           {"value of the target label on every series", everyone},
	"target.protocol":       {"protocol driver of the target", everyone | CommandJSONWS},
	"target.url":            {"WebSocket URL (ws:// or wss://) of the target; empty, for a protocol that has one, starts a reference server in this process", everyone | CommandJSONWS},
	"target.secret_file":    {"file holding the login-token signing secret; empty reads " + SecretEnv, everyone | CommandJSONWS},
	"target.catch_up":       {"on: each device fetches what it missed from the server's store (after a reconnect, at a gap), where the protocol can; off: what a device misses is lost", everyone},
	"population.users":      {"number of simulated users kept online", CommandRun},
	"population.ramp":       {"duration over which the users' first logins are spread", CommandRun},
	"population.group_size": {"number of users in each chat group", CommandRun},
	"population.groups":     {`group layout instead of group_size: comma-separated COUNTxSIZE entries such as "2x1000,5x100,50x10"; users are in several groups when the places outnumber them`, CommandRun},
	"population.devices":    {"sessions each user keeps online at once, each its own connection, 1 to 16", CommandRun},
	"population.rate":       {"messages per second per user, alternating direct and group", CommandRun},
	"population.heartbeat":  {"interval between keepalive pings of each session", everyone | CommandJSONWS},
	// Soak: a profile that leaves its deadline out takes this one.
	"population.deadline":                 {"delivery deadline from the intended send time, also the ack timeout", CommandRun | CommandSoak},
	"population.lost_after":               {"time after the intended send time when a missing message is lost", CommandRun},
	"population.prefix":                   {"prefix of every user and group name", everyone},
	"population.message_size":             {"minimum size of probe message bodies in bytes", CommandRun | CommandSoak},
	"population.backoff.initial":          {"cap of the first reconnect delay", everyone},
	"population.backoff.max":              {"cap of every reconnect delay", everyone},
	"population.max_connect_rate":         {"most connect attempts per second of the process, all its populations and reconnects included", everyone},
	"population.source_addrs":             {`local addresses to connect from, round-robin by user: IPs and IPv4 ranges such as "127.0.0.1-127.0.0.16", comma-separated; empty lets the kernel pick`, everyone | CommandJSONWS},
	"population.reactor":                  {"read idle sessions without a goroutine each (epoll): WebSocket (ws://, wss://), adapters reference, jsonws, centrifugo, mqtt, xmpp, openim, mattermost; on by default", everyone},
	"population.session_lifetime":         {"mean time a session stays logged in before its user logs out and back in (churn); 0 is no churn", CommandRun},
	"population.lag_threshold":            {"how long an acked message may go unreceived before its recipient counts as lagging; 0 is half the deadline", CommandRun},
	"population.across_shards":            {"lay population.users (and each soak profile's users), their groups and direct pairs out over all the shards, each logging in its slice, so that groups and conversations span shards; false gives each shard users of its own", CommandRun | CommandSoak},
	"population.slow_readers.fraction":    {"fraction of the users who read slowly (a slow-reader drill), 0 to below 1", CommandRun},
	"population.slow_readers.read_delay":  {"slow readers' pause after each delivery", CommandRun},
	"population.slow_readers.pause":       {"slow readers stop reading this long at their first delivery", CommandRun},
	"population.slow_readers.pause_every": {"slow readers pause again this long after each pause ends; 0 pauses once", CommandRun},
	"shard":                               {"this process's shard: I/N, or auto/N for the host name's trailing ordinal (a StatefulSet pod's, an Indexed Job pod's); empty is the only one", CommandRun | CommandSoak},
	"saturation.interval":                 {"how often imcanary samples its own health", everyone},
	"saturation.window":                   {"span each saturation limit is judged over, a multiple of saturation.interval", everyone},
	"saturation.max_send_lag":             {"highest p99 of imcanary's send lag before it is saturated", everyone},
	"saturation.max_receive_lag":          {"highest p99 of imcanary's receive lag before it is saturated", everyone},
	"saturation.max_sched_latency":        {"highest p99 of the Go scheduler latency before imcanary is saturated", everyone},
	"saturation.max_gc_pause":             {"longest GC pause before imcanary is saturated", everyone},
	"saturation.max_cpu":                  {"highest CPU use per usable core before imcanary is saturated, 0 to 1", everyone},
	"saturation.max_fds":                  {"highest ratio of open files to the file limit before imcanary is saturated", everyone},
	"saturation.max_ports":                {"highest ratio of used ephemeral ports from a local address toward one destination imcanary connects to before imcanary is saturated", everyone},
	"slo.objective":                       {"objective of the completeness and latency SLIs that the status page judges them by, such as 0.999; keep it equal to imcanary:slo_objective:ratio in the alert rules", CommandRun},
	// Canary: where a protocol whose passwords derive from the secret
	// keeps one of its own when none is configured. Soak: the history it saves its report to, and so
	// history.* below.
	"data_dir":                  {"directory of the run history (soak reports, canary rounds)", everyone | CommandJSONWS},
	"history.max_runs":          {"number of soak run reports kept, besides the pinned baselines (imcanary soak pin), which are kept whatever their age", CommandRun | CommandSoak},
	"history.max_age":           {"age after which soak reports are pruned (canary rounds are kept by count)", CommandRun | CommandSoak},
	"history.max_canary_rounds": {"number of canary rounds kept", CommandRun | CommandSoak},
	"canary.schedule":           {`cron spec of the canary rounds, such as "@every 30s" or "*/5 * * * *"; empty disables them`, CommandRun},
	"canary.deadline":           {"time a canary round waits for each delivery", CommandRun | CommandCanary},
	"canary.users":              {"number of users in each canary round", CommandRun | CommandCanary},
	"canary.messages":           {"number of messages each canary user sends per round", CommandRun | CommandCanary},
	"canary.jitter":             {"maximum random delay of each canary round's start", CommandRun},
	"canary.retry_after": {"after a failed canary round, run the next this soon rather than at the schedule's next time, to confirm or clear the failure; " +
		"back to the schedule after a round that passes. Positive and shorter than the schedule's interval, or 0 (the default): off, " +
		"since a retry adds rounds against a target that is failing, and no fixed default fits every schedule", CommandRun},

	// The cross-shard canary ring's clock exchange.
	"canary.max_clock_uncertainty": {"uncertainty of a peer shard's clock offset, measured through the target by the cross-shard canary, above which cross-shard latencies (the canary's, and with population.across_shards its neighbours' senders') are untrusted and kept out of the latency histogram", CommandRun | CommandCanary},
}

// Command is a command of imcanary that takes configuration keys as flags;
// the constants combine as a set.
type Command uint8

const (
	// CommandRun is the daemon, which reads every key. config check takes
	// the same keys: it checks what run would load.
	CommandRun Command = 1 << iota
	// CommandCanary is canary --once.
	CommandCanary
	// CommandSoak is soak --profile.
	CommandSoak
	// CommandJSONWS is jsonws try: a mapping walked against its server,
	// which reads the target's keys and the jsonws section only.
	CommandJSONWS
)

// everyone is every command that takes keys.
const everyone = CommandRun | CommandCanary | CommandSoak

// keyDoc is what keyDocs says of one key.
type keyDoc struct {
	usage string
	// uses are the commands that read the key.
	uses Command
}

// doc returns what is said of key: keyDocs for a key of Config, the
// protocol's Help for one of its section, which every command that talks to
// a target reads.
func (ld *Loader) doc(key string) keyDoc {
	l, ok := ld.s.byKey[key]
	if !ok || l.protocol == "" {
		return keyDocs[key]
	}
	p, _ := ld.protocol(l.protocol)
	rel := strings.TrimPrefix(key, "target."+p.Name+".")
	uses := everyone
	if p.Name == "jsonws" {
		uses |= CommandJSONWS
	}
	return keyDoc{usage: p.Name + ": " + p.Help[rel], uses: uses}
}

// KeysFor returns the keys that cmd reads and so offers as flags, sorted.
func (ld *Loader) KeysFor(cmd Command) []string {
	var keys []string
	for _, k := range ld.Keys() {
		if ld.doc(k).uses&cmd != 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// RegisterFlags defines a flag for every key on fs, as imcanary run and
// config check take them: RegisterCommandFlags(fs, CommandRun).
func (ld *Loader) RegisterFlags(fs *pflag.FlagSet) { ld.RegisterCommandFlags(fs, CommandRun) }

// RegisterCommandFlags defines a flag for each key that cmd reads, named
// exactly as the key (--population.users). Load overlays only the flags the
// user set, so the defaults shown never override the file or the
// environment. Each flag keeps the text it was given, which Load decodes by
// the same rules as the file and the environment ("--population.ramp=5s"),
// while its help shows the key's type and default as pflag shows its own
// typed flags; a boolean key given alone (--target.NAME.resume) is true.
// Like pflag itself, it panics if fs already defines one of the names.
func (ld *Loader) RegisterCommandFlags(fs *pflag.FlagSet, cmd Command) {
	for _, k := range ld.KeysFor(cmd) {
		usage := ld.doc(k).usage
		if k == "target.protocol" {
			// The loader's protocols, which keyDocs cannot know.
			usage += ": " + strings.Join(ld.Protocols(), ", ")
		}
		def := ld.defaultOf(ld.s.byKey[k])
		v := &flagValue{kind: kindOf(def.Type())}
		f := fs.VarPF(v, k, "", usage)
		f.DefValue = defaultText(def)
		if v.kind == "bool" {
			f.NoOptDefVal = "true"
		}
	}
}

// defaultText is a key's default as help shows it: a mapping or a list as
// the JSON the key takes (YAML's flow style), and none when it is empty,
// as pflag omits an empty string's; fmt would print "map[]".
func defaultText(def reflect.Value) string {
	switch def.Kind() {
	case reflect.Map, reflect.Slice:
		if def.Len() == 0 {
			return ""
		}
		if b, err := json.Marshal(def.Interface()); err == nil {
			return string(b)
		}
	}
	return fmt.Sprint(def.Interface())
}

// flagValue is the pflag.Value of a configuration key. It only keeps the
// text: decoding it is Load's, so that a flag means exactly what the same
// text means in the environment, and so that a bad value is reported with
// every other problem of the configuration instead of stopping the parse.
type flagValue struct {
	kind string // what Type returns
	text string
}

func (v *flagValue) String() string     { return v.text }
func (v *flagValue) Set(s string) error { v.text = s; return nil }

// Type names the key's kind as pflag names its own flags' ("int",
// "float64", "duration", "bool", "string"): help shows it beside the flag,
// and leaves a default that is not a string unquoted.
func (v *flagValue) Type() string { return v.kind }

// kindOf returns the Type of a key whose Go type is t.
func kindOf(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "duration"
	case t.Kind() == reflect.Bool:
		return "bool"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "int"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "float64"
	}
	return "string"
}
