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
	addr   netip.Addr     // local address, IPv4-mapped addresses unmapped
	port   uint16         // local port
	remote netip.AddrPort // remote address and port, unmapped; port 0 when not connected
	state  uint8
	inode  uint64 // the socket's inode: which process holds it, through /proc/PID/fd
}

// dest is one local address and one remote endpoint. Linux gives a
// connect() a local port that no other connection from that address to the
// same endpoint uses, but connections to different endpoints share ports
// freely: the ephemeral range runs out per destination, not per address.
// Counting every socket of an address as one pool called a prober with no
// connection of its own saturated, at 127% of its range, on a host where
// another program held 85,000 loopback sockets (2026-12-04).
type dest struct {
	local  netip.Addr
	remote netip.AddrPort // the zero AddrPort for a bound, unconnected socket
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

// scanBuffer is the size of the reads of a socket file: the kernel fills
// each read with as many whole lines as fit, so a larger read means fewer
// system calls for the same lines.
const scanBuffer = 64 << 10

// scanSockets hands f each socket of a /proc/net/tcp{,6} file, in the
// file's order, keeping none. It parses lines in place rather than with
// procfs's NetTCP (deprecated), which allocates a net.IP and a struct per
// socket: at a few hundred thousand sockets every portEvery Checks, that
// is garbage the prober does not need.
func scanSockets(r io.Reader, f func(socket)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, scanBuffer), scanBuffer)
	header := true
	for sc.Scan() {
		if header { // sl local_address rem_address st ...
			header = false
			continue
		}
		s, err := parseSocket(sc.Bytes())
		if err != nil {
			return err
		}
		f(s)
	}
	return sc.Err()
}

// parseSocket parses a line such as
//
//	0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 ...
//
// for its local address, local port and state.
func parseSocket(line []byte) (socket, error) {
	_, rest := field(line) // sl
	local, rest := field(rest)
	rem, rest := field(rest)
	st, rest := field(rest)
	// tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
	for range 5 {
		_, rest = field(rest)
	}
	ino, _ := field(rest)
	bad := func(what string) (socket, error) {
		return socket{}, fmt.Errorf("socket line %q: bad %s", line, what)
	}
	addr, port, ok := parseHexEndpoint(local)
	if !ok {
		return bad("local address")
	}
	remote, rport, ok := parseHexEndpoint(rem)
	if !ok {
		return bad("remote address")
	}
	state, ok := parseHex(st, 8)
	if !ok {
		return bad("state")
	}
	inode, err := strconv.ParseUint(string(ino), 10, 64)
	if err != nil {
		return bad("inode")
	}
	s := socket{addr: addr, port: port, state: uint8(state), inode: inode}
	if rport != 0 {
		s.remote = netip.AddrPortFrom(remote, rport)
	}
	return s, nil
}

// parseHexEndpoint parses ADDR:PORT of /proc/net/tcp{,6}.
func parseHexEndpoint(b []byte) (netip.Addr, uint16, bool) {
	i := bytes.IndexByte(b, ':')
	if i < 0 {
		return netip.Addr{}, 0, false
	}
	addr, ok := parseHexAddr(b[:i])
	if !ok {
		return netip.Addr{}, 0, false
	}
	port, ok := parseHex(b[i+1:], 16)
	return addr, uint16(port), ok
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

// portCount counts, for each destination, the sockets holding a port of
// the ephemeral range r toward it, as they are read: it keeps no list of
// sockets, which at the 400,000 sockets of a bench host (every connection
// has both its ends on loopback) was 29 MB a prober, and about 1.4 KiB a
// session of its resident set (measured 2026-12-06).
//
// A socket on a listening port is the server side of an accepted
// connection: it shares the listener's port and takes none of the range,
// though an in-process server listening on port 0 is given one from it. A
// listener on a wildcard address serves its port on every address. A
// socket bound to a port of the range but not connected holds that port
// toward every destination of its address. Only the sockets keep accepts
// are counted (nil: all).
//
// The kernel lists a file's listeners before its other sockets, so each
// accepted socket is known as served when it is read. A listener made
// while a file is read may come after some of its accepted sockets; each
// of those is then counted toward its own client, a destination of one
// socket, nowhere near any limit.
type portCount struct {
	r      portRange
	keep   func(socket) bool
	listen map[netip.AddrPort]bool
	used   map[dest]int
	bound  map[netip.Addr]int
}

func newPortCount(r portRange, keep func(socket) bool) *portCount {
	return &portCount{r: r, keep: keep, listen: map[netip.AddrPort]bool{}, used: map[dest]int{}, bound: map[netip.Addr]int{}}
}

// add counts s.
func (c *portCount) add(s socket) {
	if s.state == tcpListen {
		c.listen[netip.AddrPortFrom(s.addr, s.port)] = true
		return
	}
	if s.port < c.r.lo || s.port > c.r.hi || c.served(s) || (c.keep != nil && !c.keep(s)) {
		return
	}
	if !s.remote.IsValid() {
		c.bound[s.addr]++
	}
	c.used[dest{s.addr, s.remote}]++
}

func (c *portCount) served(s socket) bool {
	return c.listen[netip.AddrPortFrom(s.addr, s.port)] ||
		c.listen[netip.AddrPortFrom(netip.IPv4Unspecified(), s.port)] ||
		c.listen[netip.AddrPortFrom(netip.IPv6Unspecified(), s.port)]
}

// result is the count of each destination, the sockets bound on its
// local address but not connected included.
func (c *portCount) result() map[dest]int {
	for d := range c.used {
		if d.remote.IsValid() {
			c.used[d] += c.bound[d.local]
		}
	}
	return c.used
}

// countPorts is a portCount of socks, its listeners taken first wherever
// they are in the list.
func countPorts(socks []socket, r portRange, keep func(socket) bool) map[dest]int {
	c := newPortCount(r, keep)
	for _, s := range socks {
		if s.state == tcpListen {
			c.add(s)
		}
	}
	for _, s := range socks {
		if s.state != tcpListen {
			c.add(s)
		}
	}
	return c.result()
}

// samplePorts counts the ephemeral ports used toward each destination in
// the monitor's network namespace, exports each local address's fullest
// destination and returns the fullest destination the prober itself has
// a connection to, if one is over MaxPorts.
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
	used, err := m.scanPorts(rng, nil)
	if err != nil {
		m.unavailable("ports", err)
		return portReading{}
	}
	fullest := map[netip.Addr]int{}
	for d, n := range used {
		fullest[d.local] = max(fullest[d.local], n)
	}
	// Fullest first: past maxPortAddrs, the addresses nearest exhaustion
	// are the ones worth a series.
	addrs := slices.SortedFunc(maps.Keys(fullest), func(a, b netip.Addr) int {
		if c := cmp.Compare(fullest[b], fullest[a]); c != 0 {
			return c
		}
		return a.Compare(b)
	})
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
		g.Set(float64(fullest[addr]) / float64(rng.size()))
	}
	return m.judgePorts(used, rng)
}

// scanPorts is a portCount of the namespace's TCP sockets.
func (m *Monitor) scanPorts(rng portRange, keep func(socket) bool) (map[dest]int, error) {
	c := newPortCount(rng, keep)
	for _, name := range []string{"net/tcp", "net/tcp6"} {
		if err := scanSocketFile(filepath.Join(m.procRoot, name), c.add); err != nil {
			return nil, err
		}
	}
	return c.result(), nil
}

// judgePorts returns the fullest destination over MaxPorts that the
// prober has a connection to, with how many of the sockets toward it are
// its own: the range toward a destination is shared by every program, and
// full it fails the prober's next connects there, but a destination only
// other programs use is none of the prober's business. Which sockets are
// the prober's is read from /proc/self/fd, about 6 µs a descriptor, and
// only once some destination is over the limit; the sockets are read
// again then, to count the prober's own.
func (m *Monitor) judgePorts(used map[dest]int, rng portRange) portReading {
	r := portReading{known: true, size: rng.size()}
	var over []dest
	for d, n := range used {
		if float64(n)/float64(r.size) > m.cfg.MaxPorts {
			over = append(over, d)
		}
	}
	if len(over) == 0 {
		return r
	}
	own, err := m.ownSockets()
	if err != nil {
		// Not knowing which are the prober's, judge them all, and say
		// so once.
		m.warnOnce("ports-own", "cannot tell the prober's own sockets apart; ports are judged over every program's", "err", err)
	}
	mine := used
	if own != nil {
		if mine, err = m.scanPorts(rng, func(s socket) bool { return own[s.inode] }); err != nil {
			m.unavailable("ports", err)
			return portReading{}
		}
	}
	slices.SortFunc(over, func(a, b dest) int {
		if c := cmp.Compare(used[b], used[a]); c != 0 {
			return c
		}
		return cmp.Or(a.local.Compare(b.local), a.remote.Compare(b.remote))
	})
	for _, d := range over {
		if n := mine[d]; n > 0 {
			r.addr, r.remote, r.used, r.own = d.local, d.remote, used[d], n
			return r
		}
	}
	return r
}

// ownSockets returns the inodes of the sockets this process holds.
func (m *Monitor) ownSockets() (map[uint64]bool, error) {
	dir := filepath.Join(m.procRoot, "self/fd")
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	own := make(map[uint64]bool, len(names))
	for _, name := range names {
		l, err := os.Readlink(filepath.Join(dir, name))
		if err != nil {
			continue // closed meanwhile
		}
		if v, ok := strings.CutPrefix(l, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(v, "]"), 10, 64); err == nil {
				own[ino] = true
			}
		}
	}
	return own, nil
}

// scanSocketFile hands f each socket of a socket file. A missing
// /proc/net/tcp6 is a kernel without IPv6: no sockets.
func scanSocketFile(path string, f func(socket)) error {
	file, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(path, "6") {
		return nil
	}
	if err != nil {
		return err
	}
	defer file.Close()
	return scanSockets(file, f)
}
