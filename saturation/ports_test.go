package saturation

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/imcanary/imcanary/metrics"
)

const (
	stEstablished = 0x01
	stTimeWait    = 0x06
)

// farEnd is the remote end of the sockets sock makes: 10.0.0.2:443.
var farEnd = netip.MustParseAddrPort("10.0.0.2:443")

// sock is a socket on addr:port connected to farEnd.
func sock(addr string, port uint16, state uint8) socket {
	return socket{addr: netip.MustParseAddr(addr), port: port, state: state, remote: farEnd}
}

// to is s connected to remote instead ("" for none: bound, unconnected).
func to(s socket, remote string) socket {
	s.remote = netip.AddrPort{}
	if remote != "" {
		s.remote = netip.MustParseAddrPort(remote)
	}
	return s
}

func TestCountPorts(t *testing.T) {
	rng := portRange{lo: 32768, hi: 60999}
	tests := []struct {
		name  string
		socks []socket
		want  map[string]int
	}{
		{"none", nil, map[string]int{}},
		{
			"client sockets counted per local address",
			[]socket{
				sock("10.0.0.1", 40000, stEstablished),
				sock("10.0.0.1", 40001, stEstablished),
				sock("10.0.0.2", 40000, stEstablished),
				sock("::1", 50000, stEstablished),
			},
			map[string]int{"10.0.0.1": 2, "10.0.0.2": 1, "::1": 1},
		},
		{
			"range ends included, ports outside not counted",
			[]socket{
				sock("10.0.0.1", 32767, stEstablished),
				sock("10.0.0.1", 32768, stEstablished),
				sock("10.0.0.1", 60999, stEstablished),
				sock("10.0.0.1", 61000, stEstablished),
				sock("10.0.0.1", 443, stEstablished),
			},
			map[string]int{"10.0.0.1": 2},
		},
		{
			"time-wait sockets still hold their port",
			[]socket{sock("10.0.0.1", 40000, stTimeWait)},
			map[string]int{"10.0.0.1": 1},
		},
		{
			// An in-process server listening on port 0 gets an ephemeral
			// port: the listener and the connections it accepted take no
			// port of the range, the clients dialling it do.
			"listen port excluded on its address",
			[]socket{
				sock("127.0.0.1", 45000, tcpListen),
				sock("127.0.0.1", 45000, stEstablished), // accepted
				sock("127.0.0.1", 45000, stEstablished), // accepted
				sock("127.0.0.1", 51000, stEstablished), // client
				sock("127.0.0.1", 51001, stEstablished), // client
			},
			map[string]int{"127.0.0.1": 2},
		},
		{
			"listen port on another address does not exclude",
			[]socket{
				sock("10.0.0.1", 45000, tcpListen),
				sock("10.0.0.2", 45000, stEstablished),
			},
			map[string]int{"10.0.0.2": 1},
		},
		{
			"IPv4 wildcard listener excludes its port on every address",
			[]socket{
				sock("0.0.0.0", 45000, tcpListen),
				sock("10.0.0.1", 45000, stEstablished),
				sock("127.0.0.1", 45000, stEstablished),
			},
			map[string]int{},
		},
		{
			"IPv6 wildcard listener excludes its port for IPv4 connections too",
			[]socket{
				sock("::", 45000, tcpListen),
				sock("10.0.0.1", 45000, stEstablished),
				sock("::1", 45000, stEstablished),
				sock("10.0.0.1", 45001, stEstablished),
			},
			map[string]int{"10.0.0.1": 1},
		},
		{
			"listener outside the range changes nothing",
			[]socket{
				sock("0.0.0.0", 8080, tcpListen),
				sock("10.0.0.1", 8080, stEstablished),
				sock("10.0.0.1", 40000, stEstablished),
			},
			map[string]int{"10.0.0.1": 1},
		},
		{
			// The kernel reuses a local port for another destination:
			// each destination has the whole range.
			"per destination",
			[]socket{
				sock("127.0.0.1", 40000, stEstablished),
				to(sock("127.0.0.1", 40000, stEstablished), "127.0.0.1:7070"),
				to(sock("127.0.0.1", 40001, stEstablished), "127.0.0.1:7070"),
				to(sock("127.0.0.1", 40002, stEstablished), "127.0.0.1:8080"),
			},
			map[string]int{"127.0.0.1": 1, "127.0.0.1>127.0.0.1:7070": 2, "127.0.0.1>127.0.0.1:8080": 1},
		},
		{
			"a bound, unconnected socket holds its port toward every destination",
			[]socket{
				to(sock("10.0.0.1", 40000, 0x07), ""),
				sock("10.0.0.1", 40001, stEstablished),
				to(sock("10.0.0.1", 40002, stEstablished), "10.0.0.3:443"),
				to(sock("10.0.0.5", 40000, 0x07), ""),
			},
			map[string]int{"10.0.0.1": 2, "10.0.0.1>10.0.0.3:443": 2, "10.0.0.1>invalid AddrPort": 1, "10.0.0.5>invalid AddrPort": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]int{}
			for d, n := range countPorts(tt.socks, rng, nil) {
				k := d.local.String()
				if d.remote != farEnd {
					k += ">" + d.remote.String()
				}
				got[k] = n
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("countPorts(%v) = %v, want %v", tt.socks, got, tt.want)
			}
		})
	}
}

// hexAddr renders an address the way the kernel does in /proc/net/tcp{,6}.
func hexAddr(a netip.Addr) string {
	b := a.AsSlice()
	var s strings.Builder
	for w := 0; w < len(b); w += 4 {
		fmt.Fprintf(&s, "%08X", binary.NativeEndian.Uint32(b[w:]))
	}
	return s.String()
}

func TestParseSocket(t *testing.T) {
	line := func(local string, port uint16, st uint8) string {
		return fmt.Sprintf("   3: %s:%04X %s:01BB %02X 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 20 4 30 10 -1",
			local, port, hexAddr(farEnd.Addr()), st)
	}
	ino := func(s socket) socket { s.inode = 123456; return s }
	tests := []struct {
		name string
		line string
		want socket
	}{
		{"IPv4", line(hexAddr(netip.MustParseAddr("10.1.2.3")), 40000, stEstablished), ino(sock("10.1.2.3", 40000, stEstablished))},
		{"IPv4 listener", line(hexAddr(netip.MustParseAddr("0.0.0.0")), 8080, tcpListen), ino(sock("0.0.0.0", 8080, tcpListen))},
		{"IPv6", line(hexAddr(netip.MustParseAddr("2001:db8::1")), 50000, stTimeWait), ino(sock("2001:db8::1", 50000, stTimeWait))},
		{"IPv4-mapped IPv6 is unmapped", line(hexAddr(netip.MustParseAddr("::ffff:127.0.0.1")), 45000, stEstablished), ino(sock("127.0.0.1", 45000, stEstablished))},
		// Kernel output pinned by hand for little-endian hosts, the usual
		// case: 127.0.0.1 prints as 0100007F.
		{"kernel sample", "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0", sockLE("0100007F", 0x1F90, tcpListen)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSocket([]byte(tt.line))
			if err != nil || got != tt.want {
				t.Errorf("parseSocket(%q) = %v, %v, want %v", tt.line, got, err, tt.want)
			}
		})
	}

	for _, bad := range []string{
		"",
		"   0:",
		"   0: 0100007F 00000000:0000 0A",
		"   0: 0100007G:1F90 00000000:0000 0A",
		"   0: 0100007:1F90 00000000:0000 0A",
		"   0: 0100007F:11F90 00000000:0000 0A",
		"   0: 0100007F:1F90 00000000:0000 ",
		"   0: 0100007F:1F90 00000000:0000 100",
		"   0: 0000000000000000000000000100000:1F90 00000000:0000 0A",
		"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0",
		"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 x",
		"   0: 0100007F:1F90 0100007F 01 00000000:00000000 00:00000000 00000000     0        0 1",
		"   0: 0100007F:1F90 0100007F:11F90 01 00000000:00000000 00:00000000 00000000     0        0 1",
	} {
		if got, err := parseSocket([]byte(bad)); err == nil {
			t.Errorf("parseSocket(%q) = %v, nil, want an error", bad, got)
		}
	}
}

// sockLE is the socket a kernel line shows on a little-endian host, and
// the same bytes read natively on any other.
func sockLE(hex string, port uint16, st uint8) socket {
	var v uint32
	fmt.Sscanf(hex, "%08X", &v)
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	if binary.NativeEndian.Uint32(b[:]) != binary.LittleEndian.Uint32(b[:]) {
		binary.BigEndian.PutUint32(b[:], v)
	}
	return socket{addr: netip.AddrFrom4(b), port: port, state: st, inode: 1}
}

func TestScanSockets(t *testing.T) {
	const file = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:B000 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
`
	var got []socket
	collect := func(s socket) { got = append(got, s) }
	if err := scanSockets(strings.NewReader(file), collect); err != nil || len(got) != 2 {
		t.Fatalf("scanSockets() gave %v, %v, want 2 sockets", got, err)
	}
	if got[0].state != tcpListen || got[0].port != 0x1F90 || got[1].port != 0xB000 {
		t.Errorf("scanSockets() gave %v, want a listener on 8080 and a socket on 45056", got)
	}
	if err := scanSockets(strings.NewReader("header\ngarbage\n"), collect); err == nil {
		t.Error("scanSockets(garbage) = nil error, want one")
	}
}

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in      string
		want    portRange
		wantErr bool
	}{
		{"32768\t60999\n", portRange{32768, 60999}, false},
		{"1024 65535", portRange{1024, 65535}, false},
		{"40000 40000", portRange{40000, 40000}, false},
		{"", portRange{}, true},
		{"32768", portRange{}, true},
		{"60999 32768", portRange{}, true},
		{"0 100", portRange{}, true},
		{"1 70000", portRange{}, true},
		{"a b", portRange{}, true},
	}
	for _, tt := range tests {
		got, err := parsePortRange([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parsePortRange(%q) = %v, %v, want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if n := (portRange{32768, 60999}).size(); n != 28232 {
		t.Errorf("portRange{32768, 60999}.size() = %d, want 28232", n)
	}
}

// FuzzParseSocket checks that no line crashes the parser and that what it
// accepts round-trips through the kernel's format.
func FuzzParseSocket(f *testing.F) {
	f.Add("   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1")
	f.Add("   1: 00000000000000000000000001000000:B000 00000000000000000000000001000000:1F90 01 0 0 0 0 0 7")
	f.Add("0: :: ")
	f.Fuzz(func(t *testing.T, line string) {
		s, err := parseSocket([]byte(line))
		if err != nil {
			return
		}
		remote := "00000000:0000"
		if s.remote.IsValid() {
			remote = fmt.Sprintf("%s:%04X", hexAddr(s.remote.Addr()), s.remote.Port())
		}
		again, err := parseSocket(fmt.Appendf(nil, "0: %s:%04X %s %02X 0 0 0 0 0 %d", hexAddr(s.addr), s.port, remote, s.state, s.inode))
		if err != nil || again != s {
			t.Errorf("parseSocket(%q) = %v, but its re-rendering parses to %v, %v", line, s, again, err)
		}
	})
}

// fakeProc writes a port range and a socket table under a directory that
// stands in for /proc.
func fakeProc(t testing.TB, root string, socks []socket) {
	t.Helper()
	var b strings.Builder
	b.WriteString("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
	for i, s := range socks {
		remote := "00000000:0000"
		if s.remote.IsValid() {
			remote = fmt.Sprintf("%s:%04X", hexAddr(s.remote.Addr()), s.remote.Port())
		}
		ino := s.inode
		if ino == 0 {
			ino = uint64(i + 1)
		}
		fmt.Fprintf(&b, "%4d: %s:%04X %s %02X 00000000:00000000 00:00000000 00000000     0        0 %d\n",
			i, hexAddr(s.addr), s.port, remote, s.state, ino)
	}
	for name, data := range map[string]string{
		"sys/net/ipv4/ip_local_port_range": "40000\t40099\n", // 100 ports
		"net/tcp":                          b.String(),
		// no net/tcp6: a kernel without IPv6
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeOwn makes the process under root (self/fd) hold the sockets of the
// given inodes, and a file that is not a socket.
func fakeOwn(t testing.TB, root string, inodes ...uint64) {
	t.Helper()
	dir := filepath.Join(root, "self/fd")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(dir, "0")); err != nil {
		t.Fatal(err)
	}
	for i, ino := range inodes {
		if err := os.Symlink(fmt.Sprintf("socket:[%d]", ino), filepath.Join(dir, fmt.Sprint(i+3))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPortsExport reads a fixed socket table: the fullest address decides
// the cause, every address gets a gauge up to maxPortAddrs, an address
// that goes idle reads 0, and the bound is warned about once.
func TestPortsExport(t *testing.T) {
	root := t.TempDir()
	busy := netip.MustParseAddr("10.9.9.9")
	var socks []socket
	for p := range uint16(95) { // 95 of 100 ports
		socks = append(socks, socket{addr: busy, port: 40000 + p, state: stEstablished, remote: farEnd})
	}
	socks = append(socks,
		socket{addr: busy, port: 40099, state: tcpListen},                     // a listener in the range...
		socket{addr: busy, port: 40099, state: stEstablished, remote: farEnd}, // ...and one it accepted
	)
	for i := range maxPortAddrs + 6 {
		socks = append(socks, socket{addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}), port: 40000, state: stEstablished, remote: farEnd})
	}
	fakeProc(t, root, socks)
	fakeOwn(t, root, 1, 2) // two of the busy address's connections are the prober's

	reg := prometheus.NewPedanticRegistry()
	set := metrics.New(reg).Probe("t")
	var lb logBuf
	cfg := healthy()
	cfg.MaxPorts = 0.9
	m, err := newMonitor(cfg, set, slog.New(slog.NewTextHandler(&lb, nil)), root)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	m.Check(start)
	assertState(t, m, set, []string{metrics.CausePorts})
	// Counted before PortUsage below, which would create a missing series.
	if n, err := testutil.GatherAndCount(reg, "imcanary_probe_ephemeral_port_usage_ratio"); err != nil || n != maxPortAddrs {
		t.Errorf("port usage series = %d, %v, want %d", n, err, maxPortAddrs)
	}
	if got := testutil.ToFloat64(set.PortUsage(busy.String())); got != 0.95 {
		t.Errorf("port usage of %s = %v, want 0.95", busy, got)
	}
	if log := lb.String(); !strings.Contains(log, "ports.address=10.9.9.9 ports.destination=10.0.0.2:443 ports.used=95 ports.own=2 ports.range=100") {
		t.Errorf("log = %q, want the fullest address measured", log)
	}

	// The busy address closes its sockets; the next port sample is
	// portEvery Checks later, and the cause holds until then.
	fakeProc(t, root, socks[97:])
	for i := 1; i < portEvery; i++ {
		m.Check(start.Add(time.Duration(i) * time.Second))
		assertState(t, m, set, []string{metrics.CausePorts})
	}
	m.Check(start.Add(portEvery * time.Second))
	assertState(t, m, set, nil)
	if got := testutil.ToFloat64(set.PortUsage(busy.String())); got != 0 {
		t.Errorf("port usage of idle %s = %v, want 0", busy, got)
	}
	if n := strings.Count(lb.String(), "too many local addresses"); n != 1 {
		t.Errorf("log has %d warnings about too many addresses, want 1: %q", n, lb.String())
	}
}

// A port count that takes long is not repeated until a hundred times as
// long has passed: on a host of a few hundred thousand sockets the count
// must not become the prober's main work.
func TestPortsCountSpacedByCost(t *testing.T) {
	root := t.TempDir()
	busy := netip.MustParseAddr("10.9.9.9")
	var socks []socket
	for p := range uint16(95) {
		socks = append(socks, socket{addr: busy, port: 40000 + p, state: stEstablished, remote: farEnd})
	}
	fakeProc(t, root, socks)
	fakeOwn(t, root, 1)
	cfg := healthy()
	cfg.MaxPorts = 0.9
	m, set, _ := newTestAt(t, cfg, root)
	// Every count seems to take 1 s.
	var fake time.Time
	m.clock = func() time.Time { fake = fake.Add(time.Second); return fake }
	start := time.Now()
	m.Check(start)
	assertState(t, m, set, []string{metrics.CausePorts})
	fakeProc(t, root, nil)
	for i := 1; i < 100; i++ {
		m.Check(start.Add(time.Duration(i) * time.Second))
		if !m.Saturated() {
			t.Fatalf("ports counted again %v after a count of 1 s, want 100 s", time.Duration(i)*time.Second)
		}
	}
	m.Check(start.Add(100 * time.Second))
	assertState(t, m, set, nil)
}

// TestPortsOfOtherPrograms: the range runs out per destination, and only
// toward a destination the prober connects to is it the prober's concern.
// Another program's 95 connections to one destination, or 127 to as many
// destinations from one address (127% of the range, counted as one pool),
// never saturate a prober with few connections elsewhere; the prober's own
// connection to the full destination does, and the log says how few of
// the sockets are its own.
func TestPortsOfOtherPrograms(t *testing.T) {
	busy := netip.MustParseAddr("127.0.0.1")
	full := netip.MustParseAddrPort("127.0.0.1:9000")
	mine := netip.MustParseAddrPort("127.0.0.1:7070")
	var others []socket
	for p := range uint16(95) {
		others = append(others, socket{addr: busy, port: 40000 + p, state: stEstablished, remote: full, inode: 1000 + uint64(p)})
	}
	var spread []socket
	for i := range 127 {
		spread = append(spread, socket{addr: busy, port: 40000 + uint16(i%100), state: stEstablished,
			remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(i)}), 80), inode: 2000 + uint64(i)})
	}
	own := []socket{
		{addr: busy, port: 40001, state: stEstablished, remote: mine, inode: 1},
		{addr: busy, port: 40002, state: stEstablished, remote: mine, inode: 2},
		{addr: busy, port: 40003, state: stEstablished, remote: mine, inode: 3},
	}
	tests := []struct {
		name   string
		socks  []socket
		own    []uint64
		causes []string
		log    string
	}{
		{"another program fills a destination; none of the prober's", others, nil, nil, ""},
		{"another program fills a destination; the prober's go elsewhere", slices.Concat(others, own), []uint64{1, 2, 3}, nil, ""},
		{"another program spreads over destinations", slices.Concat(spread, own), []uint64{1, 2, 3}, nil, ""},
		{
			"the prober connects to the full destination too",
			slices.Concat(others, own, []socket{{addr: busy, port: 40096, state: stEstablished, remote: full, inode: 4}}),
			[]uint64{1, 2, 3, 4},
			[]string{metrics.CausePorts},
			"ports.address=127.0.0.1 ports.destination=127.0.0.1:9000 ports.used=96 ports.own=1 ports.range=100",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			fakeProc(t, root, tt.socks)
			fakeOwn(t, root, tt.own...)
			cfg := healthy()
			cfg.MaxPorts = 0.9
			m, set, lb := newTestAt(t, cfg, root)
			m.Check(time.Now())
			assertState(t, m, set, tt.causes)
			if tt.log != "" && !strings.Contains(lb.String(), tt.log) {
				t.Errorf("log = %q, want %q", lb.String(), tt.log)
			}
			// The gauge says how full the address's fullest destination
			// is, whoever fills it: never past the whole range.
			if got := testutil.ToFloat64(set.PortUsage(busy.String())); got > 1 {
				t.Errorf("port usage of %s = %v, past the whole range", busy, got)
			}
		})
	}
}

// BenchmarkSamplePorts counts the ports of a host with 200,000 loopback
// connections, both ends of each in the table as on a bench host (the
// server's ends on a listening port), none over the limit: what one port
// count costs a prober, in time and in bytes allocated.
func BenchmarkSamplePorts(b *testing.B) {
	const conns = 200000
	root := b.TempDir()
	server := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 40050)
	socks := []socket{{addr: server.Addr(), port: server.Port(), state: tcpListen}}
	for i := range conns {
		client := netip.AddrFrom4([4]byte{127, 0, 1, byte(i / 50)})
		port := 40000 + uint16(i%50)
		socks = append(socks,
			socket{addr: client, port: port, state: stEstablished, remote: server},
			socket{addr: server.Addr(), port: server.Port(), state: stEstablished, remote: netip.AddrPortFrom(client, port)})
	}
	fakeProc(b, root, socks)
	fakeOwn(b, root)
	m, err := newMonitor(healthy(), metrics.New(prometheus.NewRegistry()).Probe("b"), slog.New(slog.DiscardHandler), root)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if r := m.samplePorts(); !r.known {
			b.Fatal("ports not counted")
		}
	}
}
