// Package fuzzcorpus reads the fuzz corpora go test writes under
// testdata/fuzz, so that one fuzz target can start from the inputs another
// found interesting (the session targets from the frame parsers').
package fuzzcorpus

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Bytes returns the []byte inputs of the corpus directory dir, one per file
// in go test's format ("go test fuzz v1" then "[]byte(…)"); files of
// another shape are skipped. A missing directory is no inputs.
func Bytes(tb testing.TB, dir string) [][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		_, v, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		q, ok := strings.CutPrefix(v, "[]byte(")
		if s, err := strconv.Unquote(strings.TrimSuffix(q, ")")); ok && err == nil {
			out = append(out, []byte(s))
		}
	}
	return out
}
