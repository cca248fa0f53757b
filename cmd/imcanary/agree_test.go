package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
)

// TestConfigCheckAgreesWithRun runs imcanary config check and imcanary run,
// as processes, on a table of good and bad configurations (a file, the
// environment and flags): a configuration check passes must start the
// daemon (its "metrics on" line), one it refuses must stop run with exit 2,
// and run's error must hold each of the problems check reported.
func TestConfigCheckAgreesWithRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts daemons")
	}
	bin := binary(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	secret := write("secret", "s3cret-do-not-show\n")
	token := write("token", "t0ken-do-not-show\n")
	// A directory in place of a file cannot be read, even by root, whom
	// a mode of 0 does not stop.
	unreadable := filepath.Join(dir, "unreadable")
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}
	small := "population: {users: 2, ramp: 100ms}\n"

	tests := []struct {
		name  string
		file  string // the configuration's body; "" runs without one
		env   []string
		flags []string
		want  []string // the problems config check must report; none: good
		warn  string   // what both must warn of, for a good configuration
	}{
		{name: "good file", file: small + "target: {secret_file: " + secret + ", headers: [{name: X-Token, value_file: " + token + "}]}\n"},
		{name: "no file at all"},
		{name: "health password in the environment", file: small, env: []string{config.HealthPasswordEnv + "=hunter2"}},
		{name: "target secret in the environment", file: small, env: []string{config.SecretEnv + "=hunter2"}},
		{name: "boolean flag alone", file: small, flags: []string{"--target.xmpp.resume"}},
		{name: "deprecated protocol name", file: small, env: []string{"IMCANARY_TARGET_PROTOCOL=embedded"},
			warn: `target.protocol \"embedded\" is deprecated: it is now called \"reference\"`},
		{name: "number in the environment", file: small, env: []string{"IMCANARY_POPULATION_USERS=abc"},
			want: []string{`environment variable IMCANARY_POPULATION_USERS: population.users: "abc": must be a whole number`}},
		{name: "unknown key", file: "population: {user: 5}\n",
			want: []string{`unknown key "population.user": did you mean "population.users"?`}},
		{name: "unknown variable", file: small, env: []string{"IMCANARY_POPULATION_USER=5"},
			want: []string{`unknown environment variable "IMCANARY_POPULATION_USER": did you mean "IMCANARY_POPULATION_USERS"?`}},
		{name: "missing secret_file", file: small + "target: {secret_file: " + secret + ".gone}\n",
			want: []string{`target.secret_file: "` + secret + `.gone": cannot be read: no such file or directory`}},
		{name: "unreadable header value_file", file: small + "target: {headers: [{name: X-Token, value_file: " + unreadable + "}]}\n",
			want: []string{`target.headers[0].value_file: "` + unreadable + `": cannot be read: is a directory`}},
		{name: "two errors in two layers", file: "population: {users: 2, group_size: 1}\n", env: []string{"IMCANARY_CANARY_DEADLINE=soon"},
			want: []string{`environment variable IMCANARY_CANARY_DEADLINE: canary.deadline: "soon": must be a duration`,
				`population.group_size: 1: must be at least 2`}},
		{name: "bad flag value", file: small, flags: []string{"--population.ramp=5x", "--target.xmpp.register=maybe"},
			want: []string{`flag --population.ramp: population.ramp: "5x": must be a duration`,
				`flag --target.xmpp.register: target.xmpp.register: "maybe": must be true or false`}},
		{name: "more sessions than files and ports", file: "population: {users: 1000000}\n",
			want: []string{"population.users: ", "RLIMIT_NOFILE"}},
		{name: "data_dir under a file", file: small, flags: []string{"--data_dir=" + filepath.Join(secret, "data")},
			want: []string{"data_dir"}},
		{name: "MQTT 3.1.1 password without a user name", file: small + "target: {protocol: mqtt, url: \"ws://127.0.0.1:1/mqtt\", secret_file: " + secret + "}\n",
			want: []string{"target.mqtt.username: empty while a target secret is set"}},
		{name: "missing web config", file: small, flags: []string{"--web.config.file=" + filepath.Join(dir, "web.yml")},
			want: []string{"--web.config.file"}},
	}
	base := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.EnvPrefix) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append(slices.Clone(base), tt.env...)
			flags := []string{"--http.listen=127.0.0.1:0", "--data_dir=" + filepath.Join(t.TempDir(), "data"), "--log.level=warn"}
			flags = append(flags, tt.flags...) // later flags win
			var file []string
			if tt.file != "" {
				file = []string{"--config", write(strings.ReplaceAll(tt.name, " ", "-")+".yaml", tt.file)}
			}

			check := exec.Command(bin, append(append([]string{"config", "check"}, file...), flags...)...)
			check.Env = env
			var checkOut, checkErr bytes.Buffer
			check.Stdout, check.Stderr = &checkOut, &checkErr
			checkCode := exitCode(t, check.Run())

			started, runCode, runErr := startRun(t, bin, append(append([]string{"run"}, file...), flags...), env)
			t.Logf("config check: exit %d %s%s; run: started %v, exit %d %s", checkCode, checkOut.String(), checkErr.String(), started, runCode, runErr)

			if tt.want == nil {
				if checkCode != exitOK || !strings.HasSuffix(checkOut.String(), "ok\n") {
					t.Errorf("config check = exit %d, %q %q; want 0 and ok", checkCode, checkOut.String(), checkErr.String())
				}
				if !started {
					t.Errorf("run did not start (exit %d): %s", runCode, runErr)
				}
				// config check warns in words, run in its log, which
				// quotes the message.
				if !strings.Contains(checkErr.String(), strings.ReplaceAll(tt.warn, `\"`, `"`)) || !strings.Contains(runErr, tt.warn) {
					t.Errorf("config check said %q, run logged %q; want both to warn %q", checkErr.String(), runErr, tt.warn)
				}
				return
			}
			if checkCode != exitUsage || checkOut.Len() != 0 {
				t.Errorf("config check = exit %d, stdout %q; want 2 and nothing on stdout", checkCode, checkOut.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(checkErr.String(), w) {
					t.Errorf("config check reported %q; want %q among its problems", checkErr.String(), w)
				}
			}
			if started || runCode != exitUsage {
				t.Errorf("run started %v, exit %d; want exit 2 for what config check refused", started, runCode)
			}
			for line := range strings.Lines(checkErr.String()) {
				if !strings.Contains(runErr, strings.TrimSuffix(line, "\n")) {
					t.Errorf("run's error %q lacks config check's problem %q", runErr, line)
				}
			}
			for _, s := range []string{"s3cret-do-not-show", "t0ken-do-not-show", "hunter2"} {
				if strings.Contains(checkErr.String()+runErr, s) {
					t.Errorf("a secret appears in the output: %q %q", checkErr.String(), runErr)
				}
			}
		})
	}
}

// startRun starts imcanary with args and env and waits for its "metrics
// on" line. A daemon that starts is stopped with SIGTERM, and must exit 0;
// one that does not exits by itself, with the code returned.
func startRun(t *testing.T, bin string, args, env []string) (started bool, code int, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	// Exits at the end of stdout, when the process does.
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(out); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(20 * time.Second)
	for !started {
		select {
		case line, ok := <-lines:
			if !ok {
				return false, exitCode(t, cmd.Wait()), errOut.String()
			}
			started = strings.Contains(line, "metrics on")
		case <-deadline:
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("imcanary %q neither started nor exited in 20s: %s", args, errOut.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	code = exitCode(t, cmd.Wait())
	if code != exitOK {
		t.Errorf("imcanary %q after SIGTERM: exit %d: %s", args, code, errOut.String())
	}
	return true, code, errOut.String()
}

// exitCode returns the exit code that err of a finished command stands for.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return exitOK
}

// TestBuiltVersion: a binary built without -ldflags (go build, as the
// tests build it) still says what it is: --version, imcanary_build_info
// and go_build_info agree, and the version is never empty.
func TestBuiltVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts a daemon")
	}
	bin := binary(t)
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(first, "imcanary, version ")
	v, _, _ = strings.Cut(v, " (branch: ")
	if !ok || v == "" {
		t.Fatalf("imcanary --version = %q, want a version", out)
	}

	cmd := exec.Command(bin, "run", "--http.listen=127.0.0.1:0", "--data_dir="+t.TempDir(), "--population.users=2", "--log.level=warn")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.EnvPrefix) })
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatalf("imcanary run printed nothing")
	}
	// "imcanary: metrics on http://ADDR/metrics, monitoring ..."
	_, addr, _ := strings.Cut(sc.Text(), "http://")
	addr, _, _ = strings.Cut(addr, "/metrics")
	go func() {
		for sc.Scan() {
		}
	}()
	fams, err := scrape(addr)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	info := fams["imcanary_build_info"].GetMetric()
	if len(info) != 1 || label(info[0], "version") != v || label(info[0], "shard") != "0" || label(info[0], "goversion") == "" {
		t.Errorf("imcanary_build_info = %v, want one series of version %q and shard 0", info, v)
	}
	if fams["go_build_info"] == nil {
		t.Error("no go_build_info")
	}
}
