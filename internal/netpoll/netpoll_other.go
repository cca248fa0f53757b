//go:build !linux

package netpoll

import (
	"errors"
	"syscall"
)

// ErrClosed is Add's error once the Poller is closed.
var ErrClosed = errors.New("netpoll: poller closed")

// ErrUnsupported is New's error where there is no epoll: connections are
// then read by a goroutine each, as before.
var ErrUnsupported = errors.New("netpoll: not supported on this system")

// Reader is what a Poller runs when a socket has something to read.
type Reader interface{ Ready() }

// ReadyFunc is a func as a Reader.
type ReadyFunc func()

// Ready calls f.
func (f ReadyFunc) Ready() { f() }

// Handle is one socket's registration.
type Handle struct{}

// Wake does nothing here.
func (h *Handle) Wake() {}

// SetDeadline does nothing here.
func (h *Handle) SetDeadline(at int64) {}

// Deadline is 0.
func (h *Handle) Deadline() int64 { return 0 }

// Remove does nothing here.
func (h *Handle) Remove() {}

// Poller is not available on this system.
type Poller struct{}

// New reports ErrUnsupported.
func New() (*Poller, error) { return nil, ErrUnsupported }

// Add reports ErrUnsupported.
func (p *Poller) Add(c syscall.Conn, r Reader) (*Handle, error) { return nil, ErrUnsupported }

// Len is 0.
func (p *Poller) Len() int { return 0 }

// Workers is 0.
func (p *Poller) Workers() int { return 0 }

// Close does nothing.
func (p *Poller) Close() error { return nil }
