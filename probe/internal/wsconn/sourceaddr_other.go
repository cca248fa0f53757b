//go:build !linux

package wsconn

import "syscall"

// bindNoPort does nothing where IP_BIND_ADDRESS_NO_PORT does not exist:
// the bind then reserves a port on its own, and each source address holds
// fewer connections than on Linux.
func bindNoPort(_, _ string, _ syscall.RawConn) error { return nil }
