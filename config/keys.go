package config

import (
	"fmt"
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

// The key set is derived from Config's koanf tags so that flags, environment
// names and the unknown-key check can never drift from the struct.
var (
	leaves   = collectLeaves(reflect.TypeFor[Config](), nil, nil)
	byKey    = indexLeaves(func(l leaf) string { return l.key })
	byEnv    = indexLeaves(func(l leaf) string { return l.env })
	sections = collectSections()
)

// collectLeaves walks t depth-first in field order. A field without a koanf
// tag is a programming error in this package, so it panics at init rather
// than silently becoming a key nobody can spell.
func collectLeaves(t reflect.Type, path []string, index []int) []leaf {
	var out []leaf
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if tag == "" || tag == "-" {
			panic(fmt.Sprintf("config: field %s.%s has no koanf tag", t.Name(), f.Name))
		}
		p := append(slices.Clip(path), tag)
		idx := append(slices.Clip(index), i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, collectLeaves(f.Type, p, idx)...)
			continue
		}
		key := strings.Join(p, ".")
		out = append(out, leaf{
			key:   key,
			env:   EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_")),
			index: idx,
		})
	}
	return out
}

func indexLeaves(name func(leaf) string) map[string]leaf {
	m := make(map[string]leaf, len(leaves))
	for _, l := range leaves {
		m[name(l)] = l
	}
	return m
}

// collectSections returns every proper prefix of a key ("population",
// "population.backoff"): the paths that must hold a mapping.
func collectSections() map[string]bool {
	m := make(map[string]bool)
	for _, l := range leaves {
		parts := strings.Split(l.key, ".")
		for i := 1; i < len(parts); i++ {
			m[strings.Join(parts[:i], ".")] = true
		}
	}
	return m
}

// Keys returns every configuration key, sorted, in the dotted form used by
// flags and error messages ("population.group_size").
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
	"http.listen":                "address (host:port) of the HTTP server for /metrics, /healthz and /readyz",
	"target.name":                "value of the target label on every series",
	"target.protocol":            "protocol driver of the target",
	"target.url":                 "WebSocket URL (ws:// or wss://) of the target; empty with protocol embedded starts an embedded target",
	"target.secret_file":         "file holding the login-token signing secret; empty reads " + SecretEnv,
	"population.users":           "number of simulated users kept online",
	"population.ramp":            "duration over which the users' first logins are spread",
	"population.group_size":      "number of users in each chat group",
	"population.rate":            "messages per second per user, alternating direct and group",
	"population.heartbeat":       "interval between keepalive pings of each session",
	"population.deadline":        "delivery deadline from the intended send time, also the ack timeout",
	"population.lost_after":      "time after the intended send time when a missing message is lost",
	"population.prefix":          "prefix of every user and group name",
	"population.message_size":    "minimum size of probe message bodies in bytes",
	"population.backoff.initial": "cap of the first reconnect delay",
	"population.backoff.max":     "cap of every reconnect delay",
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
