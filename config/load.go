package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	yamlv3 "go.yaml.in/yaml/v3"
)

// layer is one source of configuration, held apart from the others until it
// has been checked so that its errors can name where the bad value came from.
type layer struct {
	// ko holds the source's keys; check drops those at fault.
	ko *koanf.Koanf
	// origin names the place in this source that sets key: the file's
	// path, the environment variable or the flag.
	origin func(key string) string
}

// Load builds the configuration from Default, then the YAML file at path
// (skipped when path is ""), then the IMCANARY_* entries of env (in
// os.Environ form), then the flags in flags that the user set explicitly
// (flags may be nil; see RegisterFlags). Later sources win key by key.
//
// It rejects unknown keys, unknown IMCANARY_* variables (except those of
// OtherEnv, which it ignores) and values of the wrong type, naming the
// source, the key and the value, and the closest key to an unknown one; then
// the problems of Validate, each prefixed with the source that set the key;
// then a target.secret_file or a target.headers value_file that cannot be
// read or is empty, naming the file but never its content. It reports every
// problem of every source at once, as an errors.Join, one per line. A value
// that its source got wrong is left out of the result that is validated, so
// that the default standing in for it is not blamed as well, and neither is
// a rule between it and another key. On error the Config is the zero value.
func (ld *Loader) Load(path string, env []string, flags *pflag.FlagSet) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(ld.flatDefaults(), "."), nil); err != nil {
		return Config{}, fmt.Errorf("load defaults: %w", err)
	}

	var (
		layers []*layer
		errs   []error
		// unread is set when a source could not be read at all: what it
		// holds is unknown, so the merged result is not validated.
		unread bool
	)
	if path != "" {
		l, err := fileLayer(path)
		if err != nil {
			errs, unread = append(errs, err), true
		} else {
			layers = append(layers, l)
		}
	}
	l, envErrs := ld.envLayer(env)
	errs = append(errs, envErrs...)
	if l != nil {
		layers = append(layers, l)
	} else {
		unread = true
	}
	if flags != nil {
		l, err := ld.flagLayer(flags)
		if err != nil {
			errs, unread = append(errs, err), true
		} else {
			layers = append(layers, l)
		}
	}

	// rejected are the keys whose value a source got wrong, dropped from
	// it before the merge.
	rejected := make(map[string]bool)
	for _, l := range layers {
		lerrs, ok := l.check(ld, rejected)
		errs = append(errs, lerrs...)
		unread = unread || !ok
		if err := k.Merge(l.ko); err != nil {
			return Config{}, fmt.Errorf("merge configuration: %w", err)
		}
	}
	if unread {
		return Config{}, errors.Join(errs...)
	}

	var c Config
	if err := ld.decode(k, &c); err != nil {
		// Every layer decoded on its own, so this is a bug, not bad input.
		return Config{}, fmt.Errorf("decode configuration: %w", err)
	}
	if p, ok := ld.protocol(c.Target.Protocol); ok && p.Name != c.Target.Protocol {
		c.Deprecated = append(c.Deprecated, fmt.Sprintf("target.protocol %q is deprecated: it is now called %q", c.Target.Protocol, p.Name))
		c.Target.Protocol = p.Name
	}
	for _, key := range c.deriveProfiles() {
		// A deadline taken from population.deadline is as wrong as it.
		if rejected["population.deadline"] {
			rejected[key] = true
		}
	}

	// problem holds the keys found wrong, so that a header already wrong
	// is not also read.
	var problem []string
	for _, p := range ld.problems(c) {
		if !blamesRejected(p, rejected) {
			errs = append(errs, attribute(layers, p))
			problem = append(problem, p.Key)
		}
	}
	for _, p := range c.fileProblems() {
		if !blamesRejected(p, rejected) && !slices.ContainsFunc(problem, func(k string) bool { return within(p.Key, entryOf(k)) }) {
			errs = append(errs, attribute(layers, p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// blamesRejected reports whether the problem p is about a key that a source
// got wrong, or one inside it, or names such a key in its reason (a rule
// between two keys, such as "must be at least twice population.deadline"):
// the value it judged is a default standing in for what the user wrote.
func blamesRejected(p *ValidationError, rejected map[string]bool) bool {
	reason := p.Err.Error()
	for key := range rejected {
		if within(p.Key, key) || mentions(reason, key) {
			return true
		}
	}
	return false
}

// within reports whether key is parent or is inside it: itself, a key of the
// section parent, or of an element of the list parent.
func within(key, parent string) bool {
	rest, ok := strings.CutPrefix(key, parent)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// entryOf returns the list element that key is in ("target.headers[2]" for
// "target.headers[2].name"), or key itself outside a list.
func entryOf(key string) string {
	if i := strings.LastIndexByte(key, ']'); i >= 0 {
		return key[:i+1]
	}
	return key
}

// mentions reports whether text names key as a whole word.
func mentions(text, key string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], key)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(key)
		// A full stop after it ends the sentence, not the key.
		if end < len(text) && text[end] == '.' && (end+1 == len(text) || !keyChar(text[end+1])) {
			end++
		}
		if (start == 0 || !keyChar(text[start-1])) && (end == len(text) || !keyChar(text[end])) {
			return true
		}
		i = start + 1
	}
}

// keyChar reports whether c can be part of a key as errors write it.
func keyChar(c byte) bool {
	return c == '_' || c == '.' || c == '[' || c == ']' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z'
}

// deriveProfiles fills in the keys of each soak profile whose default
// follows other keys, and drops empty lists so that "profiles: []" loads
// to the same Config as no profiles at all. It returns the keys of the
// deadlines it took from population.deadline.
func (c *Config) deriveProfiles() []string {
	var derived []string
	if len(c.Soak.Profiles) == 0 {
		c.Soak.Profiles = nil
	}
	if len(c.Target.Headers) == 0 {
		c.Target.Headers = nil
	}
	if len(c.Population.Behaviours) == 0 {
		c.Population.Behaviours = nil
	}
	for i := range c.Soak.Profiles {
		p := &c.Soak.Profiles[i]
		if len(p.Behaviours) == 0 {
			p.Behaviours = nil
		}
		if p.Deadline == 0 {
			p.Deadline = c.Population.Deadline
			derived = append(derived, fmt.Sprintf("soak.profiles[%d].deadline", i))
		}
		if p.LostAfter == 0 {
			p.LostAfter = 2 * p.Deadline
		}
	}
	return derived
}

func fileLayer(path string) (*layer, error) {
	ko := koanf.New(".")
	if err := ko.Load(file.Provider(path), yaml.Parser()); err != nil {
		// A *PathError already names the file; a parser error does not.
		if _, ok := errors.AsType[*fs.PathError](err); ok {
			return nil, fmt.Errorf("read configuration: %w", err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &layer{ko: ko, origin: func(string) string { return path }}, nil
}

// envLayer returns the layer of the variables of environ that are keys, and
// an error for each other IMCANARY_* variable but those of OtherEnv. The
// layer is nil if the environment could not be read.
func (ld *Loader) envLayer(environ []string) (*layer, []error) {
	var (
		mine    []string
		unknown []error
	)
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || otherEnv(name) {
			// Dropped here, before any provider sees it, so that a
			// secret's value cannot reach a map, an error or a log line.
			continue
		}
		if key := ld.listEnv[name]; key != "" {
			unknown = append(unknown, fmt.Errorf("unknown environment variable %q: %s is a list, which only the configuration file can set", name, key))
			continue
		}
		if _, ok := ld.byEnv[name]; !ok {
			// The value is left out: it may be something private that was
			// merely misnamed.
			err := fmt.Errorf("unknown environment variable %q", name)
			if near := Closest(name, ld.envNames); near != "" {
				err = fmt.Errorf("%w: did you mean %q?", err, near)
			}
			unknown = append(unknown, err)
			continue
		}
		mine = append(mine, kv)
	}

	ko := koanf.New(".")
	p := env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return mine },
		TransformFunc: func(name, value string) (string, any) {
			return ld.byEnv[name].key, value
		},
	})
	if err := ko.Load(p, nil); err != nil {
		return nil, append(unknown, fmt.Errorf("read environment: %w", err))
	}
	return &layer{ko: ko, origin: func(key string) string {
		return "environment variable " + ld.s.byKey[key].env
	}}, unknown
}

func (ld *Loader) flagLayer(flags *pflag.FlagSet) (*layer, error) {
	ko := koanf.New(".")
	// Only flags the user set, and only ours: main's flag set also holds
	// flags such as the config file path that are not configuration keys.
	p := posflag.ProviderWithFlag(flags, ".", nil, func(f *pflag.Flag) (string, any) {
		if _, ok := ld.s.byKey[f.Name]; !ok || !f.Changed {
			return "", nil
		}
		// The string form goes through the same decode hooks as the file;
		// a mapping or a list is written as YAML's flow style
		// ({ctrl.id: "*"}, [5,3]), as help shows its default.
		text := f.Value.String()
		if k := ld.defaultOf(ld.s.byKey[f.Name]).Kind(); k == reflect.Map || k == reflect.Slice {
			var v any
			if err := yamlv3.Unmarshal([]byte(text), &v); err == nil && v != nil {
				return f.Name, v
			}
		}
		return f.Name, text
	})
	if err := ko.Load(p, nil); err != nil {
		return nil, fmt.Errorf("read flags: %w", err)
	}
	return &layer{ko: ko, origin: func(key string) string { return "flag --" + key }}, nil
}

// check rejects unknown keys and values that do not decode, then drops null
// values so that "users:" with nothing after it means "not set here" instead
// of erasing the default, and gives each soak profile the defaults of the
// keys it leaves out.
//
// Every problem is returned, and the keys at fault are dropped from the
// layer, so that the others can still be merged and validated; the keys
// whose values were wrong are added to rejected. ok is false if the layer
// could not be decoded even so, and must not be trusted.
func (l *layer) check(ld *Loader, rejected map[string]bool) (errs []error, ok bool) {
	for _, ke := range unknownKeys(ld.s, l.ko.Raw(), "", "", nil) {
		errs = append(errs, fmt.Errorf("%s: %w", l.origin(ke.key), ke))
		l.drop(ke.path)
		if ke.closest != "" {
			// What was written under the wrong name is missing from
			// the right one: its default must not be blamed for it.
			rejected[ke.closest] = true
		}
	}

	for key, v := range l.ko.All() {
		if v == nil {
			l.ko.Delete(key)
		}
	}
	if err := l.defaultProfiles(); err != nil {
		return append(errs, err), false
	}

	// The decoder reports every field it cannot decode at once, so a
	// second pass only confirms that dropping them was enough; a key
	// that fails again could not be dropped, and the layer is given up.
	dropped := make(map[string]bool)
	for range 2 {
		err := ld.decode(l.ko, &Config{})
		if err == nil {
			return errs, true
		}
		des := decodeErrors(err)
		if len(des) == 0 || slices.ContainsFunc(des, func(de *fieldError) bool { return dropped[de.name] }) {
			return append(errs, fmt.Errorf("%s: %w", l.origin(""), err)), false
		}
		for _, de := range des {
			errs = append(errs, fmt.Errorf("%s: %w", l.origin(de.name),
				&ValidationError{Key: de.name, Value: l.value(de.name), Err: de.err}))
		}
		for _, de := range des {
			rejected[de.name], dropped[de.name] = true, true
			l.drop(parsePath(de.name))
		}
		if err := l.defaultProfiles(); err != nil {
			return append(errs, err), false
		}
	}
	return errs, false
}

// drop removes what path leads to from the layer. An element of a list
// becomes an empty mapping instead, so that the other elements keep their
// places (and errors their indices); defaultProfiles then gives a profile
// back the defaults of what was dropped.
func (l *layer) drop(path []step) {
	raw := l.ko.Raw() // a deep copy, so ours to change
	var at any = raw
	for i, st := range path {
		last := i == len(path)-1
		switch v := at.(type) {
		case map[string]any:
			if last {
				delete(v, st.key)
			}
			at = v[st.key]
		case []any:
			if st.index < 0 || st.index >= len(v) {
				return
			}
			if last {
				v[st.index] = map[string]any{}
			}
			at = v[st.index]
		default:
			return
		}
	}
	ko := koanf.New(".")
	if err := ko.Load(confmap.Provider(raw, ""), nil); err == nil {
		l.ko = ko
	}
}

// step is one step of a path into a layer's tree: a key of a mapping, or
// (when index is not -1) an element of a list.
type step struct {
	key   string
	index int
}

// parsePath reads a key as errors show it ("soak.profiles[2].users") into
// steps. Its names hold no dots: a YAML key that does is reported, and
// dropped, before anything is decoded.
func parsePath(key string) []step {
	var path []step
	for part := range strings.SplitSeq(key, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			path = append(path, step{key: name, index: -1})
		}
		for rest != "" {
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				break
			}
			i, err := strconv.Atoi(rest[:end])
			if err != nil {
				break
			}
			path = append(path, step{index: i})
			rest = strings.TrimPrefix(rest[end+1:], "[")
		}
	}
	return path
}

// keyError is a key that Config does not have.
type keyError struct {
	key     string
	path    []step // where it is in the layer
	dotted  bool   // a single YAML key containing the delimiter
	closest string // the key most likely meant, if any
}

func (e keyError) Error() string {
	switch {
	case e.dotted:
		return fmt.Sprintf("unknown key %q: nest it instead of writing dots in one key", e.key)
	case e.closest != "":
		return fmt.Sprintf("unknown key %q: did you mean %q?", e.key, e.closest)
	}
	return fmt.Sprintf("unknown key %q", e.key)
}

// unknownKeys walks the nested map m and returns the keys that are neither a
// key, a section nor a list of s, sorted. rel is m's path within s, for
// looking keys up; at is its path as errors show it, which differs inside a
// list ("soak.profiles[2]" against ""). It walks the map itself rather than
// using koanf's flattened keys, which would read a single YAML key
// "population.users" as the nested key and so let it through to a less
// helpful error from mapstructure.
func unknownKeys(s *schema, m map[string]any, at, rel string, path []step) []keyError {
	var out []keyError
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key, r := join(at, name), join(rel, name)
		p := append(slices.Clip(path), step{key: name, index: -1})
		switch {
		case strings.Contains(name, "."):
			out = append(out, keyError{key: key, path: p, dotted: true})
		case s.byKey[r].key != "":
		case s.sections[r]:
			// A section holding a scalar is left to the decoder, which
			// reports it as a type error on the section.
			if sub, ok := m[name].(map[string]any); ok {
				out = append(out, unknownKeys(s, sub, key, r, p)...)
			}
		case s.lists[r] != nil:
			// Likewise a list that is not one, or an element that is
			// not a mapping.
			list, _ := m[name].([]any)
			for i, e := range list {
				if sub, ok := e.(map[string]any); ok {
					out = append(out, unknownKeys(s.lists[r], sub, fmt.Sprintf("%s[%d]", key, i), "", append(slices.Clip(p), step{index: i}))...)
				}
			}
		default:
			ke := keyError{key: key, path: p}
			if near := Closest(r, s.names); near != "" {
				// Shown as the key is shown, inside its list element.
				ke.closest = key[:len(key)-len(r)] + near
			}
			out = append(out, ke)
		}
	}
	return out
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// defaultProfiles merges profileDefaults into every profile of the layer,
// key by key, before anything is decoded: that way a key the file leaves out
// (or leaves empty) gets its default while an explicit zero stays zero, which
// a check for zero values after decoding could not tell apart. Anything that
// is not a list of mappings is left as it is for the decoder to reject.
// Null elements become empty profiles.
func (l *layer) defaultProfiles() error {
	const key = "soak.profiles"
	list, ok := l.ko.Get(key).([]any) // a deep copy, so ours to change
	if !ok {
		return nil
	}
	defaults := toMap(reflect.ValueOf(profileDefaults), "name", "users")
	for i, e := range list {
		if e == nil {
			// "- " with nothing after it: a profile with no keys, so
			// that the errors name the two it lacks.
			e = map[string]any{}
			list[i] = e
		}
		if m, ok := e.(map[string]any); ok {
			mergeMissing(m, defaults)
		}
	}
	if err := l.ko.Set(key, list); err != nil {
		return fmt.Errorf("%s: set profile defaults: %w", l.origin(key), err)
	}
	return nil
}

// toMap turns the struct v into a nested map keyed by koanf tags, leaving
// out the top-level keys in skip.
func toMap(v reflect.Value, skip ...string) map[string]any {
	m := make(map[string]any)
	for i := range v.NumField() {
		tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("koanf"), ",")
		switch f := v.Field(i); {
		case slices.Contains(skip, tag):
		case isSection(f.Type()):
			m[tag] = toMap(f)
		default:
			m[tag] = f.Interface()
		}
	}
	return m
}

// mergeMissing copies into m every key of defaults that m lacks or holds as
// null, descending into sections that both hold as mappings.
func mergeMissing(m, defaults map[string]any) {
	for k, d := range defaults {
		switch v := m[k].(type) {
		case nil:
			if dm, ok := d.(map[string]any); ok {
				d = maps.Clone(dm) // each profile gets its own
			}
			m[k] = d
		case map[string]any:
			if dm, ok := d.(map[string]any); ok {
				mergeMissing(v, dm)
			}
		}
	}
}

// value returns the value of key in the layer as it was given. Keys inside a
// list ("soak.profiles[2].users") are looked up in the raw tree, as koanf's
// own keys stop at the list.
func (l *layer) value(key string) any {
	if !strings.Contains(key, "[") {
		return l.ko.Get(key)
	}
	var v any = l.ko.Raw()
	for key != "" {
		if key[0] == '[' {
			end := strings.IndexByte(key, ']')
			list, ok := v.([]any)
			if end < 0 || !ok {
				return nil
			}
			i, err := strconv.Atoi(key[1:end])
			if err != nil || i < 0 || i >= len(list) {
				return nil
			}
			v, key = list[i], key[end+1:]
			continue
		}
		key = strings.TrimPrefix(key, ".")
		end := strings.IndexAny(key, ".[")
		if end < 0 {
			end = len(key)
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v, key = m[key[:end]], key[end:]
	}
	return v
}

// attribute prefixes a validation problem with the source that set its key:
// the last layer holding the key, as that is the one that won.
func attribute(layers []*layer, p *ValidationError) error {
	// Only the file sets lists, so a key inside one belongs to the layer
	// holding the list.
	key, _, _ := strings.Cut(p.Key, "[")
	for _, l := range slices.Backward(layers) {
		if l.ko.Exists(key) {
			return fmt.Errorf("%s: %w", l.origin(p.Key), p)
		}
	}
	return p
}
