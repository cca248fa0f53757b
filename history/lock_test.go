package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAcquireRefusesSecond checks that a second holder of one data
// directory is refused, by name, and that the directory is free again
// once the first lets go.
func TestAcquireRefusesSecond(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	a, err := Acquire(dir, "imcanary run")
	if err != nil {
		t.Fatalf("Acquire(%q) = %v, want the lock", dir, err)
	}
	_, err = Acquire(dir, "imcanary soak --profile nightly")
	le, ok := errors.AsType[*LockedError](err)
	if !ok {
		t.Fatalf("second Acquire(%q) = %v, want a *LockedError", dir, err)
	}
	if le.Holder == nil || le.Holder.PID != os.Getpid() || le.Holder.Command != "imcanary run" {
		t.Errorf("second Acquire's holder = %+v, want pid %d, command %q", le.Holder, os.Getpid(), "imcanary run")
	}
	for _, want := range []string{dir, fmt.Sprintf("pid %d", os.Getpid()), "imcanary run", "--data_dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second Acquire = %q, want it to name %q", err, want)
		}
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, LockFile)); len(b) != 0 {
		t.Errorf("%s after Release holds %q, want it empty: it names a process that let go", LockFile, b)
	}
	b, err := Acquire(dir, "imcanary run")
	if err != nil {
		t.Fatalf("Acquire after Release = %v, want the lock", err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
}

// TestAcquireUnnamedHolder checks the message for a holder that has not
// written its record.
func TestAcquireUnnamedHolder(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir, "imcanary run")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := os.WriteFile(filepath.Join(dir, LockFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir, "imcanary run")
	if le, ok := errors.AsType[*LockedError](err); !ok || le.Holder != nil || !strings.Contains(err.Error(), "has not written who it is") {
		t.Errorf("Acquire beside a silent holder = %v, want a *LockedError saying it has not written who it is", err)
	}
}

// lockChildEnv makes the test binary a process that holds a data
// directory's lock until it is killed (see TestLockHelperProcess).
const lockChildEnv = "IMCANARY_TEST_LOCK_DIR"

// TestLockHelperProcess is the child of TestAcquireAfterKilledHolder, not
// a test of its own: it takes the lock, says so, and waits for its stdin
// to close, which it never does before the parent kills it.
func TestLockHelperProcess(t *testing.T) {
	dir := os.Getenv(lockChildEnv)
	if dir == "" {
		t.Skip("the child of TestAcquireAfterKilledHolder")
	}
	if _, err := Acquire(dir, "lock test child"); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestAcquireAfterKilledHolder checks that a holder killed with SIGKILL,
// which leaves its record behind, blocks nobody: the kernel released its
// lock, and the next Acquire takes the directory over.
func TestAcquireAfterKilledHolder(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "locked" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q (%v), want %q", line, err, "locked")
	}

	_, err = Acquire(dir, "imcanary run")
	le, ok := errors.AsType[*LockedError](err)
	if !ok || le.Holder == nil || le.Holder.PID != cmd.Process.Pid || le.Holder.Command != "lock test child" {
		t.Errorf("Acquire beside a live child = %v, want a *LockedError naming pid %d", err, cmd.Process.Pid)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The child never released: its record is still there, stale.
	var stale Holder
	if b, err := os.ReadFile(filepath.Join(dir, LockFile)); err != nil || json.Unmarshal(b, &stale) != nil || stale.PID != cmd.Process.Pid {
		t.Fatalf("%s after the kill = %q (%v), want the killed child's record", LockFile, b, err)
	}
	l, err := Acquire(dir, "imcanary run")
	if err != nil {
		t.Fatalf("Acquire after the holder was killed = %v, want the lock", err)
	}
	defer l.Release()
	if h := readHolder(filepath.Join(dir, LockFile)); h == nil || h.PID != os.Getpid() {
		t.Errorf("%s after taking it over names %+v, want pid %d", LockFile, h, os.Getpid())
	}
}
