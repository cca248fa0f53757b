package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Protocol is what the configuration knows of one protocol, from its
// adapter: the name target.protocol gives it, the old names still accepted,
// and its own section of keys, target.NAME, with their defaults, help and
// rules. The configuration names no protocol itself: the daemon's registry
// of adapters makes a Loader with theirs.
type Protocol struct {
	// Name is target.protocol's value for it.
	Name string
	// Aliases are old names of the protocol, still accepted: Load puts
	// Name in their place and says so in Config.Deprecated.
	Aliases []string
	// Section, if not nil, is the section's default: a struct whose
	// koanf-tagged fields are the section's keys. Config.Target.Sections
	// holds the loaded value, of the same type, under Name.
	Section any
	// Help describes each key of the section, by its dotted name within
	// it ("domain"); a test checks that it covers every key.
	Help map[string]string
	// Validate, if set, checks a loaded section (of Section's type); its
	// problems name keys within the section ("domain").
	Validate func(section any) []*ValidationError
	// Required, if set, checks the section of the protocol in use for
	// what only it needs, with the target it is used in: a mapped
	// protocol's mapping, and what target.catch_up asks of it.
	Required func(section any, t Target) error
	// InProcess says that an empty target.url means a reference server
	// in this process; every other protocol needs a URL.
	InProcess bool
	// Schemes are the target.url schemes the protocol takes; nil for
	// ws and wss.
	Schemes []string
}

// Loader loads and checks configurations for a set of protocols: their
// names, their sections' keys (which the environment and flags can set
// like any other) and their rules.
type Loader struct {
	protocols []Protocol
	// def is the default configuration (see Default).
	def   Config
	s     *schema
	byEnv map[string]leaf
	// envNames are the variables imcanary reads, for suggestions.
	envNames []string
	// listEnv maps the environment variable a list key would have to the
	// key, so that setting it gets a better error than "unknown".
	listEnv map[string]string
}

// NewLoader returns a loader for configurations of protocols, the first of
// which is the default protocol. It panics on no protocol at all, on
// a protocol without a name, a name given twice, or a section that is not a
// struct: those are the registry's bugs, not a user's.
func NewLoader(protocols ...Protocol) *Loader {
	if len(protocols) == 0 {
		panic("config: a loader needs a protocol")
	}
	seen := map[string]bool{}
	for _, p := range protocols {
		for _, n := range append([]string{p.Name}, p.Aliases...) {
			if n == "" || seen[n] {
				panic(fmt.Sprintf("config: protocol name %q empty or given twice", n))
			}
			seen[n] = true
		}
		if p.Section != nil && reflect.TypeOf(p.Section).Kind() != reflect.Struct {
			panic(fmt.Sprintf("config: protocol %s: section %T is not a struct", p.Name, p.Section))
		}
	}
	ld := &Loader{protocols: protocols, s: newSchema(reflect.TypeFor[Config](), protocols...)}
	ld.def = defaults()
	ld.def.Target.Protocol = protocols[0].Name
	ld.def.Target.Name = protocols[0].Name
	for _, p := range protocols {
		if p.Section != nil {
			if ld.def.Target.Sections == nil {
				ld.def.Target.Sections = map[string]any{}
			}
			ld.def.Target.Sections[p.Name] = p.Section
		}
	}
	ld.byEnv = make(map[string]leaf, len(ld.s.leaves))
	for _, l := range ld.s.leaves {
		ld.byEnv[l.env] = l
		ld.envNames = append(ld.envNames, l.env)
	}
	for _, v := range OtherEnv {
		ld.envNames = append(ld.envNames, v.Name)
	}
	ld.listEnv = make(map[string]string)
	for key := range ld.s.lists {
		ld.listEnv[EnvPrefix+strings.ToUpper(strings.ReplaceAll(key, ".", "_"))] = key
	}
	return ld
}

// Protocols returns the names target.protocol accepts (aliases aside), in
// the loader's order.
func (ld *Loader) Protocols() []string {
	names := make([]string, len(ld.protocols))
	for i, p := range ld.protocols {
		names[i] = p.Name
	}
	return names
}

// protocol returns the protocol named name, or one of whose aliases it is.
func (ld *Loader) protocol(name string) (Protocol, bool) {
	for _, p := range ld.protocols {
		if p.Name == name || slices.Contains(p.Aliases, name) {
			return p, true
		}
	}
	return Protocol{}, false
}

// Default returns the configuration used for every key a source leaves
// unset: the first protocol, a target named after it, and every
// protocol's section at its default.
func (ld *Loader) Default() Config {
	c := ld.def
	c.Target.Sections = maps.Clone(ld.def.Target.Sections)
	return c
}

// Section returns the loaded section of protocol name in c, or def when c
// has none (a Config built in code rather than loaded); a section of
// another type is a bug, and panics.
func Section[T any](c Config, name string, def T) T {
	v, ok := c.Target.Sections[name]
	if !ok {
		return def
	}
	return v.(T)
}
