package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/version"

	"github.com/imcanary/imcanary/config"
)

// runOut runs imcanary in-process and returns its exit code, standard
// output and standard error.
func runOut(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestHelp: help goes to standard output with exit 0, in every spelling;
// each command's help has its synopsis and its flags, typed, and only the
// configuration keys it uses.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errOut := runOut(args...)
		if code != exitOK || errOut != "" {
			t.Errorf("imcanary %q = exit %d, stderr %q; want 0 and nothing on stderr", args, code, errOut)
		}
		for _, c := range commands {
			if !strings.Contains(out, "  "+c.name+" ") || !strings.Contains(out, c.summary) {
				t.Errorf("imcanary %q does not list command %s (%q):\n%s", args, c.name, c.summary, out)
			}
		}
		if strings.Contains(out, "--population.users int") {
			t.Errorf("imcanary %q lists run's flags; want the commands only:\n%s", args, out)
		}
		for _, v := range config.OtherEnv {
			if !strings.Contains(out, v.Name) {
				t.Errorf("imcanary %q does not mention %s", args, v.Name)
			}
		}
	}

	tests := []struct {
		cmd        string
		has, lacks []string
	}{
		{"run", []string{"Usage: imcanary [run]", "--population.users int ", "(default 100)", "--population.ramp duration ", "(default 10s)",
			"--population.rate float ", "--target.xmpp.register ", "--http.listen string", `(default "127.0.0.1:9464")`, "--web.enable-reload ",
			"-h, --help", config.SecretEnv},
			[]string{`(default "100")`, `(default "10s")`, "--target.xmpp.register string", config.HealthPasswordEnv}},
		{"canary", []string{"Usage: imcanary canary --once", "--once ", "--canary.users int", "--target.url string", "--data_dir"},
			[]string{"--http.listen", "--canary.schedule", "--canary.jitter", "--history.", "--population.users", "--shard", "--slo.objective"}},
		{"soak", []string{"Usage: imcanary soak --profile NAME", "--profile string", "--history.max_runs int", "--population.deadline duration",
			"--shard string", "--start_at string", "imcanary soak merge"},
			[]string{"--http.listen", "--canary.", "--population.users", "--population.slow_readers"}},
		{"config", []string{"Usage: imcanary config check [FILE]", "--web.config.file", "--population.users int", "--http.listen"}, nil},
		{"refserver", []string{"Usage: imcanary refserver", "--drop float", "--delay duration"}, []string{"--population."}},
		{"bench", []string{"Usage: imcanary bench", "--processes int"}, []string{"--population."}},
		{"health", []string{"Usage: imcanary health", "--timeout duration", "(default 2s)", config.HealthPasswordEnv}, []string{config.SecretEnv}},
		{"version", []string{"Usage: imcanary version"}, nil},
		{"help", []string{"Usage: imcanary help [COMMAND]"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			code, out, errOut := runOut("help", tt.cmd)
			if code != exitOK || errOut != "" {
				t.Fatalf("imcanary help %s = exit %d, stderr %q; want 0 and nothing on stderr", tt.cmd, code, errOut)
			}
			for _, h := range tt.has {
				if !strings.Contains(out, h) {
					t.Errorf("imcanary help %s lacks %q:\n%s", tt.cmd, h, out)
				}
			}
			for _, l := range tt.lacks {
				if strings.Contains(out, l) {
					t.Errorf("imcanary help %s has %q:\n%s", tt.cmd, l, out)
				}
			}
			// The two spellings print the same.
			spelt := []string{tt.cmd, "--help"}
			if tt.cmd == "help" {
				spelt = []string{"help", "help"}
			}
			if code, out2, errOut := runOut(spelt...); code != exitOK || out2 != out || errOut != "" {
				t.Errorf("imcanary %q = exit %d, stderr %q, and its help differs from imcanary help %s:\n%s", spelt, code, errOut, tt.cmd, out2)
			}
		})
	}
	for _, args := range [][]string{{"config", "check", "--help"}, {"canary", "-h"}} {
		if code, out, errOut := runOut(args...); code != exitOK || !strings.HasPrefix(out, "Usage: imcanary ") || errOut != "" {
			t.Errorf("imcanary %q = exit %d, stdout %.40q, stderr %q; want 0 and its help on stdout", args, code, out, errOut)
		}
	}
}

// TestUsageErrors: a usage error is what is wrong, in words, on standard
// error with a hint where the help is, and exit 2; never the whole help.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want []string // on stderr
	}{
		{[]string{"help", "nosuch"}, []string{`unknown command "nosuch"`, "Run 'imcanary help' for usage."}},
		{[]string{"runn"}, []string{`unknown command "runn": did you mean "run"?`, "Run 'imcanary help' for usage."}},
		{[]string{"run", "--population.user=5"}, []string{`imcanary run: unknown flag: --population.user: did you mean "--population.users"?`, "Run 'imcanary help run' for usage."}},
		{[]string{"--population.user=5"}, []string{`unknown flag: --population.user: did you mean "--population.users"?`}},
		{[]string{"soak", "--profile", "p", "--confg", "x"}, []string{`unknown flag: --confg: did you mean "--config"?`, "imcanary help soak"}},
		{[]string{"run", "--web.enable-reload=maybe"}, []string{`--web.enable-reload: "maybe": must be true or false`}},
		{[]string{"refserver", "--delay=abc"}, []string{`--delay: "abc": must be a duration with a unit`}},
		{[]string{"refserver", "--send-queue=1.5"}, []string{`--send-queue: "1.5": must be a whole number`}},
		{[]string{"refserver", "--drop=lots"}, []string{`--drop: "lots": must be a number`}},
		{[]string{"bench", "--processes=99999999999999999999"}, []string{`--processes: "99999999999999999999": is out of range`}},
		{[]string{"canary", "--once", "--http.listen=:1"}, []string{"unknown flag: --http.listen: imcanary canary does not use http.listen"}},
		{[]string{"soak", "--profile", "p", "--canary.users=3"}, []string{"imcanary soak does not use canary.users"}},
		{[]string{"run", "--target.xmpp.register", "false"}, []string{`unexpected argument "false": write --target.xmpp.register=false`}},
		{[]string{"canary", "--once", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"version", "--short"}, []string{"unknown flag: --short"}},
	}
	for _, tt := range tests {
		code, out, errOut := runOut(tt.args...)
		if code != exitUsage || out != "" {
			t.Errorf("imcanary %q = exit %d, stdout %q; want exit 2 and nothing on stdout", tt.args, code, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("imcanary %q: stderr %q lacks %q", tt.args, errOut, w)
			}
		}
		if strings.Contains(errOut, "Usage:") || strings.Contains(errOut, "strconv") || strings.Count(errOut, "\n") > 2 {
			t.Errorf("imcanary %q: stderr %q; want the error and a hint, not the help or strconv's words", tt.args, errOut)
		}
	}

	// health exits 1 for everything, on one line, for Docker.
	code, out, errOut := runOut("health", "--timeout=abc")
	if code != exitFail || out != "" || strings.Count(errOut, "\n") != 1 ||
		!strings.Contains(errOut, `--timeout: "abc": must be a duration with a unit`) || !strings.Contains(errOut, "imcanary help health") {
		t.Errorf("imcanary health --timeout=abc = exit %d, stdout %q, stderr %q; want exit 1 and one readable line", code, out, errOut)
	}
}

// TestVersion: --version and the version command print the same, and the
// version is never empty (TestMain fills it in as main does).
func TestVersion(t *testing.T) {
	code, out, _ := runOut("--version")
	code2, out2, _ := runOut("version")
	if code != exitOK || code2 != exitOK || out != out2 {
		t.Fatalf("imcanary --version = %d %q, imcanary version = %d %q; want both 0 and the same", code, out, code2, out2)
	}
	if want := "imcanary, version " + version.Version + " ("; version.Version == "" || !strings.HasPrefix(out, want) ||
		!strings.Contains(out, "go version:") {
		t.Errorf("imcanary --version = %q, want it to start %q with a version", out, want)
	}
}

func TestFillVersion(t *testing.T) {
	saved := [2]string{version.Version, version.Revision}
	t.Cleanup(func() { version.Version, version.Revision = saved[0], saved[1] })
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	tests := []struct {
		name                 string
		ldVersion, ldRev     string // set by -ldflags
		main                 string
		settings             []debug.BuildSetting
		wantVersion, wantRev string
	}{
		{"go install of a tag", "", "", "v1.2.3", nil, "1.2.3", ""},
		{"go build in a checkout", "", "", "v0.0.0-20260101120000-0123456789ab", vcs("0123456789abcdef", "false"),
			"0.0.0-20260101120000-0123456789ab", "0123456789abcdef"},
		{"work tree with changes", "", "", "v0.3.1-0.20260101120000-0123456789ab+dirty", vcs("0123456789abcdef", "true"),
			"0.3.1-0.20260101120000-0123456789ab+dirty", "0123456789abcdef-modified"},
		{"go run", "", "", "(devel)", nil, "(devel)", ""},
		{"nothing recorded", "", "", "", nil, "(devel)", ""},
		{"-ldflags wins", "2.0.0", "feedface", "v1.2.3", vcs("0123456789abcdef", "true"), "2.0.0", "feedface"},
	}
	for _, tt := range tests {
		version.Version, version.Revision = tt.ldVersion, tt.ldRev
		fillVersion(&debug.BuildInfo{Main: debug.Module{Path: "github.com/imcanary/imcanary", Version: tt.main}, Settings: tt.settings})
		if version.Version != tt.wantVersion || version.Revision != tt.wantRev {
			t.Errorf("%s: fillVersion() set version %q, revision %q; want %q, %q", tt.name, version.Version, version.Revision, tt.wantVersion, tt.wantRev)
		}
		// A development build without a revision says why; any other
		// says nothing more.
		why := unknownRevision(version.Version, version.Revision)
		if want := tt.wantVersion == "(devel)" && tt.wantRev == ""; (why != "") != want || want && !strings.Contains(why, "-buildvcs=false") {
			t.Errorf("%s: unknownRevision = %q", tt.name, why)
		}
	}
}

// TestLogDurations: durations are written as Go writes them in both
// formats, inside groups too; JSON would otherwise give nanoseconds.
func TestLogDurations(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.With("base", 2*time.Second).WithGroup("w").Info("m", "d", 1500*time.Millisecond,
			slog.Group("g", "inner", time.Minute, "n", 3), "any", any(250*time.Millisecond))
		got := buf.String()
		if format == "json" {
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatalf("json log %q: %v", got, err)
			}
			w, _ := m["w"].(map[string]any)
			g, _ := w["g"].(map[string]any)
			if m["base"] != "2s" || w["d"] != "1.5s" || g["inner"] != "1m0s" || w["any"] != "250ms" || g["n"] != 3.0 {
				t.Errorf("json log = %s; want durations as text (2s, 1.5s, 1m0s, 250ms) and numbers as numbers", got)
			}
			continue
		}
		for _, want := range []string{"base=2s", "w.d=1.5s", "w.g.inner=1m0s", "w.any=250ms", "w.g.n=3"} {
			if !strings.Contains(got, want) {
				t.Errorf("text log = %q, want %q in it", got, want)
			}
		}
	}
}

// TestHealthIdentifies: the health check names itself as imcanary's
// requests do, and takes its password from the variable config lists.
func TestHealthIdentifies(t *testing.T) {
	var gotUA, gotPass string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotUA = r.UserAgent()
		_, gotPass, _ = r.BasicAuth()
	}))
	t.Cleanup(srv.Close)
	t.Setenv(config.HealthPasswordEnv, "from-env")
	code, out, errOut := runOut("health", "--url", srv.URL, "--basic-auth.username", "prom")
	if code != exitOK {
		t.Fatalf("imcanary health = exit %d, %q %q", code, out, errOut)
	}
	if want := "imcanary/" + version.Version; gotUA != want || version.Version == "" {
		t.Errorf("imcanary health sent User-Agent %q, want %q", gotUA, want)
	}
	if gotPass != "from-env" {
		t.Errorf("imcanary health sent password %q, want the one in %s", gotPass, config.HealthPasswordEnv)
	}
}
