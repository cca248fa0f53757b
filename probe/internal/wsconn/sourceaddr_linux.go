package wsconn

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort is a net.Dialer Control function for a dial from a chosen
// local address. It sets IP_BIND_ADDRESS_NO_PORT, so that the bind to the
// address takes no port and connect picks one for the whole 4-tuple:
// without it, bind reserves its port against every destination on the
// host, so that a population exhausts the range at the first destination's
// count, and a restart finds its old ports held in TIME_WAIT (EADDRINUSE).
// The option is at the IP level for IPv6 sockets too.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}
