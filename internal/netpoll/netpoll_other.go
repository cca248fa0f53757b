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

// Handle is one socket's registration.
type Handle struct{}

// Wake does nothing here.
func (h *Handle) Wake() {}

// Remove does nothing here.
func (h *Handle) Remove() {}

// Poller is not available on this system.
type Poller struct{}

// New reports ErrUnsupported.
func New() (*Poller, error) { return nil, ErrUnsupported }

// Add reports ErrUnsupported.
func (p *Poller) Add(c syscall.Conn, ready func()) (*Handle, error) { return nil, ErrUnsupported }

// Len is 0.
func (p *Poller) Len() int { return 0 }

// Workers is 0.
func (p *Poller) Workers() int { return 0 }

// Close does nothing.
func (p *Poller) Close() error { return nil }
