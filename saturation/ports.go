package saturation

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// tcpListen is TCP_LISTEN in the st column of /proc/net/tcp.
const tcpListen = 0x0A

// socket is what the port count needs of a line of /proc/net/tcp{,6}.
type socket struct {
	addr  netip.Addr // local address, IPv4-mapped addresses unmapped
	port  uint16     // local port
	state uint8
}

// portRange is the kernel's ephemeral port range, both ends included.
type portRange struct{ lo, hi uint16 }

func (r portRange) size() int { return int(r.hi) - int(r.lo) + 1 }

// parsePortRange parses net.ipv4.ip_local_port_range, which also rules
// IPv6.
func parsePortRange(b []byte) (portRange, error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return portRange{}, fmt.Errorf("ip_local_port_range %q: want two ports", b)
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 16)
	hi, err2 := strconv.ParseUint(f[1], 10, 16)
	if err := errors.Join(err1, err2); err != nil {
		return portRange{}, fmt.Errorf("ip_local_port_range %q: %w", b, err)
	}
	if lo == 0 || lo > hi {
		return portRange{}, fmt.Errorf("ip_local_port_range %q: not a range of ports", b)
	}
	return portRange{lo: uint16(lo), hi: uint16(hi)}, nil
}

// readSockets appends the sockets of a /proc/net/tcp{,6} file to dst. It
// parses lines in place rather than with procfs's NetTCP (deprecated), which
// allocates a net.IP and a struct per socket: at a few hundred thousand
// sockets every portEvery Checks, that is garbage the prober does not need.
func readSockets(r io.Reader, dst []socket) ([]socket, error) {
	sc := bufio.NewScanner(r)
	header := true
	for sc.Scan() {
		if header { // sl local_address rem_address st ...
			header = false
			continue
		}
		s, err := parseSocket(sc.Bytes())
		if err != nil {
			return dst, err
		}
		dst = append(dst, s)
	}
	return dst, sc.Err()
}

// parseSocket parses a line such as
//
//	0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 ...
//
// for its local address, local port and state.
func parseSocket(line []byte) (socket, error) {
	_, rest := field(line) // sl
	local, rest := field(rest)
	_, rest = field(rest) // rem_address
	st, _ := field(rest)
	bad := func(what string) (socket, error) {
		return socket{}, fmt.Errorf("socket line %q: bad %s", line, what)
	}
	i := bytes.IndexByte(local, ':')
	if i < 0 {
		return bad("local address")
	}
	addr, ok := parseHexAddr(local[:i])
	if !ok {
		return bad("local address")
	}
	port, ok := parseHex(local[i+1:], 16)
	if !ok {
		return bad("local port")
	}
	state, ok := parseHex(st, 8)
	if !ok {
		return bad("state")
	}
	return socket{addr: addr, port: uint16(port), state: uint8(state)}, nil
}

// field splits off the first space-separated field of b.
func field(b []byte) (f, rest []byte) {
	b = bytes.TrimLeft(b, " \t")
	i := bytes.IndexAny(b, " \t")
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
}

// parseHex parses 1 to bits/4 hex digits.
func parseHex(b []byte, bits int) (uint64, bool) {
	if len(b) == 0 || len(b) > bits/4 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(c)
	}
	return v, true
}

// parseHexAddr parses an address of /proc/net/tcp{,6}: the kernel prints
// each 32-bit word of the address, in network order in memory, as a
// native-endian integer.
func parseHexAddr(b []byte) (netip.Addr, bool) {
	var a [16]byte
	words := len(b) / 8
	if len(b)%8 != 0 || (words != 1 && words != 4) {
		return netip.Addr{}, false
	}
	for w := range words {
		v, ok := parseHex(b[w*8:w*8+8], 32)
		if !ok {
			return netip.Addr{}, false
		}
		binary.NativeEndian.PutUint32(a[w*4:], uint32(v))
	}
	if words == 1 {
		return netip.AddrFrom4([4]byte(a[:4])), true
	}
	// An IPv4 connection on a dual-stack socket takes its port from the
	// IPv4 address's ports.
	return netip.AddrFrom16(a).Unmap(), true
}

// countPorts counts, for each local address, the sockets holding a port of
// the ephemeral range r. A socket on a listening port is the server side
// of an accepted connection: it shares the listener's port and takes none
// of the range, though an in-process server listening on port 0 is given
// one from it. A listener on a wildcard address serves its port on every
// address. Connections to different destinations may share a local port,
// so the count is the use as seen by one destination, the prober's case.
func countPorts(socks []socket, r portRange) map[netip.Addr]int {
	listen := map[netip.AddrPort]bool{}
	for _, s := range socks {
		if s.state == tcpListen {
			listen[netip.AddrPortFrom(s.addr, s.port)] = true
		}
	}
	served := func(s socket) bool {
		return listen[netip.AddrPortFrom(s.addr, s.port)] ||
			listen[netip.AddrPortFrom(netip.IPv4Unspecified(), s.port)] ||
			listen[netip.AddrPortFrom(netip.IPv6Unspecified(), s.port)]
	}
	used := map[netip.Addr]int{}
	for _, s := range socks {
		if s.state == tcpListen || s.port < r.lo || s.port > r.hi || served(s) {
			continue
		}
		used[s.addr]++
	}
	return used
}

// samplePorts counts the ephemeral ports used per local address in the
// monitor's network namespace, exports each address's usage and returns
// the fullest address.
func (m *Monitor) samplePorts() portReading {
	b, err := os.ReadFile(filepath.Join(m.procRoot, "sys/net/ipv4/ip_local_port_range"))
	if err != nil {
		m.unavailable("ports", err)
		return portReading{}
	}
	rng, err := parsePortRange(b)
	if err != nil {
		m.unavailable("ports", err)
		return portReading{}
	}
	socks := m.socks[:0]
	for _, name := range []string{"net/tcp", "net/tcp6"} {
		socks, err = readSocketFile(filepath.Join(m.procRoot, name), socks)
		if err != nil {
			m.unavailable("ports", err)
			return portReading{}
		}
	}
	if cap(socks) <= keepSockets {
		m.socks = socks
	} else {
		m.socks = nil
	}

	used := countPorts(socks, rng)
	// Fullest first: past maxPortAddrs, the addresses nearest exhaustion
	// are the ones worth a series.
	addrs := slices.SortedFunc(maps.Keys(used), func(a, b netip.Addr) int {
		if c := cmp.Compare(used[b], used[a]); c != 0 {
			return c
		}
		return a.Compare(b)
	})
	r := portReading{known: true, size: rng.size()}
	if len(addrs) > 0 {
		r.addr, r.used = addrs[0], used[addrs[0]]
	}
	for _, addr := range addrs {
		if _, ok := m.portGauges[addr]; !ok {
			if len(m.portGauges) >= maxPortAddrs {
				m.warnOnce("port-addresses", "too many local addresses to export their ephemeral port usage; the rest are judged but not exported",
					"max", maxPortAddrs, "address", addr.String())
				continue
			}
			m.portGauges[addr] = m.set.PortUsage(addr.String())
		}
	}
	// Addresses seen before and idle now read 0, not their last use.
	for addr, g := range m.portGauges {
		g.Set(float64(used[addr]) / float64(r.size))
	}
	return r
}

// readSocketFile appends a socket file's sockets to dst. A missing
// /proc/net/tcp6 is a kernel without IPv6: no sockets.
func readSocketFile(path string, dst []socket) ([]socket, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(path, "6") {
		return dst, nil
	}
	if err != nil {
		return dst, err
	}
	defer f.Close()
	return readSockets(f, dst)
}
