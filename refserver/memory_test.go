package refserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/memtest"
)

// clientsChildEnv makes the test binary hold logged-in idle connections to
// the URL it names, for a memory benchmark that measures the server without
// its clients in the same heap; clientsNEnv says how many.
const (
	clientsChildEnv = "IMCANARYTEST_REFSERVER_CLIENTS"
	clientsNEnv     = "IMCANARYTEST_REFSERVER_CLIENTS_N"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(clientsChildEnv); url != "" {
		if err := holdClients(url, os.Getenv(clientsNEnv), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return
	}
	os.Exit(m.Run())
}

// holdClients logs n users in to url, writes "ready", and holds the
// connections until in ends (the parent closed it, or died).
func holdClients(url, n string, in io.Reader, out io.Writer) error {
	count, err := strconv.Atoi(n)
	if err != nil || count < 1 {
		return fmt.Errorf("%s=%q: want a count", clientsNEnv, n)
	}
	d := &websocket.Dialer{HandshakeTimeout: ioTimeout, ReadBufferSize: 256, WriteBufferPool: &sync.Pool{}}
	conns := make([]*websocket.Conn, count)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := parallel(count, 32, func(i int) error {
		ws, _, err := d.Dial(url, nil)
		if err != nil {
			return err
		}
		conns[i] = ws
		ws.SetWriteDeadline(time.Now().Add(ioTimeout))
		if err := ws.WriteJSON(map[string]string{"type": "login", "id": "1", "user": "m" + strconv.Itoa(i), "token": "t"}); err != nil {
			return err
		}
		f, err := readFrame(ws, ioTimeout)
		if err == nil && f.Type != "login_ok" {
			err = fmt.Errorf("login: %s", f.raw)
		}
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintln(out, "ready")
	_, _ = io.Copy(io.Discard, in)
	return nil
}

// BenchmarkServerMemory measures what an idle logged-in connection costs
// the server, with the reactor and with a goroutine per connection, side
// by side in one run: Go heap and stacks in use after a collection, and
// resident set, per connection, with the clients in a child process.
// IMCANARYTEST_CONNS sets the count (default 2,000; each costs this
// process one file); IMCANARYTEST_HEAPPROFILE writes the heap held.
func BenchmarkServerMemory(b *testing.B) {
	n := 2000
	if s := os.Getenv("IMCANARYTEST_CONNS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("IMCANARYTEST_CONNS=%q: want a count", s)
		}
	}
	for _, mode := range []struct {
		name      string
		noReactor bool
	}{{"reactor", false}, {"goroutines", true}} {
		b.Run(mode.name, func(b *testing.B) {
			for b.Loop() {
				heap, stack, rss, g := measureServer(b, n, mode.noReactor)
				b.ReportMetric(heap+stack, "heap+stack-B/conn")
				b.ReportMetric(stack, "stack-B/conn")
				b.ReportMetric(rss, "rss-B/conn")
				b.ReportMetric(g, "goroutines/conn")
			}
		})
	}
}

func measureServer(b *testing.B, n int, noReactor bool) (heapPer, stackPer, rssPer, goroutinesPer float64) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	h0, s0, r0 := memtest.Now()
	g0 := runtime.NumGoroutine()
	s, err := New(Options{NoReactor: noReactor})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-served }()

	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), clientsChildEnv+"=ws://"+ln.Addr().String()+"/ws", clientsNEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("clients: %q, %v", line, err)
	}
	if got := s.Stats().Connections; got != int64(n) {
		b.Fatalf("Stats().Connections = %d, want %d", got, n)
	}
	// Writers that sent login_ok, and idle poller workers, end on their
	// own within a few seconds.
	time.Sleep(3 * time.Second)
	h1, s1, r1 := memtest.Now()
	g1 := runtime.NumGoroutine()
	if f := os.Getenv("IMCANARYTEST_HEAPPROFILE"); f != "" {
		memtest.WriteHeapProfile(b, f)
	}
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	return per(h0, h1), per(s0, s1), per(r0, r1), float64(g1-g0) / float64(n)
}
