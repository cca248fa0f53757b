package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxSourceRange is the most addresses one range of population.source_addrs
// may span, a /24's worth: a longer one is likelier a typo
// (127.0.0.1-127.0.1.1 for 127.0.0.1-127.0.0.11) than a host with that
// many addresses, and longer lists can still be written as several ranges.
const maxSourceRange = 256

// ParseSourceAddrs reads population.source_addrs: comma-separated entries,
// each a unicast IP address (IPv4 or IPv6, with a zone if it needs one) or
// an inclusive IPv4 range "A-B" of at most 256 addresses. It returns the
// addresses in the order given, ranges expanded, and nil for a blank s.
// No address may appear twice: each counts as one source of ephemeral
// ports. Errors name the entry at fault.
func ParseSourceAddrs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Addr
	from := make(map[netip.Addr]string) // address → the entry that gave it
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, errors.New("empty entry: two commas in a row, or one at either end")
		}
		addrs, err := parseSourceEntry(entry)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			switch prev, dup := from[a]; {
			case dup && prev == entry:
				return nil, fmt.Errorf("entry %q is given twice", entry)
			case dup:
				return nil, fmt.Errorf("entry %q: %s is also in entry %q", entry, a, prev)
			}
			from[a] = entry
		}
		out = append(out, addrs...)
	}
	return out, nil
}

// parseSourceEntry reads one entry: an address or an IPv4 range.
func parseSourceEntry(entry string) ([]netip.Addr, error) {
	first, last, isRange := strings.Cut(entry, "-")
	if !isRange {
		a, err := parseSourceAddr(entry, entry)
		if err != nil {
			return nil, err
		}
		return []netip.Addr{a}, nil
	}
	lo, err := parseSourceAddr(entry, strings.TrimSpace(first))
	if err != nil {
		return nil, err
	}
	hi, err := parseSourceAddr(entry, strings.TrimSpace(last))
	if err != nil {
		return nil, err
	}
	if !lo.Is4() || !hi.Is4() {
		return nil, fmt.Errorf("entry %q: a range must be of IPv4 addresses; list IPv6 addresses one by one", entry)
	}
	if hi.Less(lo) {
		return nil, fmt.Errorf("entry %q: the range ends (%s) before it starts (%s)", entry, hi, lo)
	}
	if n := v4(hi) - v4(lo) + 1; n > maxSourceRange {
		return nil, fmt.Errorf("entry %q spans %d addresses; a range may span at most %d", entry, n, maxSourceRange)
	}
	var out []netip.Addr
	for a := lo; ; a = a.Next() {
		out = append(out, a)
		if a == hi {
			return out, nil
		}
	}
}

// parseSourceAddr reads s, an address within entry, and checks that a
// socket can be bound to it.
func parseSourceAddr(entry, s string) (netip.Addr, error) {
	what := fmt.Sprintf("entry %q", entry)
	if s != entry {
		what += fmt.Sprintf(": %q", s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s is not an IP address", what)
	}
	// ::ffff:10.0.0.1 is 10.0.0.1 to the kernel; as IPv4 it dials IPv4
	// targets and counts once.
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return netip.Addr{}, fmt.Errorf("%s is the unspecified address; leave population.source_addrs empty to let the kernel pick", what)
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return netip.Addr{}, fmt.Errorf("%s is not a unicast address", what)
	}
	return a, nil
}

// v4 returns an IPv4 address as a number.
func v4(a netip.Addr) int {
	b := a.As4()
	return int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
}
