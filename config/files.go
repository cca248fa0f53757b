package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// fileProblems checks the files the configuration names, as the daemon
// will read them: target.secret_file must be readable and hold something
// besides white space (the daemon trims it), and each header's value_file
// must pass Header.Read. A problem names the key and the file, never what
// is in it.
//
// Only regular files are read. Anything else (a pipe from the shell's
// <(...), a device) is only opened, without blocking: reading it here
// would consume what the daemon is to read, or never end.
func (c Config) fileProblems() []*ValidationError {
	var out []*ValidationError
	if f := c.Target.SecretFile; f != "" {
		regular, err := openable(f)
		if err == nil && regular {
			var b []byte
			if b, err = os.ReadFile(f); err != nil {
				err = unreadable(err)
			} else if strings.TrimSpace(string(b)) == "" {
				err = errors.New("is empty")
			}
		}
		if err != nil {
			out = append(out, &ValidationError{Key: "target.secret_file", Value: f, Err: err})
		}
	}
	for i, h := range c.Target.Headers {
		if h.ValueFile == "" {
			continue
		}
		regular, err := openable(h.ValueFile)
		if err == nil && regular {
			if _, err = h.Read(); err != nil {
				if _, ok := errors.AsType[*fs.PathError](err); ok {
					err = unreadable(err)
				} else {
					// Read's own reasons start with the file's name,
					// which the error shows already as the value.
					err = errors.New(strings.TrimPrefix(err.Error(), h.ValueFile+" "))
				}
			}
		}
		if err != nil {
			out = append(out, &ValidationError{Key: fmt.Sprintf("target.headers[%d].value_file", i), Value: h.ValueFile, Err: err})
		}
	}
	return out
}

// openable checks that path can be opened for reading, and reports whether
// it is a regular file. It opens without blocking, which matters for a
// named pipe with no writer yet, and reads nothing.
func openable(path string) (regular bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, unreadable(err)
	}
	if fi.IsDir() {
		return false, fmt.Errorf("cannot be read: %w", syscall.EISDIR)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false, unreadable(err)
	}
	f.Close()
	return fi.Mode().IsRegular(), nil
}

// unreadable turns the error of reading a file into a reason: the
// *fs.PathError's own, as the file is shown already, still matching
// fs.ErrNotExist and fs.ErrPermission.
func unreadable(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("cannot be read: %w", pe.Err)
	}
	return fmt.Errorf("cannot be read: %w", err)
}
