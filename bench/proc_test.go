package bench

import (
	"os"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     uint64
		err      bool
	}{
		{"plain", "1234 (imcanary) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 0 0", 325, false},
		// The command name may hold spaces and parentheses: fields are
		// counted from the last ')'.
		{"odd name", "77 (a) b (c) R 1 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 0 0", 10, false},
		{"no name", "1234 S 1", 0, true},
		{"short", "1 (x) S 1 2 3", 0, true},
		{"not a number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s 0 0", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.in))
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseStatCPU(%q) = %d, %v, want %d, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParseKB(t *testing.T) {
	status := "Name:\timcanary\nVmPeak:\t  900000 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n"
	for _, tc := range []struct {
		name, in, key string
		want          int64
		err           bool
	}{
		{"rss", status, "VmRSS:", 20480 << 10, false},
		{"meminfo", "MemTotal:       24000000 kB\nMemAvailable:   22000000 kB\n", "MemAvailable:", 22000000 << 10, false},
		{"missing", status, "VmSwap:", 0, true},
		{"no unit", "VmRSS:\t20480\n", "VmRSS:", 0, true},
		{"negative", "VmRSS:\t-1 kB\n", "VmRSS:", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseKB([]byte(tc.in), tc.key)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseKB(%q, %q) = %d, %v, want %d, error %v", tc.in, tc.key, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParsePortRange(t *testing.T) {
	for _, tc := range []struct {
		in     string
		lo, hi int
		err    bool
	}{
		{"32768\t60999\n", 32768, 60999, false},
		{"1024 65535", 1024, 65535, false},
		{"60999 32768", 0, 0, true},
		{"0 100", 0, 0, true},
		{"32768", 0, 0, true},
		{"a b", 0, 0, true},
	} {
		lo, hi, err := parsePortRange([]byte(tc.in))
		if (err != nil) != tc.err || lo != tc.lo || hi != tc.hi {
			t.Errorf("parsePortRange(%q) = %d, %d, %v, want %d, %d, error %v", tc.in, lo, hi, err, tc.lo, tc.hi, tc.err)
		}
	}
}

func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		err  bool
	}{
		{"862303844 1917901780 1683\n", 862303844, false},
		{"", 0, true},
		{"x 1 2", 0, true},
	} {
		got, err := parseSchedstat([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseSchedstat(%q) = %d, %v, want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestReadProc reads this process, as the bench reads its workers.
func TestReadProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	// Burn a little CPU so that the reading is above zero.
	x := 0
	for i := range 10_000_000 {
		x += i
	}
	_ = x
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Fatalf("readProc: %v", err)
	}
	if s.cpu <= 0 || s.rss <= 0 {
		t.Errorf("readProc(self) = %+v, want CPU and RSS above 0", s)
	}
	n, err := countFDs(os.Getpid())
	if err != nil || n < 3 {
		t.Errorf("countFDs(self) = %d, %v, want at least stdin, stdout and stderr", n, err)
	}
	m, warn := readMachine()
	if len(warn) > 0 || m.FileLimit <= 0 || m.Cores <= 0 || m.MemAvailableBytes <= 0 || m.EphemeralPorts[0] <= 0 {
		t.Errorf("readMachine() = %+v, %q", m, warn)
	}
}
