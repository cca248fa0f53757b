package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestClosest(t *testing.T) {
	keys := testLoader.Keys()
	tests := []struct {
		name       string
		candidates []string
		want       string
	}{
		{"population.userz", keys, "population.users"},
		{"population.user", keys, "population.users"},
		{"Population.Users", keys, "population.users"},
		{"population.group-size", keys, "population.group_size"},
		{"canary.jiter", keys, "canary.jitter"},
		{"canary.usrs", keys, "canary.users"},
		{"population.slow_reader.fraction", keys, "population.slow_readers.fraction"},
		{"populaton.users", keys, "population.users"},
		{"saturation.max_cpus", keys, "saturation.max_cpu"},
		// Three edits, all in the one word that differs: not a typo.
		{"population.size", keys, ""},
		{"population.foo", keys, ""},
		{"nothing", keys, ""},
		{"population.users", keys, ""}, // itself is no suggestion
		{"IMCANARY_POPULATION_USER", testLoader.envNames, "IMCANARY_POPULATION_USERS"},
		{"IMCANARY_HEALTH_PASWORD", testLoader.envNames, HealthPasswordEnv},
		{"IMCANARY_TARGET_SECRETS", testLoader.envNames, SecretEnv},
		{"IMCANARY_B", testLoader.envNames, ""},
		{"confg", []string{"config", "log.level"}, "config"},
		{"runn", []string{"run", "canary", "soak"}, "run"},
		{"x", []string{"run", "soak"}, ""},
		{"ab", []string{"ba", "abc"}, "ba"}, // a swap is one edit; the first of equals wins
	}
	for _, tt := range tests {
		if got := Closest(tt.name, tt.candidates); got != tt.want {
			t.Errorf("Closest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestMentions(t *testing.T) {
	tests := []struct {
		text, key string
		want      bool
	}{
		{"must be at least twice population.deadline (2s)", "population.deadline", true},
		{"must be less than population.deadline.", "population.deadline", true},
		{"population.deadline", "population.deadline", true},
		{"must be less than population.deadline_x", "population.deadline", false},
		{"see population.deadlines", "population.deadline", false},
		{"see xpopulation.deadline", "population.deadline", false},
		{"twice soak.profiles[0].deadline (20s)", "soak.profiles[0].deadline", true},
		{"soak.profiles[10].name has the same", "soak.profiles[1]", false},
		{"soak.profiles[1] has the same name", "soak.profiles[1]", true},
	}
	for _, tt := range tests {
		if got := mentions(tt.text, tt.key); got != tt.want {
			t.Errorf("mentions(%q, %q) = %v, want %v", tt.text, tt.key, got, tt.want)
		}
	}
}

// TestLoadEverySource: the problems of every source are reported even when
// one of them cannot be read at all, and then nothing is validated, as what
// that source holds is unknown.
func TestLoadEverySource(t *testing.T) {
	tests := []struct {
		name string
		body string // "" for a file that does not exist
		env  []string
		args []string
		want []string
	}{
		{
			name: "missing file and a bad variable",
			env:  []string{"IMCANARY_POPULATION_USERS=abc", "IMCANARY_CANARY_USERS=1"},
			// canary.users=1 is invalid, but not judged without the file.
			want: []string{"missing.yaml: no such file or directory",
				`environment variable IMCANARY_POPULATION_USERS: population.users: "abc": must be a whole number`},
		},
		{
			name: "the same key wrong in two sources",
			body: "population: {users: many}\n",
			env:  []string{"IMCANARY_POPULATION_USERS=abc"},
			args: []string{"--population.users=xyz"},
			want: []string{`population.users: "many": must be a whole number`,
				`environment variable IMCANARY_POPULATION_USERS: population.users: "abc": must be a whole number`,
				`flag --population.users: population.users: "xyz": must be a whole number`},
		},
		{
			name: "a misspelt key and its right name's rule",
			body: "population: {deadlin: 1s, lost_after: 3s}\n",
			want: []string{`unknown key "population.deadlin": did you mean "population.deadline"?`},
		},
		{
			name: "a profile that is no mapping and a duplicate of its name",
			body: "soak: {profiles: [5, {name: a, users: 2}, {name: a, users: 2}]}\n",
			want: []string{`soak.profiles[0]: 5: must be a mapping of keys`,
				`soak.profiles[2].name: "a": must be unique: soak.profiles[1] has the same name`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "missing.yaml")
			if tt.body != "" {
				path = writeConfig(t, tt.body)
			}
			var fs *pflag.FlagSet
			if tt.args != nil {
				fs = parseFlags(t, tt.args...)
			}
			_, err := testLoader.Load(path, tt.env, fs)
			if err == nil {
				t.Fatalf("testLoader.Load() = nil error, want %q", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("testLoader.Load() = %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("testLoader.Load() problem %d = %q, want %q in it", i, lines[i], w)
				}
			}
		})
	}
}

// TestLoadFiles: the files the configuration names are checked at load,
// from whichever source names them, without their content in any error and
// without reading what is not a regular file.
func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("hunter2\x00\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad-header")
	if err := os.WriteFile(bad, []byte("hunter2\r\nInjected: yes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	c, err := testLoader.Load("", []string{"IMCANARY_TARGET_SECRET_FILE=" + secret}, nil)
	if err != nil || c.Target.SecretFile != secret {
		t.Errorf("testLoader.Load(secret_file %s) = %v, want it loaded", secret, err)
	}

	_, err = testLoader.Load("", []string{"IMCANARY_TARGET_SECRET_FILE=" + secret + ".gone"}, nil)
	want := `environment variable IMCANARY_TARGET_SECRET_FILE: target.secret_file: "` + secret + `.gone": cannot be read: no such file or directory`
	if err == nil || err.Error() != want || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("testLoader.Load(missing secret_file) = %v, want %s, matching fs.ErrNotExist", err, want)
	}

	_, err = testLoader.Load(writeConfig(t, "target: {headers: [{name: X-A, value_file: "+bad+"}]}\n"), nil, nil)
	if err == nil || !strings.Contains(err.Error(), `target.headers[0].value_file: "`+bad+`": holds a line break`) ||
		strings.Contains(err.Error(), "hunter2") {
		t.Errorf("testLoader.Load(header with a line break) = %v, want the key and file named, and not the content", err)
	}

	// A pipe the shell's <(...) would make: opened, not read, so what
	// the daemon reads is still there, and nothing blocks.
	done := make(chan error, 1)
	go func() {
		_, err := testLoader.Load("", []string{"IMCANARY_TARGET_SECRET_FILE=" + fifo}, parseFlags(t))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("testLoader.Load(secret_file a named pipe) = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("testLoader.Load(secret_file a named pipe) blocked")
	}

	if os.Geteuid() != 0 {
		locked := filepath.Join(dir, "locked")
		if err := os.WriteFile(locked, []byte("x"), 0o000); err != nil {
			t.Fatal(err)
		}
		_, err := testLoader.Load("", []string{"IMCANARY_TARGET_SECRET_FILE=" + locked}, nil)
		if err == nil || !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "cannot be read: permission denied") {
			t.Errorf("testLoader.Load(unreadable secret_file) = %v, want permission denied", err)
		}
	}
}
