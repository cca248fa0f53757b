package reference

import (
	"context"
	"net"
)

// SetDial makes d's connections dial with dial in place of TCP: the tests'
// fake servers on an in-memory network.
func SetDial(d *Driver, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	d.conn.Dial = dial
}
