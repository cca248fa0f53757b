//go:build linux

package netpoll

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imcanary/imcanary/internal/testwait"
)

// taskFunc is a func as a workers' task.
type taskFunc func()

func (f taskFunc) run() { f() }

// pair is a loopback TCP connection: the client end and the server end.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { cc.Close(); r.c.Close() })
	return cc.(*net.TCPConn), r.c.(*net.TCPConn)
}

func startPoller(t *testing.T) *Poller {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// drain reads c until it would block, as an edge-triggered ready must; it
// returns what it read and whether the peer hung up.
func drain(t *testing.T, c *net.TCPConn) (got []byte, eof bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Error(err)
		return nil, false
	}
	buf := make([]byte, 512)
	for {
		var n int
		var rerr error
		_ = rc.Read(func(fd uintptr) bool {
			n, rerr = readNonblock(fd, buf)
			return true
		})
		switch {
		case rerr != nil:
			return got, false // EAGAIN
		case n == 0:
			return got, true
		}
		got = append(got, buf[:n]...)
	}
}

func TestReadyOnDataAndHangup(t *testing.T) {
	p := startPoller(t)
	client, server := pair(t)
	var (
		mu   sync.Mutex
		got  []byte
		eof  bool
		runs atomic.Int32
	)
	_, err := p.Add(server, ReadyFunc(func() {
		runs.Add(1)
		b, e := drain(t, server)
		mu.Lock()
		got = append(got, b...)
		eof = eof || e
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1 {
		t.Fatalf("Len = %d, want 1", p.Len())
	}
	for _, s := range []string{"one", "two", "three"} {
		if _, err := client.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		want := s
		testwait.For(t, 10*time.Second, "the write to be read", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) >= len(want) && string(got[len(got)-len(want):]) == want
		})
	}
	client.Close()
	testwait.For(t, 10*time.Second, "the hangup to be seen", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return eof
	})
	if string(got) != "onetwothree" {
		t.Errorf("read %q, want %q", got, "onetwothree")
	}
	if runs.Load() < 2 {
		t.Errorf("ready ran %d times for three writes and a hangup", runs.Load())
	}
}

// marker registers one more socket and writes to it, and returns when its
// ready has run: the poller has by then taken every event that came
// before the write.
func marker(t *testing.T, p *Poller) {
	t.Helper()
	client, server := pair(t)
	ran := make(chan struct{}, 1)
	h, err := p.Add(server, ReadyFunc(func() {
		drain(t, server)
		select {
		case ran <- struct{}{}:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	if _, err := client.Write([]byte("m")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the marker socket's ready never ran")
	}
}

// TestQuietWithoutData: a registered socket that receives nothing never
// runs ready, and holds no worker.
func TestQuietWithoutData(t *testing.T) {
	p := startPoller(t)
	var runs atomic.Int32
	for range 20 {
		_, server := pair(t)
		if _, err := p.Add(server, ReadyFunc(func() { runs.Add(1) })); err != nil {
			t.Fatal(err)
		}
	}
	marker(t, p)
	if n := runs.Load(); n != 0 {
		t.Errorf("ready ran %d times on sockets with no data", n)
	}
	if n := p.Workers(); n > 1 {
		t.Errorf("%d workers alive for idle sockets and the marker's", n)
	}
}

// TestNeverConcurrent: events that come while ready runs make it run once
// more, never beside itself.
func TestNeverConcurrent(t *testing.T) {
	p := startPoller(t)
	client, server := pair(t)
	var inside, overlaps, runs atomic.Int32
	var total atomic.Int64
	h, err := p.Add(server, ReadyFunc(func() {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		runs.Add(1)
		time.Sleep(time.Millisecond)
		b, _ := drain(t, server)
		total.Add(int64(len(b)))
		inside.Add(-1)
	}))
	if err != nil {
		t.Fatal(err)
	}
	const writes = 200
	for range writes {
		if _, err := client.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		h.Wake()
	}
	testwait.For(t, 10*time.Second, "every byte read", func() bool { return total.Load() == writes })
	if n := overlaps.Load(); n != 0 {
		t.Errorf("ready ran beside itself %d times", n)
	}
	// A Wake or an event during a run folds into one more run.
	if n := runs.Load(); n > 2*writes+2 {
		t.Errorf("ready ran %d times for %d writes and wakes", n, writes)
	}
}

// TestRemove: after Remove, data no longer runs ready; Remove after the
// socket is closed, and twice, is harmless.
func TestRemove(t *testing.T) {
	p := startPoller(t)
	client, server := pair(t)
	var runs atomic.Int32
	h, err := p.Add(server, ReadyFunc(func() { runs.Add(1); drain(t, server) }))
	if err != nil {
		t.Fatal(err)
	}
	h.Remove()
	if p.Len() != 0 {
		t.Fatalf("Len = %d after Remove", p.Len())
	}
	if _, err := client.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	marker(t, p)
	if n := runs.Load(); n != 0 {
		t.Errorf("ready ran %d times after Remove", n)
	}
	server.Close()
	h.Remove()

	// Remove from inside ready, on a socket already closed.
	client2, server2 := pair(t)
	removed := make(chan struct{})
	var h2 *Handle
	var hmu sync.Mutex
	hmu.Lock()
	h2, err = p.Add(server2, ReadyFunc(func() {
		hmu.Lock()
		defer hmu.Unlock()
		server2.Close()
		h2.Remove()
		select {
		case <-removed:
			t.Error("ready ran after it removed itself")
		default:
			close(removed)
		}
	}))
	hmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	client2.Write([]byte("go"))
	<-removed
	client2.Write([]byte("again"))
	marker(t, p)
}

// TestWorkersGoIdle: a burst of sockets with data grows the pool; once it
// is over the workers exit, and Close leaves no goroutine behind.
func TestWorkersGoIdle(t *testing.T) {
	before := runtime.NumGoroutine()
	const idle = 100 * time.Millisecond
	p, err := newPoller(idle)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var (
		wg    sync.WaitGroup
		gate  = make(chan struct{})
		conns []*net.TCPConn
	)
	wg.Add(n)
	for range n {
		client, server := pair(t)
		conns = append(conns, client)
		var once sync.Once
		if _, err := p.Add(server, ReadyFunc(func() {
			drain(t, server)
			once.Do(func() {
				wg.Done()
				<-gate // all n run at once: n workers
			})
		})); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Write([]byte("x"))
	}
	wg.Wait()
	if w := p.Workers(); w < n {
		t.Errorf("%d workers for %d tasks blocked at once", w, n)
	}
	close(gate)
	// A steady trickle on one socket, a write each time the last was
	// read, reuses one worker: the rest idle out.
	read := make(chan struct{}, 1)
	trickle, server := pair(t)
	if _, err := p.Add(server, ReadyFunc(func() {
		drain(t, server)
		select {
		case read <- struct{}{}:
		default:
		}
	})); err != nil {
		t.Fatal(err)
	}
	for stop := time.Now().Add(3 * idle); time.Now().Before(stop); {
		trickle.Write([]byte("y"))
		<-read
	}
	if w := p.Workers(); w > 3 {
		t.Errorf("%d workers left %v after a burst, with one busy socket", w, 3*idle)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, c := range conns {
		c.Close()
	}
	testwait.For(t, 10*time.Second, "goroutines back", func() bool { return runtime.NumGoroutine() <= before+2 })
	if _, err := p.Add(conns[0], ReadyFunc(func() {})); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v, want ErrClosed", err)
	}
}

// TestWakeAfterClose runs the task inline: its owner is ending, and no
// worker may start.
func TestWakeAfterClose(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	_, server := pair(t)
	ran := make(chan struct{}, 1)
	h, err := p.Add(server, ReadyFunc(func() { ran <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	h.Wake()
	select {
	case <-ran:
	default:
		t.Fatal("Wake after Close did not run ready")
	}
	if w := p.Workers(); w != 0 {
		t.Errorf("%d workers after Close", w)
	}
}

func readNonblock(fd uintptr, b []byte) (int, error) { return unix.Read(int(fd), b) }

// The pool's policy, in a synctest bubble so that "stuck" is exact: a
// burst of quick tasks is served by the core workers in turn, and tasks
// that block get workers beside them, one per stuck task, so that the
// queue behind them moves.
func TestWorkersCoreAndStuck(t *testing.T) {
	cases := []struct {
		name  string
		tasks int
		// task runs as the ready function would; gate is closed once
		// the test has looked.
		task        func(gate chan struct{})
		wantSpawned int64
	}{
		{"quick burst", 1000, func(chan struct{}) {}, 0},
		{"a millisecond each", 100, func(chan struct{}) { time.Sleep(time.Millisecond) }, 0},
		{"all blocked", 10, func(gate chan struct{}) { <-gate }, 10 - 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var w workers
				w.init(2, time.Second)
				gate := make(chan struct{})
				var started, done atomic.Int64
				peak := int64(0)
				for range tc.tasks {
					w.run(taskFunc(func() {
						started.Add(1)
						tc.task(gate)
						done.Add(1)
					}))
					peak = max(peak, w.n.Load())
				}
				time.Sleep(time.Second)
				synctest.Wait()
				peak = max(peak, w.n.Load())
				if n := started.Load(); n != int64(tc.tasks) {
					t.Errorf("%d of %d tasks started after a second", n, tc.tasks)
				}
				if s := w.spawned.Load(); s != tc.wantSpawned {
					t.Errorf("%d workers started beside stuck ones, want %d", s, tc.wantSpawned)
				}
				if want := 2 + tc.wantSpawned; peak > want {
					t.Errorf("%d workers at the peak, want at most %d", peak, want)
				}
				close(gate)
				synctest.Wait()
				if n := done.Load(); n != int64(tc.tasks) {
					t.Errorf("%d of %d tasks done", n, tc.tasks)
				}
				w.stop()
				if n := w.n.Load(); n != 0 {
					t.Errorf("%d workers after stop", n)
				}
			})
		})
	}
}
