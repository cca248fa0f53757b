package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/history"
	"github.com/imcanary/imcanary/refserver"
)

// TestSoakRefusesDataDirInUse runs `imcanary soak` on a data_dir another
// process holds, as a daemon does: it exits 2 before anything runs, naming
// the directory and the holder, and runs once the holder lets go.
func TestSoakRefusesDataDirInUse(t *testing.T) {
	cfgFile := soakConfig(t, startTarget(t, refserver.Faults{}))
	dir := filepath.Join(filepath.Dir(cfgFile), "data")
	lock, err := history.Acquire(dir, "imcanary run")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"soak", "--config", cfgFile, "--profile", "smoke"}
	var out, errOut bytes.Buffer
	got := run(args, &out, &errOut)
	msg := errOut.String()
	if got != exitUsage {
		t.Errorf("run(%q) beside a holder of data_dir = %d, want %d:\n%s%s", args, got, exitUsage, out.String(), msg)
	}
	for _, want := range []string{"imcanary soak: data_dir " + dir + " is in use", fmt.Sprintf("pid %d", os.Getpid()), "(imcanary run)", "--data_dir"} {
		if !strings.Contains(msg, want) {
			t.Errorf("run(%q) said %q, want %q in it", args, msg, want)
		}
	}
	if strings.Contains(out.String(), "PASS") || strings.Contains(out.String(), "FAIL") {
		t.Errorf("run(%q) beside a holder ran the soak anyway:\n%s", args, out.String())
	}
	if err := lock.Release(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if got := run(args, &out, &errOut); got != exitOK {
		t.Errorf("run(%q) once data_dir is free = %d, want %d:\n%s%s", args, got, exitOK, out.String(), errOut.String())
	}
}
