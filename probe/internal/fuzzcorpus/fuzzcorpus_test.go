package fuzzcorpus

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestBytes(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"a": "go test fuzz v1\n[]byte(\"hello\")\n",
		"b": "go test fuzz v1\n[]byte(\"\\xff\\x00\")\n",
		"c": "go test fuzz v1\nstring(\"not bytes\")\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := Bytes(t, dir)
	if len(got) != 2 || string(got[0]) != "hello" || !slices.Equal(got[1], []byte{0xff, 0}) {
		t.Errorf("Bytes = %q, want hello and \\xff\\x00, the string input skipped", got)
	}
	if got := Bytes(t, filepath.Join(dir, "absent")); len(got) != 0 {
		t.Errorf("Bytes of a missing directory = %q, want none", got)
	}
}
