package protocols

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/probe/openim"
)

const example = "../configs/imcanary.yaml"

// TestRegistry holds every adapter to what the loader and the daemon rely
// on: a name, a driver maker, help for exactly the keys of its section, and
// a default section its own rules accept.
func TestRegistry(t *testing.T) {
	ld := Loader()
	for _, a := range All {
		name := a.Config.Name
		if a.New == nil {
			t.Errorf("%s: no New", name)
		}
		var keys []string
		for _, k := range ld.Keys() {
			if rel, ok := strings.CutPrefix(k, "target."+name+"."); ok {
				keys = append(keys, rel)
			}
		}
		var help []string
		for k, v := range a.Config.Help {
			if v == "" {
				t.Errorf("%s: Help[%q] is empty", name, k)
			}
			help = append(help, k)
		}
		slices.Sort(help)
		if !slices.Equal(keys, help) {
			t.Errorf("%s: section keys %q, Help describes %q: want one description per key", name, keys, help)
		}
		if a.Config.Validate != nil && a.Config.Section != nil {
			if errs := a.Config.Validate(a.Config.Section); len(errs) > 0 {
				t.Errorf("%s: the default section is invalid: %v", name, errs)
			}
		}
		if got, ok := Lookup(name); !ok || got.Config.Name != name {
			t.Errorf("Lookup(%q) = %v, %v", name, got.Config.Name, ok)
		}
		for _, alias := range a.Config.Aliases {
			if got, ok := Lookup(alias); !ok || got.Config.Name != name {
				t.Errorf("Lookup(%q) = %v, %v; want %s", alias, got.Config.Name, ok, name)
			}
		}
	}
	// The first is the default, which must run with no target.url: a
	// fresh imcanary monitors a reference server in-process.
	if def := All[0].Config; def.Name != ld.Default().Target.Protocol || !def.InProcess {
		t.Errorf("default protocol %q (in-process %v), want the first of All, in-process", ld.Default().Target.Protocol, def.InProcess)
	}
}

// TestExampleIsDefault keeps configs/imcanary.yaml honest: it must hold
// every key, every protocol's section included, and loading it must give
// exactly the defaults.
func TestExampleIsDefault(t *testing.T) {
	ld := Loader()
	got, err := ld.Load(example, nil, nil)
	if err != nil {
		t.Fatalf("Load(%q) = %v, want nil error", example, err)
	}
	if want := ld.Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("Load(%q) = %+v, want %+v", example, got, want)
	}

	// Loaded over the defaults, a missing key would go unnoticed; read the
	// file on its own to see that each one is written out.
	k := koanf.New(".")
	if err := k.Load(file.Provider(example), yaml.Parser()); err != nil {
		t.Fatal(err)
	}
	// The lists are in the file but, being file-only, not in Keys().
	want := slices.Sorted(slices.Values(append(ld.Keys(), "population.behaviours", "soak.profiles", "target.headers")))
	if got := k.Keys(); !slices.Equal(got, want) {
		t.Errorf("keys of %s = %v, want %v", example, got, want)
	}
}

// TestExampleConfigsLoad keeps every shipped example configuration valid.
func TestExampleConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../configs/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example configs found: %v", err)
	}
	for _, f := range files {
		if _, err := Loader().Load(f, nil, nil); err != nil {
			t.Errorf("Load(%q) = %v, want nil", f, err)
		}
	}
}

// TestDeprecatedName: the reference protocol's old name still loads, as
// the reference protocol, and the configuration says it is deprecated.
func TestDeprecatedName(t *testing.T) {
	c, err := Loader().Load("", []string{"IMCANARY_TARGET_PROTOCOL=embedded"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`target.protocol "embedded" is deprecated: it is now called "reference"`}
	if c.Target.Protocol != "reference" || !slices.Equal(c.Deprecated, want) {
		t.Errorf("Load(protocol embedded) = protocol %q, deprecated %q; want reference, %q", c.Target.Protocol, c.Deprecated, want)
	}
	if !InProcess(c) {
		t.Errorf("InProcess(protocol embedded, no url) = false, want true")
	}
}

// TestExampleNamesEveryProtocol: the comment on target.protocol in the
// example configuration lists every protocol the registry has.
func TestExampleNamesEveryProtocol(t *testing.T) {
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	end := strings.Index(text, "\n  protocol:")
	start := strings.LastIndex(text[:end], "# Protocol of the IM server")
	if start < 0 || end < 0 {
		t.Fatalf("%s: no comment on target.protocol", example)
	}
	comment := text[start:end]
	for _, p := range Loader().Protocols() {
		if !regexp.MustCompile(`\b` + p + `\b`).MatchString(comment) {
			t.Errorf("%s: the comment on target.protocol does not name %s:\n%s", example, p, comment)
		}
	}
}

// TestListAndMappingFlags: a key that holds a list or a mapping shows its
// default in help as the YAML flow text its flag takes, none when empty,
// and its flag takes that text.
func TestListAndMappingFlags(t *testing.T) {
	ld := Loader()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	ld.RegisterFlags(fs)
	for key, want := range map[string]string{
		"target.openim.platforms":      "[5,3,4,7,2,1,6,8,9]",
		"target.jsonws.delivery.match": "",
	} {
		if got := fs.Lookup(key).DefValue; got != want {
			t.Errorf("--%s default %q, want %q", key, got, want)
		}
	}
	if err := fs.Parse([]string{"--target.openim.platforms=[5,3]", "--target.jsonws.delivery.match={type: msg, code: \"200..299\"}"}); err != nil {
		t.Fatal(err)
	}
	// A file with a whole mapping, which the flag changes a rule of.
	cfg, err := ld.Load("../configs/jsonws-reference.yaml", nil, fs)
	if err != nil {
		t.Fatal(err)
	}
	if got := config.Section[openim.Config](cfg, "openim", openim.DefaultConfig()).Platforms; !slices.Equal(got, []int{5, 3}) {
		t.Errorf("platforms from the flag: %v, want [5 3]", got)
	}
	match := config.Section[jsonws.Config](cfg, "jsonws", jsonws.DefaultConfig()).Delivery.Match
	if want := map[string]any{"type": "msg", "code": "200..299"}; !reflect.DeepEqual(match, want) {
		t.Errorf("delivery.match from the flag: %v, want %v", match, want)
	}
}
