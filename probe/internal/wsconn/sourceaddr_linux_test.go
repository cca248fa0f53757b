package wsconn_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// acceptor listens on addr ("127.0.0.1:0") and sends the remote address of
// every connection it accepts, as the server sees it, until the test ends.
func acceptor(t *testing.T, addr string) (net.Listener, <-chan netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	remotes := make(chan netip.AddrPort, 16)
	// Exits when the listener is closed at the end of the test, closing
	// what it accepted.
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			remotes <- c.RemoteAddr().(*net.TCPAddr).AddrPort()
		}
	}()
	return ln, remotes
}

// sockopt reads an integer socket option of the connection under c.
func sockopt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	sc, ok := c.(*wsconn.StampConn)
	if !ok {
		t.Fatalf("NetDialer's dial returned %T, want *wsconn.StampConn", c)
	}
	raw, err := sc.Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatalf("getsockopt(%d, %d) = %v", level, opt, gerr)
	}
	return v
}

// TestNetDialerSourceAddr dials a loopback server from chosen local
// addresses (all of 127.0.0.0/8 is the loopback interface's on Linux, no
// alias needed) and checks what the server sees, that the bind took no
// port of its own (IP_BIND_ADDRESS_NO_PORT), and that a slow link's
// options still apply beside it.
func TestNetDialerSourceAddr(t *testing.T) {
	ln, remotes := acceptor(t, "127.0.0.1:0")
	tests := []struct {
		name   string
		source string // "" for the kernel's choice
		slow   bool
		want   string // the address the server sees
	}{
		{name: "kernel's choice", want: "127.0.0.1"},
		{name: "127.0.0.2", source: "127.0.0.2", want: "127.0.0.2"},
		{name: "127.0.0.3", source: "127.0.0.3", want: "127.0.0.3"},
		{name: "slow link from 127.0.0.3", source: "127.0.0.3", slow: true, want: "127.0.0.3"},
		{name: "slow link, kernel's choice", slow: true, want: "127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			link := probe.Link{Slow: tt.slow}
			if tt.source != "" {
				link.Source = netip.MustParseAddr(tt.source)
			}
			c, err := wsconn.NetDialer(link)(ctx, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatalf("dial(%s) = %v", ln.Addr(), err)
			}
			defer c.Close()
			var remote netip.AddrPort
			select {
			case remote = <-remotes:
			case <-ctx.Done():
				t.Fatal("the server accepted no connection")
			}
			if got := remote.Addr().String(); got != tt.want {
				t.Errorf("server sees the connection from %s, want %s", got, tt.want)
			}
			if local := c.LocalAddr().(*net.TCPAddr).AddrPort(); local != remote {
				t.Errorf("LocalAddr() = %v, want what the server sees, %v", local, remote)
			}
			want := 0
			if tt.source != "" {
				want = 1
			}
			if got := sockopt(t, c, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT); got != want {
				t.Errorf("IP_BIND_ADDRESS_NO_PORT = %d, want %d", got, want)
			}
			// The kernel doubles SO_RCVBUF; loopback's default is larger.
			rcvbuf := sockopt(t, c, unix.SOL_SOCKET, unix.SO_RCVBUF)
			if tt.slow && rcvbuf > 64<<10 {
				t.Errorf("SO_RCVBUF = %d on a slow link, want at most %d", rcvbuf, 64<<10)
			}
		})
	}
}

// TestNetDialerSourceAddrIPv6 dials ::1 from ::1: the option is an
// IP-level one that IPv6 sockets take too.
func TestNetDialerSourceAddrIPv6(t *testing.T) {
	ln, remotes := acceptor(t, "[::1]:0")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := wsconn.NetDialer(probe.Link{Source: netip.IPv6Loopback()})(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial(%s) from ::1 = %v", ln.Addr(), err)
	}
	defer c.Close()
	if got := (<-remotes).Addr(); got != netip.IPv6Loopback() {
		t.Errorf("server sees the connection from %s, want ::1", got)
	}
	if got := sockopt(t, c, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT); got != 1 {
		t.Errorf("IP_BIND_ADDRESS_NO_PORT = %d, want 1", got)
	}
}

// TestNetDialerSourceFamily dials a name that resolves to IPv4 and
// IPv6 alike from an IPv4 source: only the IPv4 address is tried.
func TestNetDialerSourceFamily(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", "localhost")
	if err != nil || !slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Unmap().Is4() }) {
		t.Skipf("localhost resolves to %v, %v: no IPv4 address to dial", ips, err)
	}
	ln, remotes := acceptor(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	c, err := wsconn.NetDialer(probe.Link{Source: netip.MustParseAddr("127.0.0.4")})(ctx, "tcp", net.JoinHostPort("localhost", port))
	if err != nil {
		t.Fatalf("dial(localhost:%s) from 127.0.0.4 = %v", port, err)
	}
	defer c.Close()
	if got := (<-remotes).Addr().String(); got != "127.0.0.4" {
		t.Errorf("server sees the connection from %s, want 127.0.0.4", got)
	}
}
