//go:build !linux

package wsconn

import "syscall"

// slowLink does nothing where the socket options are not portable: slow
// readers then back up into the kernel's buffers first, and a drill takes
// longer to reach the server's queue.
func slowLink(_, _ string, _ syscall.RawConn) error { return nil }
