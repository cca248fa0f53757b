package main

// There is no Docker engine in CI, so the Dockerfile is checked here: a
// small parser reads it, its go build is run as written, and the binary and
// the runtime stage are held to what the image promises (static, non-root,
// the port and data directory the configuration uses, a health check that
// works without a shell).

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/daemon"
	"github.com/imcanary/imcanary/internal/testwait"
	"github.com/imcanary/imcanary/protocols"
)

// repoRoot is the build context: the Dockerfile copies the whole module.
const repoRoot = "../.."

// instruction is one Dockerfile instruction, continuations joined and
// comments dropped.
type instruction struct {
	cmd   string            // upper case: FROM, RUN, COPY, ...
	flags map[string]string // options before the arguments (--from, --mount, --interval)
	args  string            // the rest, as written
	line  int               // where it starts, for messages
}

// exec returns args in exec form (a JSON array), or an error if they are
// in shell form.
func (in instruction) exec() ([]string, error) {
	if !strings.HasPrefix(in.args, "[") {
		return nil, fmt.Errorf("line %d: %s %s: want the exec form, a JSON array", in.line, in.cmd, in.args)
	}
	var out []string
	if err := json.Unmarshal([]byte(in.args), &out); err != nil {
		return nil, fmt.Errorf("line %d: %s: %w", in.line, in.cmd, err)
	}
	return out, nil
}

// stage is one FROM and what follows it.
type stage struct {
	from, name string
	platform   string
	ins        []instruction
}

// find returns the stage's instructions named cmd.
func (s stage) find(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// repeatable lists the options that may be given more than once; their
// values are joined with "\n".
var repeatable = map[string]bool{"mount": true}

// parseDockerfile reads the instructions of a Dockerfile into stages. It
// knows what this repository's Dockerfile uses: line continuations with a
// trailing backslash (comment lines inside them are dropped, as Docker
// does), --options before the arguments, and the exec and shell forms.
func parseDockerfile(text string) ([]stage, error) {
	var (
		stages  []stage
		buf     []string
		start   int
		sc      = bufio.NewScanner(strings.NewReader(text))
		lineNum int
	)
	flush := func() error {
		logical := strings.TrimSpace(strings.Join(buf, " "))
		buf = nil
		if logical == "" {
			return nil
		}
		word, rest, _ := strings.Cut(logical, " ")
		in := instruction{cmd: strings.ToUpper(word), flags: map[string]string{}, line: start}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			opt, after, _ := strings.Cut(rest, " ")
			name, value, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
			if old, ok := in.flags[name]; ok {
				if !repeatable[name] {
					return fmt.Errorf("line %d: %s: --%s given twice", start, in.cmd, name)
				}
				value = old + "\n" + value
			}
			in.flags[name] = value
			rest = strings.TrimSpace(after)
		}
		in.args = rest
		if in.cmd == "FROM" {
			f := strings.Fields(rest)
			s := stage{platform: in.flags["platform"]}
			switch {
			case len(f) == 1:
				s.from = f[0]
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				s.from, s.name = f[0], f[2]
			default:
				return fmt.Errorf("line %d: FROM %s: want IMAGE [AS NAME]", start, rest)
			}
			stages = append(stages, s)
			return nil
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" { // global build arguments
				return nil
			}
			return fmt.Errorf("line %d: %s before FROM", start, in.cmd)
		}
		st := &stages[len(stages)-1]
		st.ins = append(st.ins, in)
		return nil
	}
	for sc.Scan() {
		lineNum++
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue // comments and parser directives; also inside continuations
		}
		if len(buf) == 0 {
			if line == "" {
				continue
			}
			start = lineNum
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			buf = append(buf, strings.TrimSpace(cont))
			continue
		}
		buf = append(buf, line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(buf) > 0 {
		return nil, fmt.Errorf("line %d: continuation runs off the end of the file", start)
	}
	if len(stages) == 0 {
		return nil, errors.New("no FROM")
	}
	return stages, nil
}

// shellWords splits one simple shell command into words as sh would:
// quotes, backslashes and $NAME or ${NAME} from vars (unset is empty; an
// unquoted expansion is not split into fields, so quote it anyway). It
// rejects anything that makes it more than one command (;, &&, |,
// redirections, substitutions), which the test could not reproduce.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune // ' or " while inside quotes
	)
	rs := []rune(s)
	expand := func(i int) (int, error) {
		// rs[i] is '$'; returns the index of the last rune consumed.
		if i+1 < len(rs) && rs[i+1] == '{' {
			end := slices.Index(rs[i+2:], '}')
			if end < 0 {
				return 0, fmt.Errorf("unclosed ${ in %q", s)
			}
			cur.WriteString(vars[string(rs[i+2:i+2+end])])
			return i + 2 + end, nil
		}
		j := i + 1
		for j < len(rs) && (rs[j] == '_' || rs[j] >= 'A' && rs[j] <= 'Z' || rs[j] >= 'a' && rs[j] <= 'z' || j > i+1 && rs[j] >= '0' && rs[j] <= '9') {
			j++
		}
		if j == i+1 {
			return 0, fmt.Errorf("unsupported $ in %q", s)
		}
		cur.WriteString(vars[string(rs[i+1:j])])
		return j - 1, nil
	}
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(rs) && strings.ContainsRune("\"\\$`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			case c == '$':
				var err error
				if i, err = expand(i); err != nil {
					return nil, err
				}
			case c == '`':
				return nil, fmt.Errorf("command substitution in %q", s)
			default:
				cur.WriteRune(c)
			}
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case strings.ContainsRune(";&|<>`()", c):
			return nil, fmt.Errorf("%q is not one simple command (found %q)", s, c)
		default:
			in = true
			switch c {
			case '\'', '"':
				quote = c
			case '\\':
				if i+1 < len(rs) {
					i++
					cur.WriteRune(rs[i])
				}
			case '$':
				var err error
				if i, err = expand(i); err != nil {
					return nil, err
				}
			default:
				cur.WriteRune(c)
			}
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed %c in %q", quote, s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// goBuild is the go build of the build stage, taken apart.
type goBuild struct {
	env    []string // NAME=VALUE: the stage's ENV, then the command's own
	argv   []string // from "go" on
	output string   // -o
	pkg    string   // the one package built
	outIdx int      // index in argv of -o's value
}

// goBuildValueFlags are go build's flags that take their value as the next
// word when not written -flag=value.
var goBuildValueFlags = map[string]bool{
	"-o": true, "-ldflags": true, "-gcflags": true, "-asmflags": true, "-tags": true,
	"-mod": true, "-p": true, "-pkgdir": true, "-toolexec": true, "-overlay": true,
	"-pgo": true, "-buildmode": true, "-compiler": true, "-installsuffix": true, "-modfile": true,
}

// findGoBuild finds the one RUN of st that runs go build and reads it with
// vars as the build arguments.
func findGoBuild(st stage, vars map[string]string) (goBuild, error) {
	var (
		found []goBuild
		env   []string
	)
	for _, in := range st.ins {
		switch in.cmd {
		case "ENV":
			f := strings.Fields(in.args)
			if len(f) == 2 && !strings.Contains(f[0], "=") {
				f = []string{f[0] + "=" + f[1]}
			}
			for _, kv := range f {
				if !assignment.MatchString(kv) {
					return goBuild{}, fmt.Errorf("line %d: ENV %s: want NAME=VALUE", in.line, in.args)
				}
				env = append(env, kv)
			}
		case "ARG":
			for _, a := range strings.Fields(in.args) {
				name, def, ok := strings.Cut(a, "=")
				if _, set := vars[name]; ok && !set {
					vars[name] = def
				}
			}
		case "RUN":
			if !strings.Contains(in.args, "go build") {
				continue
			}
			words, err := shellWords(in.args, vars)
			if err != nil {
				return goBuild{}, fmt.Errorf("line %d: RUN: %w", in.line, err)
			}
			b := goBuild{env: slices.Clone(env)}
			for len(words) > 0 && assignment.MatchString(words[0]) {
				b.env = append(b.env, words[0])
				words = words[1:]
			}
			if len(words) < 2 || words[0] != "go" || words[1] != "build" {
				return goBuild{}, fmt.Errorf("line %d: RUN %s: want [NAME=VALUE ...] go build ...", in.line, in.args)
			}
			b.argv = words
			var pkgs []string
			for i := 2; i < len(words); i++ {
				w := words[i]
				switch {
				case w == "-o" && i+1 < len(words):
					b.output, b.outIdx = words[i+1], i+1
					i++
				case strings.HasPrefix(w, "-o="):
					return goBuild{}, fmt.Errorf("line %d: write -o OUTPUT as two words", in.line)
				case goBuildValueFlags[w]:
					i++
				case strings.HasPrefix(w, "-"):
				default:
					pkgs = append(pkgs, w)
				}
			}
			if len(pkgs) != 1 || b.output == "" {
				return goBuild{}, fmt.Errorf("line %d: go build builds %q into %q; want one package and -o", in.line, pkgs, b.output)
			}
			b.pkg = pkgs[0]
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return goBuild{}, fmt.Errorf("stage %q has %d go builds, want 1", st.name, len(found))
	}
	return found[0], nil
}

// envValue returns the last value env gives name, and whether it gives one.
func envValue(env []string, name string) (string, bool) {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// readmePackage returns the package that the README's set-up command runs
// (go run ./cmd/imcanary): the image must build that same program.
func readmePackage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, setUp, ok := strings.Cut(string(b), "\n## Set up\n")
	if !ok {
		t.Fatal(`README.md has no "## Set up" section`)
	}
	setUp, _, _ = strings.Cut(setUp, "\n## ")
	for line := range strings.Lines(setUp) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "go" && f[1] == "run" {
			for _, a := range f[2:] {
				if !strings.HasPrefix(a, "-") {
					return a
				}
			}
		}
	}
	t.Fatal(`README.md's "Set up" section has no go run command`)
	return ""
}

// configuredPort is the port of http.listen in the example configuration
// that documents every default.
func configuredPort(t *testing.T) string {
	t.Helper()
	cfg, err := protocols.Loader().Load(filepath.Join(repoRoot, "configs", "imcanary.yaml"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(cfg.HTTP.Listen)
	if err != nil {
		t.Fatalf("configs/imcanary.yaml: http.listen %q: %v", cfg.HTTP.Listen, err)
	}
	return port
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range slices.Backward(args) {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// dockerfile is the parsed Dockerfile with its build and runtime stages.
type dockerfile struct {
	stages  []stage
	build   stage // the stage holding go build
	runtime stage // the last stage: the image
	gb      goBuild
}

// loadDockerfile reads the Dockerfile as docker build would with the
// --build-arg values in buildArgs.
func loadDockerfile(t *testing.T, buildArgs map[string]string) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages, err := parseDockerfile(string(b))
	if err != nil {
		t.Fatalf("parse Dockerfile: %v", err)
	}
	d := dockerfile{stages: stages, runtime: stages[len(stages)-1]}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stage, want a build stage and a runtime stage", len(stages))
	}
	// What docker build passes for a native build, and what the test can
	// run here.
	for _, st := range stages[:len(stages)-1] {
		vars := map[string]string{"TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH}
		maps.Copy(vars, buildArgs)
		gb, err := findGoBuild(st, vars)
		if err != nil {
			t.Logf("stage %q: %v", st.name, err)
			continue
		}
		d.build, d.gb = st, gb
		return d
	}
	t.Fatal("no build stage with one go build")
	return d
}

func TestParseDockerfile(t *testing.T) {
	const text = `# syntax=docker/dockerfile:1
ARG GO=1.26
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
RUN --mount=type=cache,target=/a --mount=type=cache,target=/b \
    # a comment inside a continuation
    CGO_ENABLED=0 \
    go build -o /out/x ./cmd/x

FROM scratch
HEALTHCHECK --interval=5s CMD ["/x", "health"]
`
	stages, err := parseDockerfile(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 2 || stages[0].name != "build" || stages[0].platform != "$BUILDPLATFORM" || stages[1].from != "scratch" {
		t.Fatalf("parseDockerfile() stages = %+v", stages)
	}
	run := stages[0].ins[0]
	if run.cmd != "RUN" || run.flags["mount"] != "type=cache,target=/a\ntype=cache,target=/b" ||
		run.args != "CGO_ENABLED=0 go build -o /out/x ./cmd/x" || run.line != 4 {
		t.Errorf("parseDockerfile() RUN = %+v", run)
	}
	hc := stages[1].ins[0]
	if argv, err := hc.exec(); hc.flags["interval"] != "5s" || err == nil || len(argv) != 0 {
		t.Errorf("HEALTHCHECK = %+v, exec %q, %v; want an --interval and CMD before the array", hc, argv, err)
	}
	for _, bad := range []string{"RUN x\n", "FROM a b\n", "FROM a\nRUN x \\\n"} {
		if _, err := parseDockerfile(bad); err == nil {
			t.Errorf("parseDockerfile(%q) = nil error, want one", bad)
		}
	}
}

func TestShellWords(t *testing.T) {
	vars := map[string]string{"OS": "linux", "A": "x y"}
	tests := []struct {
		in   string
		want []string
	}{
		{`CGO_ENABLED=0 GOOS=$OS go build -ldflags="-s -w" -o /out/imcanary ./cmd/imcanary`,
			[]string{"CGO_ENABLED=0", "GOOS=linux", "go", "build", "-ldflags=-s -w", "-o", "/out/imcanary", "./cmd/imcanary"}},
		{`a 'b $OS' "c ${OS}" d\ e "$A" $UNSET`, []string{"a", "b $OS", "c linux", "d e", "x y", ""}},
	}
	for _, tt := range tests {
		got, err := shellWords(tt.in, vars)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("shellWords(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"a && b", "a; b", "a | b", "a > f", "a $(b)", "a `b`", `a "b`} {
		if got, err := shellWords(bad, vars); err == nil {
			t.Errorf("shellWords(%q) = %q, nil error; want an error", bad, got)
		}
	}
}

// imageVersion are the --build-arg values of a release build, which the
// version must show.
var imageVersion = map[string]string{"VERSION": "1.2.3", "REVISION": "0123456789abcdef", "BRANCH": "main"}

func TestDockerfile(t *testing.T) {
	d := loadDockerfile(t, imageVersion)
	rt := d.runtime
	port := configuredPort(t)

	t.Run("build", func(t *testing.T) {
		if want := readmePackage(t); d.gb.pkg != want {
			t.Errorf("go build builds %q, want %q (README's go run)", d.gb.pkg, want)
		}
		if v, _ := envValue(d.gb.env, "CGO_ENABLED"); v != "0" {
			t.Errorf("go build runs with CGO_ENABLED=%q, want 0: the runtime image has no libc", v)
		}
		if !slices.Contains(d.gb.argv, "-trimpath") {
			t.Errorf("go build %q lacks -trimpath", d.gb.argv)
		}
		// The build arguments reach prometheus/common/version, which
		// --version, imcanary_build_info and the User-Agent read.
		var ldflags string
		for _, a := range d.gb.argv {
			if v, ok := strings.CutPrefix(a, "-ldflags="); ok {
				ldflags = v
			}
		}
		for arg, name := range map[string]string{"VERSION": "Version", "REVISION": "Revision", "BRANCH": "Branch"} {
			if want := "-X github.com/prometheus/common/version." + name + "=" + imageVersion[arg]; !strings.Contains(ldflags, want) {
				t.Errorf("go build -ldflags=%q lacks %q (from ARG %s)", ldflags, want, arg)
			}
		}
		// The golang image sets GOTOOLCHAIN=local: its Go must be the
		// release go.mod asks for.
		gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
		if m == nil {
			t.Fatal("go.mod has no go directive")
		}
		if img, tag, _ := strings.Cut(d.build.from, ":"); img != "golang" || !strings.HasPrefix(tag, string(m[1])) {
			t.Errorf("build stage FROM %s, want golang:%s (go.mod)", d.build.from, m[1])
		}
	})

	t.Run("runtime base", func(t *testing.T) {
		if !strings.HasPrefix(rt.from, "gcr.io/distroless/static") && rt.from != "scratch" {
			t.Errorf("runtime stage FROM %s, want distroless static or scratch", rt.from)
		}
	})

	// The binary's path in the image: where the build output is copied.
	var bin string
	for _, in := range rt.find("COPY") {
		f := strings.Fields(in.args)
		if in.flags["from"] == d.build.name && len(f) == 2 && f[0] == d.gb.output {
			bin = f[1]
		}
	}
	if bin == "" {
		t.Fatalf("runtime stage does not COPY --from=%s %s", d.build.name, d.gb.output)
	}

	users := rt.find("USER")
	var uid string
	t.Run("user", func(t *testing.T) {
		if len(users) != 1 {
			t.Fatalf("runtime stage has %d USER, want 1", len(users))
		}
		u, _, _ := strings.Cut(users[0].args, ":")
		n, err := strconv.Atoi(u)
		if err != nil || n == 0 {
			t.Errorf("USER %s: want a numeric uid other than 0, which runAsNonRoot can verify", users[0].args)
		}
		uid = u
	})

	var entry, cmd []string
	t.Run("entrypoint", func(t *testing.T) {
		ep, cm := rt.find("ENTRYPOINT"), rt.find("CMD")
		if len(ep) != 1 || len(cm) != 1 {
			t.Fatalf("runtime stage has %d ENTRYPOINT and %d CMD, want 1 each", len(ep), len(cm))
		}
		var err error
		if entry, err = ep[0].exec(); err != nil {
			t.Fatal(err)
		}
		if cmd, err = cm[0].exec(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(entry, []string{bin}) {
			t.Errorf("ENTRYPOINT %q, want [%q]", entry, bin)
		}
		if len(cmd) == 0 || cmd[0] != "run" {
			t.Errorf("CMD %q, want run ...", cmd)
		}
	})

	t.Run("port", func(t *testing.T) {
		var exposed []string
		for _, in := range rt.find("EXPOSE") {
			exposed = append(exposed, strings.Fields(in.args)...)
		}
		if len(exposed) != 1 || strings.TrimSuffix(exposed[0], "/tcp") != port {
			t.Errorf("EXPOSE %q, want %s (http.listen in configs/imcanary.yaml)", exposed, port)
		}
		listen, ok := flagValue(cmd, "http.listen")
		if !ok {
			t.Fatalf("CMD %q has no --http.listen: the default listens on loopback only, unreachable from outside the container", cmd)
		}
		if host, p, err := net.SplitHostPort(listen); err != nil || host != "" || p != port {
			t.Errorf("CMD --http.listen=%s, want :%s (every interface, the exposed port)", listen, port)
		}
		if u := defaultHealthURL; !strings.Contains(u, "127.0.0.1:"+port+"/") {
			t.Errorf("imcanary health's default --url %s is not the exposed port %s", u, port)
		}
	})

	t.Run("data dir", func(t *testing.T) {
		dir, ok := flagValue(cmd, "data_dir")
		if !ok || !filepath.IsAbs(dir) {
			t.Fatalf("CMD %q: want --data_dir=ABSOLUTE_PATH, not a path under a read-only working directory", cmd)
		}
		var volume bool
		for _, in := range rt.find("VOLUME") {
			vols, err := in.exec()
			if err != nil {
				vols = strings.Fields(in.args)
			}
			volume = volume || slices.Contains(vols, dir)
		}
		if !volume {
			t.Errorf("data_dir %s is not a VOLUME: with a read-only root filesystem it must be a mount", dir)
		}
		// A new volume takes the owner of the image's directory, which
		// has to be the user imcanary runs as.
		var owned bool
		for _, in := range rt.find("COPY") {
			f := strings.Fields(in.args)
			owner, _, _ := strings.Cut(in.flags["chown"], ":")
			owned = owned || len(f) == 2 && f[1] == dir && owner == uid
		}
		if !owned {
			t.Errorf("runtime stage does not create %s owned by uid %s", dir, uid)
		}
	})

	t.Run("healthcheck", func(t *testing.T) {
		hc := rt.find("HEALTHCHECK")
		if len(hc) != 1 {
			t.Fatalf("runtime stage has %d HEALTHCHECK, want 1", len(hc))
		}
		args, ok := strings.CutPrefix(hc[0].args, "CMD ")
		if !ok {
			t.Fatalf("HEALTHCHECK %s: want [--OPTION ...] CMD [...]", hc[0].args)
		}
		argv, err := instruction{cmd: "HEALTHCHECK CMD", args: strings.TrimSpace(args), line: hc[0].line}.exec()
		if err != nil {
			t.Fatalf("%v (there is no shell in the image)", err)
		}
		if len(argv) < 2 || argv[0] != bin || argv[1] != "health" {
			t.Errorf("HEALTHCHECK CMD %q, want [%q, \"health\", ...]", argv, bin)
		}
		// Docker's timeout must leave the check time to report its own.
		if to, ok := hc[0].flags["timeout"]; ok {
			if d, err := time.ParseDuration(to); err != nil || d <= 2*time.Second {
				t.Errorf("HEALTHCHECK --timeout=%s, want more than imcanary health's own 2s", to)
			}
		}
	})
}

// TestDockerfileBuild runs the Dockerfile's go build as written (output
// aside) and checks the binary it makes: static, and able to run the
// image's command and health check.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	if runtime.GOOS != "linux" {
		t.Skipf("the image is Linux; this is %s", runtime.GOOS)
	}
	d := loadDockerfile(t, imageVersion)
	out := filepath.Join(t.TempDir(), "imcanary")
	argv := slices.Clone(d.gb.argv)
	argv[d.gb.outIdx] = out
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	build := exec.Command(goTool, argv[1:]...)
	build.Dir = repoRoot // WORKDIR /src, where COPY . . put the module
	// The container's environment, not the developer's: no GOFLAGS.
	build.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOFLAGS=")
	}), d.gb.env...)
	t.Logf("%q %q", d.gb.env, argv)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("binary has a %v program header: it is dynamically linked", p.Type)
			}
		}
		if s := f.Section(".dynamic"); s != nil {
			t.Error("binary has a .dynamic section: it is dynamically linked")
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("binary imports %q", libs)
		}
	})

	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.EnvPrefix) })
	runBin := func(t *testing.T, args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, out, args...)
		c.Env = env
		b, err := c.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s %q: %v", out, args, err)
		}
		return c.ProcessState.ExitCode(), string(b)
	}
	for _, tt := range []struct {
		args    []string
		want    string
		wantErr int
	}{
		{[]string{"--help"}, "imcanary [COMMAND]", exitOK},
		{[]string{"run", "--help"}, "Usage: imcanary [run]", exitOK},
		{[]string{"health", "--help"}, "Usage: imcanary health", exitOK},
		{[]string{"help"}, "ask a running daemon's /healthz", exitOK},
		{[]string{"--version"}, "imcanary, version 1.2.3 (branch: main, revision: 0123456789abcdef)\n", exitOK},
	} {
		if code, o := runBin(t, tt.args...); code != tt.wantErr || !strings.Contains(o, tt.want) {
			t.Errorf("imcanary %q = exit %d, output %q; want %d and %q", tt.args, code, o, tt.wantErr, tt.want)
		}
	}

	// The image's own command, with the port and data directory moved
	// to where a test may have them (later flags win), must start; the
	// HEALTHCHECK's command must then pass, and SIGTERM must stop it
	// cleanly within the shutdown budget.
	t.Run("image command", func(t *testing.T) {
		rt := d.runtime
		ep, _ := rt.find("ENTRYPOINT")[0].exec()
		cmd, _ := rt.find("CMD")[0].exec()
		hcArgs, _ := strings.CutPrefix(rt.find("HEALTHCHECK")[0].args, "CMD ")
		var hc []string
		if err := json.Unmarshal([]byte(hcArgs), &hc); err != nil || len(hc) < 2 {
			t.Fatalf("HEALTHCHECK CMD %s: %v", hcArgs, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		args := append(append(slices.Clone(ep[1:]), cmd...), "--http.listen="+addr, "--data_dir="+t.TempDir())
		daemonCmd := exec.Command(out, args...)
		daemonCmd.Env = env
		daemonCmd.Dir = t.TempDir() // the image's WORKDIR is /, read-only
		var logs strings.Builder
		daemonCmd.Stdout, daemonCmd.Stderr = &logs, &logs
		if err := daemonCmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		// Exits when the daemon does; the deferred kill makes sure of it.
		go func() { exited <- daemonCmd.Wait() }()
		stopped := false
		defer func() {
			if !stopped {
				_ = daemonCmd.Process.Kill()
				<-exited
			}
		}()

		check := append(slices.Clone(hc[1:]), "--url", "http://"+addr+"/healthz")
		var last string
		defer func() {
			if t.Failed() {
				t.Logf("the health check last said %s; daemon output:\n%s", last, logs.String())
			}
		}()
		testwait.Every(t, 15*time.Second, 100*time.Millisecond, fmt.Sprintf("imcanary %q to pass", check), func() bool {
			code, o := runBin(t, check...)
			last = fmt.Sprintf("exit %d: %s", code, o)
			return code == exitOK
		})
		// The build's version, as every exporter exports it.
		fams, err := scrape(addr)
		if err != nil {
			t.Fatal(err)
		}
		var info []string
		for _, m := range fams["imcanary_build_info"].GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			info = append(info, strings.Join(labels, ","))
		}
		if len(info) != 1 || !strings.Contains(info[0], "branch=main,") || !strings.Contains(info[0], "revision=0123456789abcdef,") ||
			!strings.Contains(info[0], "shard=0,") || !strings.HasSuffix(info[0], "version=1.2.3") {
			t.Errorf("imcanary_build_info = %q, want one series with branch main, revision 0123456789abcdef, shard 0 and version 1.2.3", info)
		}
		if fams["go_build_info"] == nil {
			t.Error("no go_build_info")
		}
		if err := daemonCmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			stopped = true
			if err != nil {
				t.Errorf("imcanary %q after SIGTERM: %v\n%s", args, err, logs.String())
			}
		case <-time.After(daemon.ShutdownTimeout + 3*time.Second):
			t.Errorf("imcanary did not stop within %v of SIGTERM", daemon.ShutdownTimeout+3*time.Second)
		}
	})
}
