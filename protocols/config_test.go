package protocols

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
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
