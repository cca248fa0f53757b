package config

import (
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

// leaf is one configuration key: a field of Config that holds a value rather
// than a nested section.
type leaf struct {
	key   string // dotted koanf path, e.g. "population.backoff.max"
	env   string // e.g. "IMCANARY_POPULATION_BACKOFF_MAX"
	index []int  // field index path for reflect.Value.FieldByIndex
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
}

// The key set is derived from Config's koanf tags so that flags, environment
// names and the unknown-key check can never drift from the struct.
var (
	root     = newSchema(reflect.TypeFor[Config]())
	leaves   = root.leaves
	byKey    = root.byKey
	byEnv    = indexLeaves(func(l leaf) string { return l.env })
	sections = root.sections
)

func newSchema(t reflect.Type) *schema {
	s := &schema{
		byKey:    make(map[string]leaf),
		sections: make(map[string]bool),
		lists:    make(map[string]*schema),
	}
	s.collect(t, nil, nil)
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
	return s
}

// collect walks t depth-first in field order. A field without a koanf tag
// is a programming error in this package, so it panics at init rather than
// silently becoming a key nobody can spell.
func (s *schema) collect(t reflect.Type, path []string, index []int) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if tag == "" || tag == "-" {
			panic(fmt.Sprintf("config: field %s.%s has no koanf tag", t.Name(), f.Name))
		}
		p := append(slices.Clip(path), tag)
		idx := append(slices.Clip(index), i)
		key := strings.Join(p, ".")
		switch {
		case isSection(f.Type):
			s.collect(f.Type, p, idx)
		case f.Type.Kind() == reflect.Slice && isSection(f.Type.Elem()):
			s.lists[key] = newSchema(f.Type.Elem())
		default:
			s.leaves = append(s.leaves, leaf{
				key:   key,
				env:   EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_")),
				index: idx,
			})
		}
	}
}

// isSection reports whether a field of type t holds nested keys.
func isSection(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]()
}

func indexLeaves(name func(leaf) string) map[string]leaf {
	m := make(map[string]leaf, len(leaves))
	for _, l := range leaves {
		m[name(l)] = l
	}
	return m
}

// Keys returns every configuration key that holds a single value, sorted, in
// the dotted form used by flags and error messages ("population.group_size").
// The list soak.profiles is not among them: only the file can set it.
func Keys() []string {
	keys := make([]string, 0, len(leaves))
	for _, l := range leaves {
		keys = append(keys, l.key)
	}
	slices.Sort(keys)
	return keys
}

// EnvName returns the environment variable that sets key, such as
// IMCANARY_POPULATION_GROUP_SIZE for population.group_size, or "" if key is
// not a configuration key.
func EnvName(key string) string {
	return byKey[key].env
}

// flatDefaults returns Default() as a flat key → value map with the fields'
// own types, the input of the confmap provider.
func flatDefaults() map[string]any {
	d := reflect.ValueOf(Default())
	m := make(map[string]any, len(leaves))
	for _, l := range leaves {
		m[l.key] = d.FieldByIndex(l.index).Interface()
	}
	return m
}

// help is the flag usage of each key. A test checks that it covers exactly
// Keys(), so a new field cannot ship without a description.
var help = map[string]string{
	"http.listen":                         "address (host:port) of the HTTP server for /metrics, /healthz and /readyz",
	"target.name":                         "value of the target label on every series",
	"target.protocol":                     "protocol driver of the target",
	"target.url":                          "WebSocket URL (ws:// or wss://) of the target; empty with protocol embedded starts an embedded target",
	"target.xmpp.domain":                  "xmpp: XMPP domain of the probe users",
	"target.xmpp.muc_service":             "xmpp: MUC service of the group rooms (default conference.DOMAIN)",
	"target.xmpp.register":                "xmpp: create users by in-band registration (XEP-0077)",
	"target.xmpp.resume":                  "xmpp: stream-management resumption (hides loss for minutes; off by default)",
	"target.centrifugo.group_namespace":   "centrifugo: channel namespace of group chats",
	"target.centrifugo.direct_namespace":  "centrifugo: namespace of user-limited direct channels",
	"target.centrifugo.token_ttl":         "centrifugo: lifetime of the connection tokens imcanary signs",
	"target.centrifugo.recover":           "centrifugo: recover missed publications on resubscribe (counted late)",
	"target.secret_file":                  "file holding the login-token signing secret; empty reads " + SecretEnv,
	"population.users":                    "number of simulated users kept online",
	"population.ramp":                     "duration over which the users' first logins are spread",
	"population.group_size":               "number of users in each chat group",
	"population.rate":                     "messages per second per user, alternating direct and group",
	"population.heartbeat":                "interval between keepalive pings of each session",
	"population.deadline":                 "delivery deadline from the intended send time, also the ack timeout",
	"population.lost_after":               "time after the intended send time when a missing message is lost",
	"population.prefix":                   "prefix of every user and group name",
	"population.message_size":             "minimum size of probe message bodies in bytes",
	"population.backoff.initial":          "cap of the first reconnect delay",
	"population.backoff.max":              "cap of every reconnect delay",
	"population.max_connect_rate":         "most connect attempts per second of each population, reconnects included",
	"population.source_addrs":             `local addresses to connect from, round-robin by user: IPs and IPv4 ranges such as "127.0.0.1-127.0.0.16", comma-separated; empty lets the kernel pick`,
	"population.session_lifetime":         "mean time a session stays logged in before its user logs out and back in (churn); 0 is no churn",
	"population.lag_threshold":            "how long an acked message may go unreceived before its recipient counts as lagging; 0 is half the deadline",
	"population.slow_readers.fraction":    "fraction of the users who read slowly (a slow-reader drill), 0 to below 1",
	"population.slow_readers.read_delay":  "slow readers' pause after each delivery",
	"population.slow_readers.pause":       "slow readers stop reading this long at their first delivery",
	"population.slow_readers.pause_every": "slow readers pause again this long after each pause ends; 0 pauses once",
	"shard":                               "this daemon's shard: I/N, or auto/N for the host name's trailing ordinal (a StatefulSet pod's); empty is the only one",
	"saturation.interval":                 "how often imcanary samples its own health",
	"saturation.window":                   "span each saturation limit is judged over, a multiple of saturation.interval",
	"saturation.max_send_lag":             "highest p99 of imcanary's send lag before it is saturated",
	"saturation.max_receive_lag":          "highest p99 of imcanary's receive lag before it is saturated",
	"saturation.max_sched_latency":        "highest p99 of the Go scheduler latency before imcanary is saturated",
	"saturation.max_gc_pause":             "longest GC pause before imcanary is saturated",
	"saturation.max_cpu":                  "highest CPU use per usable core before imcanary is saturated, 0 to 1",
	"saturation.max_fds":                  "highest ratio of open files to the file limit before imcanary is saturated",
	"saturation.max_ports":                "highest ratio of used ephemeral ports of a local address before imcanary is saturated",
	"slo.objective":                       "objective of the completeness and latency SLIs that the status page judges them by, such as 0.999; keep it equal to imcanary:slo_objective:ratio in the alert rules",
	"data_dir":                            "directory of the run history (soak reports, canary rounds)",
	"history.max_runs":                    "number of soak run reports kept",
	"history.max_age":                     "age after which soak reports and canary rounds are pruned",
	"history.max_canary_rounds":           "number of canary rounds kept",
	"canary.schedule":                     `cron spec of the canary rounds, such as "@every 30s" or "*/5 * * * *"; empty disables them`,
	"canary.deadline":                     "time a canary round waits for each delivery",
	"canary.users":                        "number of users in each canary round",
	"canary.messages":                     "number of messages each canary user sends per round",
	"canary.jitter":                       "maximum random delay of each canary round's start",
}

// RegisterFlags defines one string flag per key on fs, named exactly as the
// key (--population.users) and showing its default. Load overlays only the
// flags the user set, so the defaults shown here never override the file or
// the environment. Values are strings so that Load parses them with the same
// rules as the file ("--population.ramp=5s"). Like pflag itself, it panics if
// fs already defines one of the names.
func RegisterFlags(fs *pflag.FlagSet) {
	d := reflect.ValueOf(Default())
	for _, k := range Keys() {
		usage := help[k]
		if k == "target.protocol" {
			// Built here, not in help, because drivers are appended to
			// Protocols after this package is initialised.
			usage += ": " + strings.Join(Protocols, ", ")
		}
		fs.String(k, fmt.Sprint(d.FieldByIndex(byKey[k].index).Interface()), usage)
	}
}
