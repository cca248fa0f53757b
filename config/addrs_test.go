package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseSourceAddrs(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	tests := []struct {
		in      string
		want    []netip.Addr
		wantErr string
	}{
		{in: "", want: nil},
		{in: "  ", want: nil},
		{in: "127.0.0.2", want: addrs("127.0.0.2")},
		{in: "127.0.0.1-127.0.0.4", want: addrs("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")},
		{in: "127.0.0.2,127.0.0.5-127.0.0.7", want: addrs("127.0.0.2", "127.0.0.5", "127.0.0.6", "127.0.0.7")},
		{in: " 10.0.0.1 - 10.0.0.2 , 10.0.0.9 ", want: addrs("10.0.0.1", "10.0.0.2", "10.0.0.9")},
		{in: "127.0.0.3-127.0.0.3", want: addrs("127.0.0.3")},
		// A range may cross a /24 boundary as long as it is short.
		{in: "10.0.0.255-10.0.1.1", want: addrs("10.0.0.255", "10.0.1.0", "10.0.1.1")},
		{in: "::1,2001:db8::7", want: addrs("::1", "2001:db8::7")},
		{in: "fe80::1%eth0", want: addrs("fe80::1%eth0")},
		{in: "::ffff:10.0.0.1", want: addrs("10.0.0.1")},
		{in: "127.0.0.x", wantErr: `entry "127.0.0.x" is not an IP address`},
		{in: "localhost", wantErr: `entry "localhost" is not an IP address`},
		{in: "127.0.0.0/24", wantErr: `entry "127.0.0.0/24" is not an IP address`},
		{in: "127.0.0.1:80", wantErr: `entry "127.0.0.1:80" is not an IP address`},
		{in: "127.0.0.1-127.0.0.x", wantErr: `entry "127.0.0.1-127.0.0.x": "127.0.0.x" is not an IP address`},
		{in: "127.0.0.1-", wantErr: `entry "127.0.0.1-": "" is not an IP address`},
		{in: "127.0.0.1,", wantErr: "empty entry: two commas in a row, or one at either end"},
		{in: "127.0.0.1,,127.0.0.2", wantErr: "empty entry: two commas in a row, or one at either end"},
		{in: "127.0.0.9-127.0.0.1", wantErr: `entry "127.0.0.9-127.0.0.1": the range ends (127.0.0.1) before it starts (127.0.0.9)`},
		{in: "10.0.0.0-10.0.0.255", want: nil}, // 256: the most; checked by length below
		{in: "10.0.0.0-10.0.1.0", wantErr: `entry "10.0.0.0-10.0.1.0" spans 257 addresses; a range may span at most 256`},
		{in: "1.0.0.0-2.0.0.0", wantErr: `entry "1.0.0.0-2.0.0.0" spans 16777217 addresses; a range may span at most 256`},
		{in: "::1-::2", wantErr: `entry "::1-::2": a range must be of IPv4 addresses; list IPv6 addresses one by one`},
		{in: "127.0.0.1-::2", wantErr: `entry "127.0.0.1-::2": a range must be of IPv4 addresses; list IPv6 addresses one by one`},
		{in: "0.0.0.0", wantErr: `entry "0.0.0.0" is the unspecified address; leave population.source_addrs empty to let the kernel pick`},
		{in: "::", wantErr: `entry "::" is the unspecified address; leave population.source_addrs empty to let the kernel pick`},
		{in: "224.0.0.1", wantErr: `entry "224.0.0.1" is not a unicast address`},
		{in: "255.255.255.254-255.255.255.255", wantErr: `entry "255.255.255.254-255.255.255.255": "255.255.255.255" is not a unicast address`},
		{in: "ff02::1", wantErr: `entry "ff02::1" is not a unicast address`},
		{in: "127.0.0.2,127.0.0.2", wantErr: `entry "127.0.0.2" is given twice`},
		{in: "127.0.0.1-127.0.0.9,127.0.0.5", wantErr: `entry "127.0.0.5": 127.0.0.5 is also in entry "127.0.0.1-127.0.0.9"`},
		{in: "10.0.0.1,::ffff:10.0.0.1", wantErr: `entry "::ffff:10.0.0.1": 10.0.0.1 is also in entry "10.0.0.1"`},
	}
	for _, tt := range tests {
		got, err := ParseSourceAddrs(tt.in)
		var gotErr string
		if err != nil {
			gotErr = err.Error()
		}
		if gotErr != tt.wantErr {
			t.Errorf("ParseSourceAddrs(%q) error = %q, want %q", tt.in, gotErr, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if strings.HasSuffix(tt.in, "10.0.0.255") {
			if len(got) != maxSourceRange || got[0] != netip.MustParseAddr("10.0.0.0") || got[255] != netip.MustParseAddr("10.0.0.255") {
				t.Errorf("ParseSourceAddrs(%q) = %d addresses from %v, want %d from 10.0.0.0 to 10.0.0.255", tt.in, len(got), got[0], maxSourceRange)
			}
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParseSourceAddrs(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestSourceAddrsFromEnvAndFlags checks that the list, commas and all, is one
// value in the environment and on the command line, as in the file.
func TestSourceAddrsFromEnvAndFlags(t *testing.T) {
	const list = "127.0.0.2,127.0.0.5-127.0.0.9"
	c, err := testLoader.Load("", []string{"IMCANARY_POPULATION_SOURCE_ADDRS=" + list, "IMCANARY_POPULATION_MAX_CONNECT_RATE=250"}, nil)
	if err != nil {
		t.Fatalf("Load with environment = %v, want nil error", err)
	}
	if c.Population.SourceAddrs != list || c.Population.MaxConnectRate != 250 {
		t.Errorf("Load with environment: source_addrs %q, max_connect_rate %v, want %q, 250", c.Population.SourceAddrs, c.Population.MaxConnectRate, list)
	}
	c, err = testLoader.Load("", nil, parseFlags(t, "--population.source_addrs="+list, "--population.max_connect_rate=0.5"))
	if err != nil {
		t.Fatalf("Load with flags = %v, want nil error", err)
	}
	if c.Population.SourceAddrs != list || c.Population.MaxConnectRate != 0.5 {
		t.Errorf("Load with flags: source_addrs %q, max_connect_rate %v, want %q, 0.5", c.Population.SourceAddrs, c.Population.MaxConnectRate, list)
	}
	_, err = testLoader.Load("", []string{"IMCANARY_POPULATION_SOURCE_ADDRS=127.0.0.1-127.0.2.0"}, nil)
	want := `environment variable IMCANARY_POPULATION_SOURCE_ADDRS: population.source_addrs: "127.0.0.1-127.0.2.0": entry "127.0.0.1-127.0.2.0" spans 512 addresses; a range may span at most 256`
	if err == nil || err.Error() != want {
		t.Errorf("Load with a long range = %v, want %v", err, want)
	}
}

// FuzzParseSourceAddrs checks that any input either fails or gives valid,
// distinct addresses, no more than its entries can hold.
func FuzzParseSourceAddrs(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1-127.0.0.16", "127.0.0.2,127.0.0.5-127.0.0.9", "::1,fe80::1%eth0", "10.0.0.255-10.0.1.1", "1.2.3.4-1.2.3.3", ",", "::ffff:1.2.3.4-1.2.3.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseSourceAddrs(s)
		if err != nil {
			return
		}
		if n := (strings.Count(s, ",") + 1) * maxSourceRange; len(got) > n {
			t.Fatalf("ParseSourceAddrs(%q) = %d addresses, want at most %d", s, len(got), n)
		}
		seen := make(map[netip.Addr]bool)
		for _, a := range got {
			if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() || seen[a] {
				t.Fatalf("ParseSourceAddrs(%q) = %v: %v is invalid, unspecified, multicast, mapped or repeated", s, got, a)
			}
			seen[a] = true
		}
	})
}
