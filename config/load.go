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

	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, attribute(layers, p))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
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
// of erasing the default.
func (l layer) check() error {
	var errs []error
	for _, ke := range unknownKeys(l.ko.Raw(), "") {
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

	if err := unmarshal(l.ko, &Config{}); err != nil {
		des := decodeErrors(err)
		if len(des) == 0 {
			return fmt.Errorf("%s: %w", l.origin(""), err)
		}
		for _, de := range des {
			errs = append(errs, fmt.Errorf("%s: %w", l.origin(de.Name()),
				&ValidationError{Key: de.Name(), Value: l.ko.Get(de.Name()), Err: de.Unwrap()}))
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

// unknownKeys walks the nested map m (at path prefix) and returns the keys
// that are neither a key nor a section of Config, sorted. It walks the map
// itself rather than using koanf's flattened keys, which would read a single
// YAML key "population.users" as the nested key and so let it through to a
// less helpful error from mapstructure.
func unknownKeys(m map[string]any, prefix string) []keyError {
	var out []keyError
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		switch {
		case strings.Contains(name, "."):
			out = append(out, keyError{key: key, dotted: true})
		case byKey[key].key != "":
		case sections[key]:
			// A section holding a scalar is left to the decoder, which
			// reports it as a type error on the section.
			if sub, ok := m[name].(map[string]any); ok {
				out = append(out, unknownKeys(sub, key)...)
			}
		default:
			out = append(out, keyError{key: key})
		}
	}
	return out
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
	for _, l := range slices.Backward(layers) {
		if l.ko.Exists(p.Key) {
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
