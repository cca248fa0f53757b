package daemon

import (
	"bufio"
	"encoding/hex"
	"log/slog"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imcanary/imcanary/internal/testwait"
)

// TestRunSourceAddrs runs the daemon over two loopback source addresses
// with a connect rate limit, and reads the kernel's table of TCP sockets
// to see its sessions to the in-process target come from both, half each.
func TestRunSourceAddrs(t *testing.T) {
	cfg := testConfig(t)
	cfg.Population.SourceAddrs = "127.0.0.2-127.0.0.3"
	cfg.Population.MaxConnectRate = 100
	d, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	base, _ := runDaemon(t, d)
	testwait.For(t, 10*time.Second, "/readyz 200", func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })

	u, err := url.Parse(d.TargetURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	// The canary's 4 users are spread like the population's 20.
	want := map[string]int{"127.0.0.2": 12, "127.0.0.3": 12}
	var got map[string]int
	testwait.Every(t, 10*time.Second, 20*time.Millisecond, "the sessions from their sources", func() bool {
		got = sessionSources(t, port)
		return maps.Equal(got, want)
	})
	if !maps.Equal(got, want) {
		t.Errorf("sessions to the target by source address = %v, want %v", got, want)
	}
}

// sessionSources counts the established IPv4 TCP connections to the given
// loopback port by local address, from /proc/net/tcp.
func sessionSources(t *testing.T, port int) map[string]int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no socket table to read: %v", err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st ...; addresses are
		// little-endian hex IPv4 and big-endian hex port.
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "01" {
			continue
		}
		local, rem := fields[1], fields[2]
		rp, err := strconv.ParseUint(rem[strings.IndexByte(rem, ':')+1:], 16, 16)
		if err != nil || int(rp) != port {
			continue
		}
		b, err := hex.DecodeString(local[:8])
		if err != nil {
			continue
		}
		slices.Reverse(b)
		out[netip.AddrFrom4([4]byte(b)).String()]++
	}
	return out
}
