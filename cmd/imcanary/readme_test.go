package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/imcanary/imcanary/refserver"
)

// TestReadmeCommands runs every command of README.md's shell blocks, or,
// where the command is the daemon or the tests themselves, checks what
// runs them: a README whose commands do not work is the first thing a
// newcomer meets. A command this test does not know fails it, so that a
// new one gets run too.
func TestReadmeCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a soak; skipped with -short")
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds, yamls := readmeBlocks(string(readme))
	if len(cmds) < 4 || len(yamls) < 1 {
		t.Fatalf("README.md has %d commands and %d configurations in its blocks, want the set-up, run and soak commands and an example", len(cmds), len(yamls))
	}
	url := startTarget(t, refserver.Faults{})
	dir := t.TempDir()
	// The README's example configuration, pointed at a server of this
	// test, with a secret of its own.
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("readme-test-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	example := strings.NewReplacer(`"ws://127.0.0.1:7070/ws"`, `"`+url+`"`, "/etc/imcanary/secret", secret).Replace(yamls[0])
	example += "\ndata_dir: " + filepath.Join(dir, "data") + "\n"
	file := filepath.Join(dir, "example.yaml")
	if err := os.WriteFile(file, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		t.Run(c, func(t *testing.T) {
			args := strings.Fields(c)
			switch {
			case c == "go run ./cmd/imcanary":
				// The daemon: this package, which the Dockerfile
				// builds too (TestDockerfile holds the two together).
				if pkg := readmePackage(t); pkg != "./cmd/imcanary" {
					t.Errorf("the set-up command runs %s, want this package", pkg)
				}
			case strings.HasPrefix(c, "go vet ./... && go test"):
				// The tests: CI runs this command, with -count=1 so
				// that nothing comes from the test cache, over lines.
				run := strings.Join(strings.Fields(strings.ReplaceAll(string(ci), " -count=1", "")), " ")
				if !strings.Contains(run, c) {
					t.Errorf(".ci/run does not run the README's test command %q", c)
				}
			case len(args) >= 2 && args[0] == "imcanary" && args[1] == "run":
				// config check takes run's flags and checks what run
				// would load: the README's example configuration.
				args = replaceArg(args[1:], "FILE", file)
				args[0] = "check"
				expectExit(t, append([]string{"config"}, args...), exitOK)
			case len(args) >= 2 && args[0] == "imcanary" && args[1] == "soak":
				// Run for real, with a short profile of the test's.
				cfg := soakConfig(t, url)
				args = replaceArg(args[1:], "imcanary.yaml", cfg)
				args = replaceArg(args, "nightly", "smoke")
				out := t.TempDir()
				args = replaceArg(args, "out.json", filepath.Join(out, "out.json"))
				args = replaceArg(args, "out.html", filepath.Join(out, "out.html"))
				expectExit(t, args, exitOK)
				for _, f := range []string{"out.json", "out.html"} {
					if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
						t.Errorf("%s not written: %v", f, err)
					}
				}
			default:
				t.Errorf("README command %q is not run by this test: add it", c)
			}
		})
	}
}

// readmeBlocks returns the commands of the sh blocks and the yaml blocks
// of a Markdown text.
func readmeBlocks(md string) (cmds, yamls []string) {
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok || lang == "" {
			continue
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		switch lang {
		case "sh":
			for _, l := range body {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					cmds = append(cmds, l)
				}
			}
		case "yaml":
			yamls = append(yamls, strings.Join(body, "\n"))
		}
	}
	return cmds, yamls
}

// replaceArg replaces the argument from with to.
func replaceArg(args []string, from, to string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == from {
			a = to
		}
		out[i] = a
	}
	return out
}

// expectExit runs imcanary with args and checks its exit code.
func expectExit(t *testing.T, args []string, want int) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(args, &out, &errOut); code != want {
		t.Errorf("imcanary %s = %d, want %d:\n%s%s", strings.Join(args, " "), code, want, out.String(), errOut.String())
	}
}

// TestDocsLinks: README.md stays a first page (under 250 lines), and every
// relative link of it and of docs/ leads to a file that exists and, with
// an anchor, to a heading of that file; every page under docs/ is
// reachable from the README.
func TestDocsLinks(t *testing.T) {
	readme := filepath.Join(repoRoot, "README.md")
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n >= 250 {
		t.Errorf("README.md has %d lines, want under 250: move the detail to docs/", n)
	}
	pages, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	more, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*", "*.md"))
	pages = append(append(pages, more...), readme)
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	reached := map[string]bool{}
	var walk func(page string)
	walk = func(page string) {
		if reached[page] {
			return
		}
		reached[page] = true
		text, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("%s: %v", page, err)
			return
		}
		for _, m := range linkRE.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Clean(filepath.Join(filepath.Dir(page), path))
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %s: no such file", page, target)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !slices.Contains(anchors(t, file), anchor) {
				t.Errorf("%s: link %s: %s has no heading #%s", page, target, file, anchor)
			}
			if strings.HasSuffix(file, ".md") && strings.HasPrefix(file, filepath.Join(repoRoot, "docs")) {
				walk(file)
			}
		}
	}
	walk(readme)
	for _, p := range pages {
		if !reached[p] {
			t.Errorf("%s is not reachable from README.md", p)
		}
	}
}

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]int{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var a strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		id := a.String()
		if n := seen[id]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", id, n))
		} else {
			out = append(out, id)
		}
		seen[id]++
	}
	return out
}
