package protocols

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
)

func TestCheckPorts(t *testing.T) {
	linux := portRange{32768, 60999} // Linux's default: 28232 ports, 25408 usable
	tests := []struct {
		name  string
		pops  []int
		addrs int
		r     portRange
		want  string // "" for nil
	}{
		{name: "range unknown", pops: []int{1_000_000}, r: portRange{}},
		{name: "range inverted", pops: []int{1_000_000}, r: portRange{60999, 32768}},
		{name: "default population", pops: []int{100, 4}, r: linux},
		{name: "one address at the limit", pops: []int{25408}, r: linux},
		{
			name: "one address over the limit", pops: []int{25409}, r: linux,
			want: "population.users: 25409 sessions in all connect from the one source address the kernel picks (population.source_addrs is empty) " +
				"and need 25409 ephemeral ports, but the limit is 25408 (90% of the 28232 in net.ipv4.ip_local_port_range, 32768-60999): " +
				"add addresses to population.source_addrs (at least 2 in all, e.g. 127.0.0.1-127.0.0.2), or run more shards",
		},
		{name: "background, canary and soak at the limit", pops: []int{20000, 4, 5404}, r: linux},
		{
			name: "background, canary and soak over the limit", pops: []int{20000, 4, 5405}, r: linux,
			want: "population.users: 25409 sessions in all connect from the one source address the kernel picks (population.source_addrs is empty) " +
				"and need 25409 ephemeral ports, but the limit is 25408 (90% of the 28232 in net.ipv4.ip_local_port_range, 32768-60999): " +
				"add addresses to population.source_addrs (at least 2 in all, e.g. 127.0.0.1-127.0.0.2), or run more shards",
		},
		{name: "four addresses", pops: []int{101_632}, addrs: 4, r: linux},
		{
			name: "four addresses over the limit", pops: []int{101_633}, addrs: 4, r: linux,
			want: "population.source_addrs: 101633 sessions in all over 4 source addresses put up to 25409 on one, which needs as many ephemeral ports, " +
				"but the limit is 25408 (90% of the 28232 in net.ipv4.ip_local_port_range, 32768-60999): " +
				"add addresses to population.source_addrs (at least 5 in all, e.g. 127.0.0.1-127.0.0.5), or run more shards",
		},
		{
			name: "a million users", pops: []int{1_000_000, 100, 1_000_000}, addrs: 16, r: linux,
			want: "population.source_addrs: 2000100 sessions in all over 16 source addresses put up to 125007 on one, which needs as many ephemeral ports, " +
				"but the limit is 25408 (90% of the 28232 in net.ipv4.ip_local_port_range, 32768-60999): " +
				"add addresses to population.source_addrs (at least 79 in all, e.g. 127.0.0.1-127.0.0.79), or run more shards",
		},
		// Each population starts at the first address, which so holds
		// the rounded-up share of each: 2+2+1 of 3+3+1 on two.
		{name: "rounding per population fits", pops: []int{3, 3}, addrs: 2, r: portRange{1000, 1004}},
		{
			name: "rounding per population", pops: []int{3, 3, 1}, addrs: 2, r: portRange{1000, 1004},
			want: "population.source_addrs: 7 sessions in all over 2 source addresses put up to 5 on one, which needs as many ephemeral ports, " +
				"but the limit is 4 (90% of the 5 in net.ipv4.ip_local_port_range, 1000-1004): " +
				"add addresses to population.source_addrs (at least 3 in all, e.g. 127.0.0.1-127.0.0.3), or run more shards",
		},
		{
			name: "more addresses than a range", pops: []int{30000}, r: portRange{1000, 1099},
			want: "population.users: 30000 sessions in all connect from the one source address the kernel picks (population.source_addrs is empty) " +
				"and need 30000 ephemeral ports, but the limit is 90 (90% of the 100 in net.ipv4.ip_local_port_range, 1000-1099): " +
				"add addresses to population.source_addrs (at least 334 in all), or run more shards",
		},
		{
			name: "no address is enough", pops: []int{1}, r: portRange{5000, 5000},
			want: "population.users: 1 sessions in all connect from the one source address the kernel picks (population.source_addrs is empty) " +
				"and need 1 ephemeral ports, but the limit is 0 (90% of the 1 in net.ipv4.ip_local_port_range, 5000-5000): " +
				"widen net.ipv4.ip_local_port_range",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkPorts(tt.pops, tt.addrs, tt.r)
			var got string
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("checkPorts(%v, %d, %v) = %q, want %q", tt.pops, tt.addrs, tt.r, got, tt.want)
			}
		})
	}
}

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in    string
		want  portRange
		ports int
	}{
		{"32768\t60999\n", portRange{32768, 60999}, 28232},
		{"1024 65535", portRange{1024, 65535}, 64512},
		{"40000\t40000\n", portRange{40000, 40000}, 1},
		{"60999\t32768\n", portRange{60999, 32768}, 0},
		{"", portRange{}, 0},
		{"32768\n", portRange{}, 0},
		{"a b", portRange{}, 0},
		{"1 2 3", portRange{}, 0},
	}
	for _, tt := range tests {
		got := parsePortRange(tt.in)
		if got != tt.want || got.ports() != tt.ports {
			t.Errorf("parsePortRange(%q) = %v with %d ports, want %v with %d", tt.in, got, got.ports(), tt.want, tt.ports)
		}
	}
	if _, err := os.Stat(portRangeFile); err == nil {
		if r := ephemeralPorts(); r.ports() == 0 {
			t.Errorf("ephemeralPorts() = %v from %s, want a range", r, portRangeFile)
		}
	}
}

// TestLocalSecret: with no secret configured, the xmpp driver's passwords
// come from a secret made once and kept, so a restart can log in again.
func TestLocalSecret(t *testing.T) {
	dir := t.TempDir()
	a, err := localSecret(dir)
	if err != nil || len(a) < 32 {
		t.Fatalf("localSecret = %q, %v", a, err)
	}
	b, err := localSecret(dir)
	if err != nil || string(a) != string(b) {
		t.Errorf("second localSecret = %q, %v; want the same secret", b, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "secret")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("secret file mode = %v, %v; want 0600", st.Mode().Perm(), err)
	}
}

// TestOpenEnforcesSecret: every protocol that declares the secret
// required is refused by Open without one, before its driver is made, and
// the error says what the secret is to that protocol: the check is
// Open's, so that the canary, soak and jsonws commands, which open the
// target without config check's Preflight, cannot skip it, and no adapter
// checks for itself.
func TestOpenEnforcesSecret(t *testing.T) {
	t.Setenv(config.SecretEnv, "")
	required := 0
	for _, a := range All {
		section := a.Config.Section
		if a.SecretNeed(section) != probe.SecretRequired {
			continue
		}
		required++
		t.Run(a.Config.Name, func(t *testing.T) {
			cfg, err := Loader().Load("", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Target.Protocol, cfg.Target.URL, cfg.DataDir = a.Config.Name, "ws://127.0.0.1:1/ws", t.TempDir()
			target, err := Open(cfg, nil, slog.New(slog.DiscardHandler))
			if err == nil {
				target.Close()
				t.Fatalf("Open(%s) without a secret succeeded", a.Config.Name)
			}
			if want := "target.protocol " + a.Config.Name + ": needs the target secret, " + a.SecretIs; a.SecretIs == "" || !strings.Contains(err.Error(), want) {
				t.Errorf("Open(%s) = %v; want it to say %q", a.Config.Name, err, want)
			}
		})
	}
	if required < 3 {
		t.Errorf("%d protocols require the secret; centrifugo, openim and matrix do", required)
	}
}
