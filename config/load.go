package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// layer is one source of configuration, held apart from the others until it
// has been checked so that its errors can name where the bad value came from.
type layer struct {
	ko *koanf.Koanf
	// origin names the place in this source that sets key: the file's
	// path, the environment variable or the flag.
	origin func(key string) string
}

// Load builds the configuration from Default(), then the YAML file at path
// (skipped when path is ""), then the IMCANARY_* entries of env (in
// os.Environ form), then the flags in flags that the user set explicitly
// (flags may be nil; see RegisterFlags). Later sources win key by key.
//
// It rejects unknown keys, unknown IMCANARY_* variables (except SecretEnv,
// which it ignores) and values of the wrong type, naming the source, the key
// and the value; then it returns the result of Validate, each error prefixed
// with the source that set the key. On error the Config is the zero value.
func Load(path string, env []string, flags *pflag.FlagSet) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(flatDefaults(), "."), nil); err != nil {
		return Config{}, fmt.Errorf("load defaults: %w", err)
	}

	var layers []layer
	if path != "" {
		l, err := fileLayer(path)
		if err != nil {
			return Config{}, err
		}
		layers = append(layers, l)
	}
	l, err := envLayer(env)
	if err != nil {
		return Config{}, err
	}
	layers = append(layers, l)
	if flags != nil {
		l, err := flagLayer(flags)
		if err != nil {
			return Config{}, err
		}
		layers = append(layers, l)
	}

	for _, l := range layers {
		if err := l.check(); err != nil {
			return Config{}, err
		}
		if err := k.Merge(l.ko); err != nil {
			return Config{}, fmt.Errorf("merge configuration: %w", err)
		}
	}

	var c Config
	if err := unmarshal(k, &c); err != nil {
		// Every layer decoded on its own, so this is a bug, not bad input.
		return Config{}, fmt.Errorf("decode configuration: %w", err)
	}
	c.deriveProfiles()

	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, attribute(layers, p))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// deriveProfiles fills in the keys of each soak profile whose default
// follows other keys, and drops empty lists so that "profiles: []" loads
// to the same Config as no profiles at all.
func (c *Config) deriveProfiles() {
	if len(c.Soak.Profiles) == 0 {
		c.Soak.Profiles = nil
	}
	if len(c.Target.Headers) == 0 {
		c.Target.Headers = nil
	}
	for i := range c.Soak.Profiles {
		p := &c.Soak.Profiles[i]
		if p.Deadline == 0 {
			p.Deadline = c.Population.Deadline
		}
		if p.LostAfter == 0 {
			p.LostAfter = 2 * p.Deadline
		}
	}
}

func fileLayer(path string) (layer, error) {
	ko := koanf.New(".")
	if err := ko.Load(file.Provider(path), yaml.Parser()); err != nil {
		// A *PathError already names the file; a parser error does not.
		if _, ok := errors.AsType[*fs.PathError](err); ok {
			return layer{}, fmt.Errorf("read configuration: %w", err)
		}
		return layer{}, fmt.Errorf("%s: %w", path, err)
	}
	return layer{ko: ko, origin: func(string) string { return path }}, nil
}

func envLayer(environ []string) (layer, error) {
	var (
		mine    []string
		unknown []error
	)
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || name == SecretEnv {
			// Dropped here, before any provider sees it, so the secret's
			// value cannot reach a map, an error or a log line.
			continue
		}
		if key := listEnv[name]; key != "" {
			unknown = append(unknown, fmt.Errorf("unknown environment variable %q: %s is a list, which only the configuration file can set", name, key))
			continue
		}
		if _, ok := byEnv[name]; !ok {
			// The value is left out: it may be something private that was
			// merely misnamed.
			unknown = append(unknown, fmt.Errorf("unknown environment variable %q", name))
			continue
		}
		mine = append(mine, kv)
	}
	if err := errors.Join(unknown...); err != nil {
		return layer{}, err
	}

	ko := koanf.New(".")
	p := env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return mine },
		TransformFunc: func(name, value string) (string, any) {
			return byEnv[name].key, value
		},
	})
	if err := ko.Load(p, nil); err != nil {
		return layer{}, fmt.Errorf("read environment: %w", err)
	}
	return layer{ko: ko, origin: func(key string) string {
		return "environment variable " + byKey[key].env
	}}, nil
}

func flagLayer(flags *pflag.FlagSet) (layer, error) {
	ko := koanf.New(".")
	// Only flags the user set, and only ours: main's flag set also holds
	// flags such as the config file path that are not configuration keys.
	p := posflag.ProviderWithFlag(flags, ".", nil, func(f *pflag.Flag) (string, any) {
		if _, ok := byKey[f.Name]; !ok || !f.Changed {
			return "", nil
		}
		// The string form goes through the same decode hooks as the file.
		return f.Name, f.Value.String()
	})
	if err := ko.Load(p, nil); err != nil {
		return layer{}, fmt.Errorf("read flags: %w", err)
	}
	return layer{ko: ko, origin: func(key string) string { return "flag --" + key }}, nil
}

// check rejects unknown keys and values that do not decode, then drops null
// values so that "users:" with nothing after it means "not set here" instead
// of erasing the default, and gives each soak profile the defaults of the
// keys it leaves out.
func (l layer) check() error {
	var errs []error
	for _, ke := range unknownKeys(root, l.ko.Raw(), "", "") {
		errs = append(errs, fmt.Errorf("%s: %w", l.origin(ke.key), ke))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}

	for key, v := range l.ko.All() {
		if v == nil {
			l.ko.Delete(key)
		}
	}
	if err := l.defaultProfiles(); err != nil {
		return err
	}

	if err := unmarshal(l.ko, &Config{}); err != nil {
		des := decodeErrors(err)
		if len(des) == 0 {
			return fmt.Errorf("%s: %w", l.origin(""), err)
		}
		for _, de := range des {
			errs = append(errs, fmt.Errorf("%s: %w", l.origin(de.Name()),
				&ValidationError{Key: de.Name(), Value: l.value(de.Name()), Err: de.Unwrap()}))
		}
		return errors.Join(errs...)
	}
	return nil
}

// keyError is a key that Config does not have.
type keyError struct {
	key    string
	dotted bool // a single YAML key containing the delimiter
}

func (e keyError) Error() string {
	if e.dotted {
		return fmt.Sprintf("unknown key %q: nest it instead of writing dots in one key", e.key)
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
func unknownKeys(s *schema, m map[string]any, at, rel string) []keyError {
	var out []keyError
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key, r := join(at, name), join(rel, name)
		switch {
		case strings.Contains(name, "."):
			out = append(out, keyError{key: key, dotted: true})
		case s.byKey[r].key != "":
		case s.sections[r]:
			// A section holding a scalar is left to the decoder, which
			// reports it as a type error on the section.
			if sub, ok := m[name].(map[string]any); ok {
				out = append(out, unknownKeys(s, sub, key, r)...)
			}
		case s.lists[r] != nil:
			// Likewise a list that is not one, or an element that is
			// not a mapping.
			list, _ := m[name].([]any)
			for i, e := range list {
				if sub, ok := e.(map[string]any); ok {
					out = append(out, unknownKeys(s.lists[r], sub, fmt.Sprintf("%s[%d]", key, i), "")...)
				}
			}
		default:
			out = append(out, keyError{key: key})
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

// listEnv maps the environment variable that a list key would have to the
// key, so that setting it gets a better error than "unknown".
var listEnv = func() map[string]string {
	m := make(map[string]string)
	for key := range root.lists {
		m[EnvPrefix+strings.ToUpper(strings.ReplaceAll(key, ".", "_"))] = key
	}
	return m
}()

// defaultProfiles merges profileDefaults into every profile of the layer,
// key by key, before anything is decoded: that way a key the file leaves out
// (or leaves empty) gets its default while an explicit zero stays zero, which
// a check for zero values after decoding could not tell apart. Anything that
// is not a list of mappings is left as it is for the decoder to reject.
// Null elements become empty profiles.
func (l layer) defaultProfiles() error {
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
func (l layer) value(key string) any {
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

// decodeErrors returns the innermost mapstructure errors in err, each naming
// one key, in the decoder's order (struct field order, so deterministic).
func decodeErrors(err error) []*mapstructure.DecodeError {
	switch e := err.(type) {
	case *mapstructure.DecodeError:
		if inner := decodeErrors(e.Unwrap()); len(inner) > 0 {
			return inner
		}
		return []*mapstructure.DecodeError{e}
	case interface{ Unwrap() []error }:
		var out []*mapstructure.DecodeError
		for _, sub := range e.Unwrap() {
			out = append(out, decodeErrors(sub)...)
		}
		return out
	case interface{ Unwrap() error }:
		return decodeErrors(e.Unwrap())
	}
	return nil
}

// attribute prefixes a validation problem with the source that set its key:
// the last layer holding the key, as that is the one that won.
func attribute(layers []layer, p *ValidationError) error {
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

func unmarshal(k *koanf.Koanf, out *Config) error {
	return k.UnmarshalWithConf("", out, koanf.UnmarshalConf{
		DecoderConfig: &mapstructure.DecoderConfig{
			ErrorUnused:      true,
			WeaklyTypedInput: true,
			DecodeHook: mapstructure.ComposeDecodeHookFunc(
				sectionHook,
				listHook,
				durationHook,
				intHook,
				floatHook,
				stringHook,
				mapstructure.StringToTimeDurationHookFunc(),
				mapstructure.TextUnmarshallerHookFunc(),
			),
			TagName: "koanf",
		},
	})
}

var (
	errDuration  = errors.New(`must be a duration with a unit, such as "500ms", "10s" or "1m30s"`)
	errInteger   = errors.New("must be a whole number")
	errRange     = errors.New("is out of range")
	errNumber    = errors.New("must be a number")
	errString    = errors.New("must be a single value, not a list or mapping")
	errSection   = errors.New("must be a mapping of keys")
	errList      = errors.New("must be a list")
	errTimestamp = errors.New("is read as a timestamp; quote it to use it as text")
)

var durationType = reflect.TypeFor[time.Duration]()

// The hooks below replace mapstructure's weak conversions for each kind of
// field so that errors say what was expected in words, and so that YAML
// values that weak typing would accept silently (ramp: 10 as ten nanoseconds,
// users: 1.5 as 1) are rejected.

// sectionHook rejects a scalar or list where a section of keys belongs.
func sectionHook(_, to reflect.Type, data any) (any, error) {
	if to.Kind() != reflect.Struct || to == durationType {
		return data, nil
	}
	if _, ok := data.(map[string]any); !ok {
		return nil, errSection
	}
	return data, nil
}

// listHook rejects anything but a list where a list belongs: weak typing
// would otherwise read a single mapping as a list of one.
func listHook(_, to reflect.Type, data any) (any, error) {
	if to.Kind() != reflect.Slice || reflect.ValueOf(data).Kind() == reflect.Slice {
		return data, nil
	}
	return nil, errList
}

// durationHook accepts strings that time.ParseDuration reads, and a bare
// number only when it is zero, where the unit does not matter.
func durationHook(_, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch v := data.(type) {
	case time.Duration:
		return v, nil
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return nil, errDuration
		}
		return d, nil
	}
	if f, ok := number(data); ok && f == 0 {
		return time.Duration(0), nil
	}
	return nil, errDuration
}

// intHook accepts integers that fit the field, floats with no fractional
// part (YAML 1e3) and decimal strings (environment and flags).
func intHook(_, to reflect.Type, data any) (any, error) {
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
	default:
		return data, nil
	}
	if to == durationType {
		return data, nil
	}
	bits := to.Bits()
	if s, ok := data.(string); ok {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, bits)
		if errors.Is(err, strconv.ErrRange) {
			return nil, errRange
		}
		if err != nil {
			return nil, errInteger
		}
		return n, nil
	}
	v := reflect.ValueOf(data)
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n := v.Int(); n < -1<<(bits-1) || n > 1<<(bits-1)-1 {
			return nil, errRange
		}
		return v.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if v.Uint() > 1<<(bits-1)-1 {
			return nil, errRange
		}
		return int64(v.Uint()), nil
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if f != math.Trunc(f) || math.IsInf(f, 0) {
			return nil, errInteger
		}
		// 2^(bits-1) is exact in a float64; the maximum int is not.
		if f < -math.Ldexp(1, bits-1) || f >= math.Ldexp(1, bits-1) {
			return nil, errRange
		}
		return int64(f), nil
	}
	return nil, errInteger
}

// floatHook accepts any number and strings that strconv.ParseFloat reads.
func floatHook(_, to reflect.Type, data any) (any, error) {
	if k := to.Kind(); k != reflect.Float32 && k != reflect.Float64 {
		return data, nil
	}
	if s, ok := data.(string); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, errNumber
		}
		return f, nil
	}
	if f, ok := number(data); ok {
		return f, nil
	}
	return nil, errNumber
}

// stringHook accepts scalars for string fields, spelled as YAML spells them
// (a bare name: 2024 becomes "2024", true becomes "true" rather than
// mapstructure's "1"), and rejects lists and mappings.
func stringHook(_, to reflect.Type, data any) (any, error) {
	if to.Kind() != reflect.String {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		return v, nil
	case time.Time:
		// The YAML parser has already turned the text into a time, and
		// reformatting it would not give back what was written.
		return nil, errTimestamp
	case bool:
		return strconv.FormatBool(v), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	}
	if _, ok := number(data); ok {
		return fmt.Sprint(data), nil
	}
	return nil, errString
}

// number returns data as a float64 if it is of a numeric kind.
func number(data any) (float64, bool) {
	v := reflect.ValueOf(data)
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(v.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return float64(v.Uint()), true
	case reflect.Float32, reflect.Float64:
		return v.Float(), true
	}
	return 0, false
}
