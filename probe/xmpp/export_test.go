package xmpp

import (
	"context"
	"net"

	"github.com/imcanary/imcanary/probe"
)

// KillConn closes the TCP connection under s, as a network failure would.
func KillConn(s probe.Session) { s.(*session).conn.Abort() }

// Resumed reports whether s resumed an earlier stream (XEP-0198).
func Resumed(s probe.Session) bool { return s.(*session).resumed }

// SetDial makes d's connections dial with dial in place of TCP: the tests'
// fake servers on an in-memory network.
func SetDial(d *Driver, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	d.conn.Dial = dial
}
