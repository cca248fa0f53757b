package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// userHZ is the unit of the CPU times in /proc/PID/stat. It is 100 on every
// Linux the Go runtime supports (the kernel's USER_HZ, fixed in its ABI), and
// reading it would need sysconf, which means cgo.
const userHZ = 100

// procSample is one reading of a worker process from /proc.
type procSample struct {
	cpu float64 // user and system CPU seconds since the process started
	rss int64   // resident set size in bytes
}

// readProc reads a process's CPU time and resident set size.
//
// CPU time is the sum of its threads' run time from schedstat, in
// nanoseconds, when the kernel has it: /proc/PID/stat counts in ticks of
// 10 ms, too coarse for a window of a second or two at a fraction of a
// core. The sum misses threads that have exited, which the Go runtime does
// not do in these workers.
func readProc(pid int) (procSample, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	ticks, err := parseStatCPU(stat)
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	cpu := float64(ticks) / userHZ
	if ns, err := threadsRunTime(pid); err == nil {
		cpu = float64(ns) / 1e9
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, err
	}
	rss, err := parseStatusRSS(status)
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return procSample{cpu: cpu, rss: rss}, nil
}

// threadsRunTime sums the run time, in nanoseconds, of every thread of a
// process.
func threadsRunTime(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // a thread that just exited
			}
			return 0, err
		}
		ns, err := parseSchedstat(b)
		if err != nil {
			return 0, err
		}
		sum += ns
	}
	return sum, nil
}

// parseSchedstat returns the first field of /proc/PID/task/TID/schedstat:
// time spent on the CPU, in nanoseconds.
func parseSchedstat(b []byte) (uint64, error) {
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, errors.New("schedstat: empty")
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat %q: %w", f[0], err)
	}
	return n, nil
}

// parseStatCPU returns utime+stime, in clock ticks, from the text of
// /proc/PID/stat. The command name, field 2, is in parentheses and may hold
// spaces and parentheses itself, so the fields are counted from the last ')'.
func parseStatCPU(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	// After ")": state (field 3), then fields 4 onwards; utime and stime
	// are fields 14 and 15.
	f := strings.Fields(string(b[i+1:]))
	const utime = 14 - 3
	if len(f) <= utime+1 {
		return 0, fmt.Errorf("%d fields after the command name, want at least %d", len(f), utime+2)
	}
	u, err1 := strconv.ParseUint(f[utime], 10, 64)
	s, err2 := strconv.ParseUint(f[utime+1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("utime or stime: %w", err)
	}
	return u + s, nil
}

// parseStatusRSS returns VmRSS, in bytes, from the text of /proc/PID/status.
func parseStatusRSS(b []byte) (int64, error) {
	return parseKB(b, "VmRSS:")
}

// parseKB finds the line starting with key in a /proc file of "Key: N kB"
// lines (status, meminfo) and returns N in bytes.
func parseKB(b []byte, key string) (int64, error) {
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte(key))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s %q: want N kB", key, bytes.TrimSpace(rest))
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %q: want N kB", key, bytes.TrimSpace(rest))
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("no %s line", strings.TrimSuffix(key, ":"))
}

// countFDs returns how many files a process has open.
func countFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// parseCPULine returns the busy and total time, in ticks, of the machine
// from the "cpu" line of /proc/stat: user nice system idle iowait irq
// softirq steal (guest time is already in user). Busy is all but idle and
// iowait.
func parseCPULine(b []byte) (busy, total uint64, err error) {
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q: want the cpu line", line)
	}
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: cpu field %d %q: %w", i+1, v, err)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// machineCPU is a reading of the whole machine's CPU time.
type machineCPU struct {
	busy, total uint64
	ok          bool
}

func readMachineCPU() machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	busy, total, err := parseCPULine(b)
	return machineCPU{busy: busy, total: total, ok: err == nil}
}

// cores returns the cores busy between two readings.
func (m machineCPU) cores(since machineCPU) float64 {
	if !m.ok || !since.ok || m.total <= since.total {
		return 0
	}
	return float64(m.busy-since.busy) / float64(m.total-since.total) * float64(runtime.NumCPU())
}

// load1 returns the one-minute load average, or 0.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// parsePortRange parses net.ipv4.ip_local_port_range ("32768\t60999").
func parsePortRange(b []byte) (lo, hi int, err error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ip_local_port_range %q: want two ports", b)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || lo < 1 || lo > hi || hi > 65535 {
		return 0, 0, fmt.Errorf("ip_local_port_range %q: not a range of ports", b)
	}
	return lo, hi, nil
}

// readMachine reads what the plan needs of the machine: cores, memory, the
// file limit every worker inherits, and the ephemeral port range. What
// cannot be read is left zero and named in the returned warnings.
func readMachine() (Machine, []string) {
	m := Machine{Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Load1: load1()}
	var warn []string
	if b, err := os.ReadFile("/proc/meminfo"); err != nil {
		warn = append(warn, fmt.Sprintf("memory: %v", err))
	} else {
		m.MemTotalBytes, _ = parseKB(b, "MemTotal:")
		if m.MemAvailableBytes, err = parseKB(b, "MemAvailable:"); err != nil {
			warn = append(warn, fmt.Sprintf("memory: /proc/meminfo: %v", err))
		}
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		warn = append(warn, fmt.Sprintf("file limit: %v", err))
	} else {
		m.FileLimit = int64(min(lim.Cur, 1<<31))
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err != nil {
		warn = append(warn, fmt.Sprintf("ports: %v", err))
	} else if lo, hi, err := parsePortRange(b); err != nil {
		warn = append(warn, fmt.Sprintf("ports: %v", err))
	} else {
		m.EphemeralPorts = [2]int{lo, hi}
	}
	return m, warn
}
