package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/prometheus/common/version"
)

// setVersion fills in prometheus/common/version's Version and Revision from
// the build information Go records in every binary, when the build did not
// set them with -ldflags -X (the Dockerfile does): so that go run, go build
// and go install binaries say something true in --version,
// imcanary_build_info and the User-Agent, never an empty string.
func setVersion() {
	if bi, ok := debug.ReadBuildInfo(); ok {
		fillVersion(bi)
	}
}

// fillVersion fills in what is empty from bi. The version is the main
// module's: a tag for go install …@v1.2.3, a pseudo-version for a build in
// a checkout since Go 1.24, "(devel)" otherwise; its "v" is dropped, to be
// written as the Prometheus ecosystem writes versions ("1.2.3"). The
// revision is the commit, "-modified" after it for a work tree with
// changes, as prometheus/common/version computes its own.
func fillVersion(bi *debug.BuildInfo) {
	if version.Version == "" {
		v := bi.Main.Version
		if v == "" {
			v = "(devel)"
		}
		if len(v) > 1 && v[0] == 'v' && v[1] >= '0' && v[1] <= '9' {
			v = v[1:]
		}
		version.Version = v
	}
	if version.Revision == "" {
		var rev string
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" && modified {
			rev += "-modified"
		}
		version.Revision = rev
	}
}

// runVersion prints what --version prints.
func runVersion(args []string, stdout io.Writer) error {
	fs := newFlags("version", stdout, io.Discard)
	if err := parseFlags(fs, "version", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	printVersion(stdout)
	return nil
}

// printVersion prints the version, and why a development build has no
// revision.
func printVersion(w io.Writer) {
	fmt.Fprintln(w, version.Print("imcanary"))
	if why := unknownRevision(version.Version, version.Revision); why != "" {
		fmt.Fprintln(w, "  revision unknown:", why)
	}
}

// unknownRevision says why a development build has no revision, or "":
// Go stamps the git revision into a binary built in a checkout unless
// -buildvcs=false (in GOFLAGS, as on some build machines) turns it off.
func unknownRevision(v, rev string) string {
	if rev != "" || v != "(devel)" {
		return ""
	}
	return "the binary carries no VCS stamp: it was built outside a git checkout, by go run, or with -buildvcs=false (check go env GOFLAGS); build with -buildvcs=true, or set -ldflags \"-X github.com/prometheus/common/version.Revision=$(git rev-parse HEAD)\""
}
