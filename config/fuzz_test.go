package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// hostileYAML are configuration files that attack the YAML parser rather
// than the configuration: each must be refused with an error naming the
// file, quickly.
func hostileYAML() map[string]string {
	laughs := "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		laughs += n + ": &" + n + " [" + strings.Repeat("*"+prev+",", 8) + "*" + prev + "]\n"
		prev = n
	}
	return map[string]string{
		"billion laughs":      laughs,
		"deep flow nesting":   "target: " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000),
		"deep block nesting":  deepBlock(1000),
		"deep mapping":        "population: " + strings.Repeat("{a: ", 20000) + strings.Repeat("}", 20000),
		"alias cycle":         "target: &a {name: *a}\n",
		"merge key bomb":      "x: &x {a: 1}\ny: &y {<<: [*x, *x, *x, *x]}\npopulation: {<<: [*y, *y, *y, *y]}\n",
		"invalid utf-8":       "target: {name: \"\xff\xfe\"}\n",
		"invalid utf-8 key":   "targ\xffet: {name: a}\n",
		"nul byte":            "target: {name: a\x00b}\n",
		"huge scalar":         "target: {name: " + strings.Repeat("x", 1<<20) + "}\n",
		"huge number":         "population: {users: " + strings.Repeat("9", 10000) + "}\n",
		"tab indentation":     "target:\n\tname: a\n",
		"top-level scalar":    "hello",
		"complex key":         "? [a, b]\n: 1\n",
		"timestamp name":      "target: {name: 2001-12-14t21:59:43.10-05:00}\n",
		"nan rate":            "population: {rate: .nan}\n",
		"infinite rate":       "population: {rate: -.inf}\n",
		"overflowing users":   "population: {users: 18446744073709551616}\n",
		"duration overflow":   "population: {ramp: 9999999999999h}\n",
		"profiles not list":   "soak: {profiles: {name: a}}\n",
		"profile not mapping": "soak: {profiles: [1, [2], ~]}\n",
	}
}

// deepBlock nests n block mappings, one more space of indent each.
func deepBlock(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i) + "a:\n")
	}
	return b.String()
}

// TestLoadHostile runs the hostile files: each is an error (the few that
// are valid YAML but bad configuration too), with a message that names the
// file, within a second or so.
func TestLoadHostile(t *testing.T) {
	for name, body := range hostileYAML() {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hostile.yaml")
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := testLoader.Load(path, nil, nil)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("testLoader.Load(%.60q…) = nil, want an error", body)
			}
			checkLoadError(t, body, path, err)
			if took > 5*time.Second {
				t.Errorf("testLoader.Load(%.60q…) took %v", body, took)
			}
		})
	}
}

// checkLoadError checks what every error of Load must be: each problem
// (one element of the errors.Join) a message naming the file, in UTF-8;
// and each *ValidationError with its key, named in the message along with
// the value.
func checkLoadError(t *testing.T, body, path string, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" || !utf8.ValidString(msg) {
		t.Fatalf("testLoader.Load(%.200q) = error %q, want a UTF-8 message", body, msg)
	}
	problems := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		problems = j.Unwrap()
	}
	for _, p := range problems {
		pm := p.Error()
		if !strings.Contains(pm, path) {
			t.Errorf("testLoader.Load(%.200q): problem %q does not name the file %s", body, pm, path)
		}
		ve, ok := errors.AsType[*ValidationError](p)
		if !ok {
			continue
		}
		if ve.Key == "" || !strings.Contains(pm, ve.Key) {
			t.Errorf("testLoader.Load(%.200q): problem %q does not name its key %q", body, pm, ve.Key)
		}
		if ve.Err == nil || ve.Err.Error() == "" {
			t.Errorf("testLoader.Load(%.200q): problem %q has no reason", body, pm)
		}
		if ve.Value == nil {
			t.Errorf("testLoader.Load(%.200q): problem %q does not show the value given", body, pm)
		}
	}
}

// FuzzLoadErrors holds Load's errors to the standard on arbitrary
// files: never a panic, and every problem names the file; a rejected value
// names its key and the value. (FuzzLoad checks what Load accepts.)
func FuzzLoadErrors(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, body := range hostileYAML() {
		if len(body) > 4096 {
			body = body[:4096]
		}
		f.Add([]byte(body))
	}
	f.Add([]byte("population: {users: 0, rate: -1, ramp: 10, heartbeat: 1ms, deadline: 1h, lost_after: 1s}\nhttp: {listen: ':x'}\n"))
	f.Add([]byte("soak: {profiles: [{name: a, users: 1, duration: 0, thresholds: {max_loss: 2}}, {name: a}]}\ncanary: {schedule: '* * *'}\n"))
	f.Add([]byte("target: {protocol: xmpp, url: 'ftp://x', name: ''}\nshard: 3/2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := testLoader.Load(path, nil, nil); err != nil {
			checkLoadError(t, string(b), path, err)
		}
	})
}

// FuzzLoadEnv sets one IMCANARY_ variable to an arbitrary value: Load never
// panics, and a refusal names the variable and, when it is the value that
// is wrong, the key and the value. The secret's variable is never read,
// so its value can appear in no error.
func FuzzLoadEnv(f *testing.F) {
	for _, k := range testLoader.Keys() {
		f.Add(testLoader.s.byKey[k].env, "x")
	}
	f.Add("IMCANARY_POPULATION_USERS", "1e3")
	f.Add("IMCANARY_POPULATION_RAMP", "10")
	f.Add("IMCANARY_SOAK_PROFILES", "[]")
	f.Add("IMCANARY_NOPE", "secret-looking")
	f.Add(SecretEnv, "hunter2-secret")
	f.Add("IMCANARY_TARGET_NAME", "\xff")
	f.Fuzz(func(t *testing.T, name, value string) {
		if !strings.HasPrefix(name, EnvPrefix) || strings.Contains(name, "=") {
			return
		}
		_, err := testLoader.Load("", []string{name + "=" + value}, nil)
		if err == nil {
			return
		}
		msg := err.Error()
		if msg == "" {
			t.Fatalf("testLoader.Load(%s=%q) = error without a message", name, value)
		}
		if name == SecretEnv {
			t.Fatalf("testLoader.Load(%s=%q) = %v, want the secret's variable ignored", name, value, err)
		}
		problems := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			problems = j.Unwrap()
		}
		for _, p := range problems {
			ve, ok := errors.AsType[*ValidationError](p)
			switch {
			case !ok:
				if !namesVar(p.Error(), name) {
					t.Errorf("testLoader.Load(%s=%q): problem %q does not name the variable", name, value, p)
				}
			case ve.Key == "" || !strings.Contains(p.Error(), ve.Key):
				t.Errorf("testLoader.Load(%s=%q): problem %q does not name its key %q", name, value, p, ve.Key)
			case ve.Key == testLoader.byEnv[name].key && !namesVar(p.Error(), name):
				// A rule between keys may blame a key the variable did
				// not set; one about the variable's own key names it.
				t.Errorf("testLoader.Load(%s=%q): problem %q does not name the variable", name, value, p)
			}
		}
	})
}

// namesVar reports whether msg names the variable name, as it is or
// quoted.
func namesVar(msg, name string) bool {
	return strings.Contains(msg, name) || strings.Contains(msg, strconv.Quote(name))
}

// FuzzParseShard: ParseShard never panics, and what it accepts is a shard
// that exists.
func FuzzParseShard(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"0/1", ""}, {"2/3", ""}, {"auto/3", "imcanary-2"}, {"auto/3", "imcanary"},
		{"auto/3", "-"}, {"auto/1000", "x--1"}, {"3/2", ""}, {"1/0", ""}, {"/", ""}, {"-1/2", ""}, {"+1/2", ""}, {"0/99999999999999999999", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, spec, host string) {
		s, err := ParseShard(spec, host)
		if err != nil {
			if err.Error() == "" || s != (Shard{}) {
				t.Fatalf("ParseShard(%q, %q) = %+v, %q, want the zero Shard and a message", spec, host, s, err)
			}
			return
		}
		if s.Count < 1 || s.Count > maxShards || s.Index < 0 || s.Index >= s.Count {
			t.Fatalf("ParseShard(%q, %q) = %+v, which is no shard", spec, host, s)
		}
		if s.Next() < 0 || s.Next() >= s.Count || s.Prev() < 0 || s.Prev() >= s.Count {
			t.Fatalf("ParseShard(%q, %q) = %+v: neighbours %d, %d", spec, host, s, s.Prev(), s.Next())
		}
		if spec == "" && s != (Shard{Index: 0, Count: 1}) {
			t.Fatalf("ParseShard(\"\", %q) = %+v, want 0 of 1", host, s)
		}
	})
}
