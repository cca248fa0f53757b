package wsconn

import "syscall"

// Slow-link socket options. 1400-byte segments are an Internet path's, not
// loopback's 64 KiB; a 32 KiB receive buffer is set before the handshake
// so that the window is small from the first byte. The server's send
// buffer then stays small too, since Linux grows it only for a connection
// whose congestion window limits it, and a small window does.
const (
	slowLinkMSS    = 1400
	slowLinkRcvBuf = 32 << 10
)

// slowLink is a net.Dialer Control function that makes a socket a slow
// link's.
func slowLink(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		if err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, slowLinkMSS); err == nil {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, slowLinkRcvBuf)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}
