package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("population: {users: 10}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("population: {users: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		want    int
		wantOut string // in stdout or stderr
	}{
		{[]string{"config", "check", good}, exitOK, "good.yaml: ok"},
		{[]string{"config", "check", bad}, exitUsage, "population.users: 0: must be at least 1"},
		{[]string{"config", "check", filepath.Join(dir, "missing.yaml")}, exitUsage, "missing.yaml"},
		{[]string{"config"}, exitUsage, "config check FILE"},
		{[]string{"bogus"}, exitUsage, `unknown command "bogus"`},
		{[]string{"run", "--population.users=0"}, exitUsage, "population.users"},
		{[]string{"run", "--log.level=loud"}, exitUsage, "--log.level"},
		{[]string{"target", "--drop=2"}, exitUsage, "drop"},
		{[]string{"help"}, exitOK, "Usage:"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		got := run(tt.args, &out, &errOut)
		all := out.String() + errOut.String()
		if got != tt.want || !strings.Contains(all, tt.wantOut) {
			t.Errorf("run(%q) = %d, output %q; want %d and output containing %q", tt.args, got, all, tt.want, tt.wantOut)
		}
	}
}
