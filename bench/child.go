package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/imcanary/imcanary/saturation"
)

// child is one worker process: a reference server, a prober, or the bare
// reader, all of them the imcanary binary itself.
//
// Each runs in a process group of its own, so that a Ctrl-C on the terminal
// reaches only the bench, which then kills its workers in the order it
// chooses, and with Pdeathsig, so that a bench killed outright (SIGKILL,
// OOM) does not leave 40,000 sessions behind.
type child struct {
	name string
	cmd  *exec.Cmd
	pid  int
	// stdin is the worker's standard input; the bare reader takes its
	// commands there.
	stdin io.WriteCloser
	// lines receives the worker's standard output line by line; closed at
	// its end.
	lines chan string
	// tail keeps the last lines of standard error, to say why a worker
	// died.
	tail *tailBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, set before done is closed
}

// tailLines is how many lines of a worker's standard error are kept.
const tailLines = 12

// startChild starts exe with args. env replaces the environment.
func startChild(name, exe string, args, env []string) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{name: name, cmd: cmd, lines: make(chan string, 64), tail: &tailBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.tail
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c.pid = cmd.Process.Pid
	// Exits at the end of the worker's standard output, which its exit
	// (or kill) brings.
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default:
				// Nobody reads after start-up: drop rather than
				// block the worker on a full pipe.
			}
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// line waits for the worker's next line of output.
func (c *child) line(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.done
			return "", c.died()
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("%s: no answer within %v%s", c.name, timeout, c.tail.suffix())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// alive returns an error saying why the worker is gone, or nil.
func (c *child) alive() error {
	select {
	case <-c.done:
		return c.died()
	default:
		return nil
	}
}

func (c *child) died() error {
	return fmt.Errorf("%s exited: %v%s", c.name, c.err, c.tail.suffix())
}

// kill ends the worker's whole process group at once and waits, at most
// a few seconds, for it to be gone. Workers hold nothing worth a clean
// shutdown: their figures were read already.
func (c *child) kill() {
	if c == nil {
		return
	}
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
	}
}

// killAll kills workers in order: the bench kills targets before their
// probers, so that each connection is closed first by its server side and
// its TIME_WAIT sits on the target's port, outside the ephemeral range,
// where the next step's saturation monitors do not count it.
func killAll(groups ...[]*child) {
	for _, g := range groups {
		var wg sync.WaitGroup
		for _, c := range g {
			wg.Go(c.kill)
		}
		wg.Wait()
	}
}

// tailBuffer keeps the last tailLines lines written to it, and the last
// line in which a prober said it saturated, which names each cause with
// its figures (the port pool and its use, the scheduler's p99): a step's
// report carries it, since the tail is gone when the bench ends.
type tailBuffer struct {
	mu        sync.Mutex
	partial   []byte
	lines     []string
	saturated string
}

// saturatedMsgs are the saturation monitor's lines that list the causes
// in force, as its text log writes them.
var saturatedMsgs = []string{`msg="` + saturation.LogSaturated + `"`, `msg="` + saturation.LogCausesChanged + `"`}

// maxSaturatedLine bounds the saturation line kept.
const maxSaturatedLine = 2000

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, b...)
	for {
		i := strings.IndexByte(string(t.partial), '\n')
		if i < 0 {
			break
		}
		line := string(t.partial[:i])
		t.lines = append(t.lines, line)
		t.partial = t.partial[i+1:]
		if slices.ContainsFunc(saturatedMsgs, func(m string) bool { return strings.Contains(line, m) }) {
			t.saturated = line[:min(len(line), maxSaturatedLine)]
		}
		if len(t.lines) > tailLines {
			t.lines = t.lines[len(t.lines)-tailLines:]
		}
	}
	// A worker that writes without newlines must not grow this for ever.
	if len(t.partial) > 4096 {
		t.partial = t.partial[len(t.partial)-4096:]
	}
	return len(b), nil
}

// lastSaturated is the last line in which the worker said it saturated,
// "" if none.
func (t *tailBuffer) lastSaturated() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.saturated
}

// suffix is ": " and the kept lines, for an error message.
func (t *tailBuffer) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	return ":\n\t" + strings.Join(t.lines, "\n\t")
}

// childEnv is the bench's environment without IMCANARY_* variables: the
// bench passes workers every key it means as a flag, and a variable set for
// the user's own daemon (a shard, a soak profile's users) must not change
// what a worker does. gomaxprocs, when above 0 and GOMAXPROCS is not set
// already, is set for every worker (see sharedGOMAXPROCS).
func childEnv(gomaxprocs int) []string {
	var env []string
	set := false
	for _, kv := range os.Environ() {
		if kv == "GOMAXPROCS=" {
			continue
		}
		set = set || strings.HasPrefix(kv, "GOMAXPROCS=")
		if !strings.HasPrefix(kv, "IMCANARY_") {
			env = append(env, kv)
		}
	}
	if gomaxprocs > 0 && !set {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", gomaxprocs))
	}
	return env
}

// freePort finds a free TCP port on 127.0.0.1 below lo, the start of the
// ephemeral range, for a target to listen on: a target's closed
// connections then sit in TIME_WAIT on a port that no saturation monitor
// counts as an ephemeral one. Another process may take the port before the
// target binds it; the target then fails to start and the bench says so.
func freePort(lo int) (int, error) {
	base, span := 10000, lo-10000
	if span < 1000 {
		// A range starting this low leaves no room below it: take what
		// the kernel gives.
		return anyPort()
	}
	for range 100 {
		p := base + rand.IntN(span)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		return p, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// anyPort returns a port the kernel says is free on 127.0.0.1.
func anyPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
