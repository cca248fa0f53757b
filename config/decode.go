package config

// Decoding the merged tree into Config and each protocol's section, with
// errors in words. The hooks replace mapstructure's weak conversions for
// each kind of field so that errors say what was expected, and so that
// YAML values that weak typing would accept silently (ramp: 10 as ten
// nanoseconds, users: 1.5 as 1) are rejected.

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/v2"
)

// fieldError is a value that did not decode: the key, as errors name it,
// and the reason.
type fieldError struct {
	name string
	err  error
}

func (e *fieldError) Error() string { return e.name + ": " + e.err.Error() }

// decodeErrors returns the innermost decoding errors in err, each naming
// one key, in the decoder's order (struct field order, so deterministic),
// with the keys of a protocol's section named in full.
func decodeErrors(err error) []*fieldError {
	switch e := err.(type) {
	case *fieldError:
		return []*fieldError{e}
	case *mapstructure.DecodeError:
		if inner := decodeErrors(e.Unwrap()); len(inner) > 0 {
			return inner
		}
		return []*fieldError{{name: e.Name(), err: e.Unwrap()}}
	case interface{ Unwrap() []error }:
		var out []*fieldError
		for _, sub := range e.Unwrap() {
			out = append(out, decodeErrors(sub)...)
		}
		return out
	case interface{ Unwrap() error }:
		return decodeErrors(e.Unwrap())
	}
	return nil
}

// sectionErrors is what decoding a protocol's section at key found, its
// keys named in full.
type sectionErrors struct {
	key string
	err error
}

func (e *sectionErrors) Error() string { return e.key + ": " + e.err.Error() }

func (e *sectionErrors) Unwrap() []error {
	var out []error
	for _, de := range decodeErrors(e.err) {
		out = append(out, &fieldError{name: e.key + "." + de.name, err: de.err})
	}
	if len(out) == 0 {
		out = append(out, &fieldError{name: e.key, err: e.err})
	}
	return out
}

// decode decodes the tree k into out: each protocol's section into its own
// type, in out.Target.Sections, and the rest into Config. A protocol with
// no keys in k gets its section's zero value: Load merges the defaults
// into the tree first.
func (ld *Loader) decode(k *koanf.Koanf, out *Config) error {
	k = k.Copy()
	var errs []error
	for _, p := range ld.protocols {
		if p.Section == nil {
			continue
		}
		key := "target." + p.Name
		v := reflect.New(reflect.TypeOf(p.Section))
		if k.Exists(key) {
			if _, ok := k.Get(key).(map[string]any); !ok {
				errs = append(errs, &fieldError{name: key, err: errSection})
			} else if err := unmarshal(k.Cut(key), v.Interface()); err != nil {
				errs = append(errs, &sectionErrors{key: key, err: err})
			}
			k.Delete(key)
		}
		if out.Target.Sections == nil {
			out.Target.Sections = map[string]any{}
		}
		out.Target.Sections[p.Name] = v.Elem().Interface()
	}
	sections := out.Target.Sections
	if err := unmarshal(k, out); err != nil {
		errs = append(errs, err)
	}
	out.Target.Sections = sections
	return errors.Join(errs...)
}

func unmarshal(k *koanf.Koanf, out any) error {
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
				boolHook,
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
	errBool      = errors.New("must be true or false")
)

var durationType = reflect.TypeFor[time.Duration]()

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

// boolHook accepts booleans and the strings strconv.ParseBool reads
// ("true", "false", "1", "0" and their like, from the environment and
// flags). It rejects numbers, which weak typing would read as true unless
// zero, and YAML 1.1's yes and no, which YAML 1.2 leaves as strings.
func boolHook(_, to reflect.Type, data any) (any, error) {
	if to.Kind() != reflect.Bool {
		return data, nil
	}
	switch v := data.(type) {
	case bool:
		return v, nil
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, errBool
		}
		return b, nil
	}
	return nil, errBool
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
