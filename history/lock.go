package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LockFile is the file in data_dir whose advisory lock (flock) marks the
// directory as in use by one process.
const LockFile = "imcanary.lock"

// Holder is what the process holding a data directory's lock writes into
// LockFile, so that the one refused can say who it is.
type Holder struct {
	PID  int    `json:"pid"`
	Host string `json:"host,omitempty"`
	// Command is what the holder is, such as "imcanary run": never its
	// command line, which may carry a URL with a password.
	Command string    `json:"command,omitempty"`
	Since   time.Time `json:"since"`
}

func (h Holder) String() string {
	s := fmt.Sprintf("pid %d", h.PID)
	if h.Host != "" {
		s += " on " + h.Host
	}
	if h.Command != "" {
		s += fmt.Sprintf(" (%s)", h.Command)
	}
	if !h.Since.IsZero() {
		s += ", since " + h.Since.UTC().Format(time.RFC3339)
	}
	return s
}

// LockedError is Acquire's error for a data directory another process
// holds. Holder is nil when that process has not said who it is (it took
// the lock an instant ago, or is an older imcanary).
type LockedError struct {
	Dir    string
	Holder *Holder
}

func (e *LockedError) Error() string {
	who := "another process, which has not written who it is into " + filepath.Join(e.Dir, LockFile)
	if e.Holder != nil {
		who = "another imcanary: " + e.Holder.String()
	}
	return fmt.Sprintf("data_dir %s is in use by %s; two processes on one data_dir would overwrite each other's run history "+
		"and record each other's soak runs in progress as aborted: stop that one, or give this one a data_dir of its own (--data_dir)", e.Dir, who)
}

// Lock is a data directory held by this process: until Release, every
// other Acquire of the directory fails with a *LockedError.
type Lock struct {
	f *os.File
}

// Acquire takes the lock of dir (creating dir if need be) for command, a
// short name of what holds it such as "imcanary run", without waiting: a
// directory held by another process is an error naming that process. The
// lock is the kernel's flock on dir/LockFile, so it ends with the process
// however the process ends: a LockFile left by one that was killed holds
// nothing, and the next Acquire takes it over. It is per open file, not per
// process: a second Acquire of the same directory in one process fails too.
func Acquire(dir, command string) (*Lock, error) {
	if dir == "" {
		return nil, errors.New("data_dir: empty")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	// Never truncated on open: the holder's record is read below when
	// the lock is taken.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, Holder: readHolder(path)}
		}
		return nil, fmt.Errorf("data_dir: locking %s: %w", path, err)
	}
	host, _ := os.Hostname()
	b, _ := json.Marshal(Holder{PID: os.Getpid(), Host: host, Command: command, Since: time.Now()})
	// Over whatever a killed holder left: truncated first, so that a
	// shorter record does not end in the old one's tail.
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data_dir: writing %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// flock takes f's exclusive lock, or fails with EWOULDBLOCK at once.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// readHolder reads the holder's record, nil when there is none to read.
func readHolder(path string) *Holder {
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) == "" {
		return nil
	}
	var h Holder
	if json.Unmarshal(b, &h) != nil || h.PID == 0 {
		return nil
	}
	return &h
}

// Release gives the directory up. The record is emptied first, while the
// lock is still held, so that it never names a process that has let go.
// Release on a nil Lock, or twice, does nothing.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Truncate(0)
	// Closing the only descriptor of the open file releases the flock.
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
