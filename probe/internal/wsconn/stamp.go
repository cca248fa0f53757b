package wsconn

import (
	"context"
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"net/netip"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/wsframe"
	"github.com/imcanary/imcanary/probe"
)

// StampConn is a net.Conn that remembers when a read last brought data,
// so that a session can tell when a frame came off the socket, as opposed
// to when its read loop got round to it: the difference is the prober's
// own receive lag, which must not count as the server's latency.
//
// Last is meant for the goroutine that reads the connection, and only
// that one. gorilla/websocket reads its net.Conn only from the goroutine
// that calls its read methods: the HTTP handshake reads on the dialing
// goroutine (a TLS handshake's context watcher only closes the conn),
// the login exchange on Connect's, and then Serve alone, which starts
// after Connect has returned. So last needs no lock or atomic, and the
// wrapper costs an idle session one small allocation and no goroutine.
type StampConn struct {
	net.Conn
	last int64 // Unix ns at the end of the last Read that returned data
}

// Read reads from the connection and stamps the time when it returns data.
func (c *StampConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.last = time.Now().UnixNano()
	}
	return n, err
}

// Last returns when the last read that returned data ended, in Unix ns, or
// 0 before the first one and for a nil c. Taken right after a message is
// read whole (after Read, or NextReader and reading to io.EOF), it is when
// the bytes that completed the message arrived, however many reads it
// spanned: gorilla reads the socket only for bytes it does not have yet,
// so no later read has overwritten the stamp. Bytes that came in an
// earlier read, with the end of a previous message, keep that read's
// stamp, which is when they did arrive.
func (c *StampConn) Last() int64 {
	if c == nil {
		return 0
	}
	return c.last
}

// NetDialer returns a dial function for websocket.Dialer.NetDialContext
// that dials as gorilla's Dialer does without one (a zero net.Dialer under
// the handshake's context) and wraps the connection in a StampConn; a wss
// connection is then TLS over the StampConn, and the stamp is when the
// encrypted bytes arrived.
//
// A slow link dials with a slow link's socket options (see slowLink); a
// source address dials from it (see bindNoPort), and a hostname then
// resolves to its family only.
func NetDialer(link probe.Link) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return netDialer(link, 0, nil)
}

// netDialer is NetDialer; with framed > 0 the connection is a
// wsframe.Conn of that read limit (a WebSocket that a Poller may watch
// once logged in) rather than a StampConn, and with tc, TLS of that config
// inside it, its handshake made here (see handshake).
func netDialer(link probe.Link, framed int64, tc *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	var controls []func(network, address string, c syscall.RawConn) error
	if link.Slow {
		controls = append(controls, slowLink)
	}
	if a := link.Source; a.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0))
		controls = append(controls, bindNoPort)
	}
	// Control runs after the socket is made and before it is bound, so
	// every option is in place for bind and connect.
	switch len(controls) {
	case 0:
	case 1:
		d.Control = controls[0]
	default:
		d.Control = func(network, address string, c syscall.RawConn) error {
			for _, f := range controls {
				if err := f(network, address, c); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		switch {
		case framed > 0 && tc != nil:
			return handshake(ctx, c, framed, tc, addr)
		case framed > 0:
			if fc, err := wsframe.New(c, framed); err == nil {
				return fc, nil
			}
		}
		return &StampConn{Conn: c}, nil
	}
}

// handshake makes c a wsframe.Conn over TLS of tc's and makes the TLS
// handshake under ctx, for gorilla's Dialer.NetDialTLSContext: gorilla
// then speaks WebSocket through it as it is. It tells ctx's httptrace
// what gorilla's own handshake would (the connection, then the
// handshake's start and end), so a watched wss connect's phases are
// timed the same. c is closed if it fails.
func handshake(ctx context.Context, c net.Conn, limit int64, tc *tls.Config, addr string) (net.Conn, error) {
	cfg := tc.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	fc, err := wsframe.NewTLS(c, cfg, limit)
	if err != nil {
		c.Close()
		return nil, err
	}
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c})
	}
	if trace != nil && trace.TLSHandshakeStart != nil {
		trace.TLSHandshakeStart()
	}
	err = fc.TLS().HandshakeContext(ctx)
	if trace != nil && trace.TLSHandshakeDone != nil {
		trace.TLSHandshakeDone(fc.TLS().ConnectionState(), err)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return fc, nil
}

// Stamper tells when a connection's bytes arrived: a StampConn, or the
// wsframe.Conn of a connection a Poller may watch.
type Stamper interface{ Last() int64 }

// StampOf returns the Stamper under c, looking through TLS, or a nil
// *StampConn if c was not dialled through NetDialer; a nil StampConn's
// Last is 0, which a Delivery reads as "time unknown".
func StampOf(c *websocket.Conn) Stamper {
	nc := c.NetConn()
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = t.NetConn()
	}
	if st, ok := nc.(Stamper); ok {
		return st
	}
	return (*StampConn)(nil)
}
