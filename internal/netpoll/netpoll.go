//go:build linux

// Package netpoll tells when sockets have something to read, so that a
// connection waiting for its next frame holds no goroutine: the kernel's
// readiness notification (epoll, edge-triggered) wakes a worker from a
// small elastic pool, which reads what is there and returns to the pool.
//
// A goroutine parked in a read costs its stack (4 KiB once gorilla's frame
// reader has run on it) and its descriptor for as long as the connection is
// idle; a registration here costs a map entry and a small struct. The Go
// runtime's own poller still owns the descriptors: reads and writes go
// through net.Conn as before, and an epoll instance of ours only watches
// them beside it (a descriptor may be in several).
//
// The contract of a Reader's Ready is the one of edge-triggered epoll: it
// must read until the socket has nothing left (a read that would block),
// and data that arrives after that read runs it again. It never runs twice
// at once for one Handle.
package netpoll

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is Add's error once the Poller is closed.
var ErrClosed = errors.New("netpoll: poller closed")

// ErrUnsupported is New's error where there is no epoll (never on Linux):
// connections are then read by a goroutine each.
var ErrUnsupported = errors.New("netpoll: not supported on this system")

// Reader is what a Poller runs when a socket has something to read: the
// connection's owner, which reads it (see the package's contract). An
// interface, not a func: a method value would be an allocation per socket.
type Reader interface{ Ready() }

// ReadyFunc is a func as a Reader.
type ReadyFunc func()

// Ready calls f.
func (f ReadyFunc) Ready() { f() }

// Handle is one socket's registration.
type Handle struct {
	p     *Poller
	token uint64
	rc    syscall.RawConn
	r     Reader
	// state orders ready's runs: idle, running, or running with an
	// event that came meanwhile (again), which runs it once more.
	state   atomic.Int32
	removed atomic.Bool
	// deadline is when ready is to run with nothing to read (Unix ns,
	// 0 for none); sched is when the Poller's clock next looks at it (0
	// when it does not). See SetDeadline.
	deadline atomic.Int64
	sched    atomic.Int64
}

const (
	idle int32 = iota
	running
	again
)

// Wake runs ready as if the socket had data: a deadline that passed, or a
// close that must be noticed without any.
func (h *Handle) Wake() { h.fire() }

func (h *Handle) fire() {
	for {
		switch s := h.state.Load(); s {
		case idle:
			if h.state.CompareAndSwap(idle, running) {
				h.p.workers.run(h)
				return
			}
		case running:
			if h.state.CompareAndSwap(running, again) {
				return
			}
		default: // again: already to run once more
			return
		}
	}
}

// run is the Handle's task on a worker: Ready until no event came while
// it ran.
func (h *Handle) run() {
	for {
		if !h.removed.Load() {
			h.r.Ready()
		}
		if h.state.CompareAndSwap(running, idle) {
			return
		}
		h.state.Store(running) // was again
	}
}

// Remove ends the registration; ready does not run again once a run in
// progress returns. Remove from ready itself is allowed, and so is Remove
// after the socket is closed.
func (h *Handle) Remove() {
	if h.removed.Swap(true) {
		return
	}
	p := h.p
	p.mu.Lock()
	delete(p.handles, h.token)
	p.mu.Unlock()
	// Through Control, which holds the descriptor open: a socket already
	// closed took its registration with it, and its number may be
	// another socket's by now, whose registration must stay.
	_ = h.rc.Control(func(fd uintptr) {
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	})
}

// Poller is one epoll instance and the workers that run the ready
// functions of its Handles.
type Poller struct {
	epfd int
	// file is the epoll descriptor as the runtime's poller sees it: the
	// event loop waits on it like any socket, parked, not in a blocking
	// system call that holds a thread.
	file *os.File

	mu      sync.Mutex
	handles map[uint64]*Handle
	next    uint64
	closed  bool

	workers workers
	clock   clock
	done    chan struct{}
}

// workerIdle is how long a worker with nothing to do stays for the next
// event: long enough that a steady load reuses them, short enough that a
// burst's goroutines do not outlive it for long.
const workerIdle = 2 * time.Second

// New starts a Poller. Close stops it.
func New() (*Poller, error) { return newPoller(workerIdle) }

// newPoller is New with the time a worker idles before it exits.
func newPoller(idle time.Duration) (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("netpoll: epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("netpoll: %w", err)
	}
	p := &Poller{
		epfd:    epfd,
		file:    os.NewFile(uintptr(epfd), "epoll"),
		handles: map[uint64]*Handle{},
		done:    make(chan struct{}),
	}
	p.workers.init(runtime.GOMAXPROCS(0), idle)
	p.clock.init()
	go p.loop() // exits when Close closes file
	return p, nil
}

// Add watches c's socket for reading, running r.Ready on a worker each
// time data comes, the peer hangs up or the socket fails. c is the
// connection itself (a *net.TCPConn), not a wrapper of it.
func (p *Poller) Add(c syscall.Conn, r Reader) (*Handle, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("netpoll: %w", err)
	}
	h := &Handle{p: p, rc: rc, r: r}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.next++
	h.token = p.next
	p.handles[h.token] = h
	p.mu.Unlock()
	var cerr error
	err = rc.Control(func(fd uintptr) {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET}
		setToken(&ev, h.token)
		cerr = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		p.mu.Lock()
		delete(p.handles, h.token)
		p.mu.Unlock()
		return nil, fmt.Errorf("netpoll: epoll_ctl add: %w", err)
	}
	return h, nil
}

// setToken and token keep a Handle's number in the event's 64 bits of
// user data (syscall's EpollEvent splits them into Fd and Pad).
func setToken(ev *unix.EpollEvent, t uint64) {
	ev.Fd = int32(uint32(t))
	ev.Pad = int32(uint32(t >> 32))
}

func token(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Len is the number of sockets watched.
func (p *Poller) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.handles)
}

func (p *Poller) loop() {
	defer close(p.done)
	rc, err := p.file.SyscallConn()
	if err != nil {
		return
	}
	events := make([]unix.EpollEvent, 256)
	batch := make([]*Handle, 0, len(events))
	for {
		var n int
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			n, werr = unix.EpollWait(int(fd), events, 0)
			if werr == unix.EINTR || (werr == nil && n == 0) {
				return false // wait until the epoll descriptor is readable
			}
			return true
		})
		if err != nil {
			return // closed
		}
		if werr != nil {
			// Only EBADF and EINVAL are left, and both mean the
			// instance is gone.
			return
		}
		batch = batch[:0]
		p.mu.Lock()
		for i := range n {
			if h := p.handles[token(&events[i])]; h != nil {
				batch = append(batch, h)
			}
		}
		p.mu.Unlock()
		for _, h := range batch {
			h.fire()
		}
		clear(batch)
	}
}

// Close stops the event loop and waits for every worker to return. The
// Handles' sockets are not closed: their owners do that.
func (p *Poller) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.clock.stop()
	err := p.file.Close()
	<-p.done
	p.workers.stop()
	return err
}

// workers is an elastic pool with a small core. A task goes to an idle
// worker if there is one, else to a new goroutine while fewer than core
// are alive, else to a queue that the workers take from in order as they
// finish.
//
// A task may block (a write to a full socket, a long frame still
// arriving), and a fixed pool could be emptied by a few slow connections.
// So while tasks wait, a watchdog looks every stuckAfter at the workers:
// one that has run the same task for longer than that counts as stuck, and
// for each stuck one a new worker takes a queued task. A burst of quick
// tasks (a heartbeat's pongs arriving together) is served by core workers
// in turn, not by a goroutine each; a task behind blocked ones waits at
// most about stuckAfter more than it would on a free worker.
//
// Idle workers wait on a stack, and a task goes to the one that went idle
// last: a steady load keeps reusing the few it needs, and the rest, at the
// bottom, idle long enough for the sweeper to let them go. (Handing tasks
// to any idle worker, as a shared channel does, keeps every worker of a
// past burst just busy enough never to exit.)
type workers struct {
	mu      sync.Mutex
	idle    []*worker // oldest first
	all     []*worker // alive, idle or busy
	queue   []task    // waiting for a worker, oldest first from head
	head    int
	stopped bool
	// watching is whether the watchdog's timer is set: it is while
	// the queue holds tasks.
	watching bool
	watch    *time.Timer
	core     int
	idleFor  time.Duration
	quit     chan struct{}
	wg       sync.WaitGroup
	n        atomic.Int64
	// spawned counts the workers the watchdog started beside stuck ones.
	spawned atomic.Int64
}

// task is what a worker runs: a Handle's readiness.
type task interface{ run() }

type worker struct {
	tasks chan task // one at most: a worker is on the stack or running
	since time.Time // idle since
	// started is when the running task began (Unix ns), 0 between tasks.
	started atomic.Int64
}

// stuckAfter is how long a task runs before the watchdog counts its
// worker as stuck and starts another beside it. A ready function that
// reads what arrived takes microseconds; one that takes milliseconds is
// waiting for something.
const stuckAfter = 2 * time.Millisecond

func (w *workers) init(core int, idleFor time.Duration) {
	w.core = max(1, core)
	w.idleFor = idleFor
	w.quit = make(chan struct{})
	w.watch = time.AfterFunc(time.Hour, w.check)
	w.watch.Stop()
	w.wg.Add(1)
	go w.sweep() // exits on stop
}

func (w *workers) run(f task) {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		// A Wake after Close (a deadline's timer): nothing may start
		// now, and the task is its owner's last.
		f.run()
		return
	}
	if n := len(w.idle); n > 0 {
		k := w.idle[n-1]
		w.idle[n-1] = nil
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		k.tasks <- f
		return
	}
	if len(w.all) < w.core {
		k := w.spawnLocked()
		w.mu.Unlock()
		go w.work(k, f) // exits when the sweeper or stop sends it nil
		return
	}
	w.queue = append(w.queue, f)
	if !w.watching {
		w.watching = true
		w.watch.Reset(stuckAfter)
	}
	w.mu.Unlock()
}

// spawnLocked accounts for a new worker; the caller starts it.
func (w *workers) spawnLocked() *worker {
	k := &worker{tasks: make(chan task, 1)}
	w.all = append(w.all, k)
	w.wg.Add(1)
	w.n.Add(1)
	return k
}

// popLocked takes the oldest queued task, or nil.
func (w *workers) popLocked() task {
	if w.head == len(w.queue) {
		return nil
	}
	f := w.queue[w.head]
	w.queue[w.head] = nil
	w.head++
	if w.head == len(w.queue) {
		w.queue, w.head = w.queue[:0], 0
	}
	return f
}

// check is the watchdog: while tasks wait, it starts a worker for each
// one stuck in its task, so that the workers making progress number core.
func (w *workers) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.head == len(w.queue) {
		w.watching = false
		return
	}
	now := time.Now().UnixNano()
	free := 0
	for _, k := range w.all {
		if s := k.started.Load(); s == 0 || now-s < int64(stuckAfter) {
			free++
		}
	}
	for ; free < w.core; free++ {
		f := w.popLocked()
		if f == nil {
			break
		}
		k := w.spawnLocked()
		w.spawned.Add(1)
		go w.work(k, f) // exits when the sweeper or stop sends it nil
	}
	if w.head == len(w.queue) {
		w.watching = false
		return
	}
	w.watch.Reset(stuckAfter)
}

func (w *workers) work(k *worker, f task) {
	defer w.wg.Done()
	defer w.n.Add(-1)
	defer w.leave(k)
	for f != nil {
		k.started.Store(time.Now().UnixNano())
		f.run()
		k.started.Store(0)
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		if f = w.popLocked(); f != nil {
			w.mu.Unlock()
			continue
		}
		k.since = time.Now()
		w.idle = append(w.idle, k)
		w.mu.Unlock()
		f = <-k.tasks
	}
}

// leave takes k off the list of live workers.
func (w *workers) leave(k *worker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, o := range w.all {
		if o == k {
			last := len(w.all) - 1
			w.all[i] = w.all[last]
			w.all[last] = nil
			w.all = w.all[:last]
			return
		}
	}
}

// sweep lets the workers idle longer than idleFor go, oldest first.
func (w *workers) sweep() {
	defer w.wg.Done()
	t := time.NewTicker(w.idleFor / 2)
	defer t.Stop()
	var gone []*worker
	for {
		select {
		case <-w.quit:
			return
		case now := <-t.C:
			w.mu.Lock()
			n := 0
			for n < len(w.idle) && now.Sub(w.idle[n].since) >= w.idleFor {
				n++
			}
			gone = append(gone[:0], w.idle[:n]...)
			rest := copy(w.idle, w.idle[n:])
			clear(w.idle[rest:])
			w.idle = w.idle[:rest]
			w.mu.Unlock()
			for _, k := range gone {
				k.tasks <- nil
			}
			clear(gone)
		}
	}
}

// stop lets the workers go once their tasks return, runs what is still
// queued (each its owner's last), and waits for them.
func (w *workers) stop() {
	w.mu.Lock()
	w.stopped = true
	idle := w.idle
	w.idle = nil
	var left []task
	for f := w.popLocked(); f != nil; f = w.popLocked() {
		left = append(left, f)
	}
	w.watch.Stop()
	w.mu.Unlock()
	for _, k := range idle {
		k.tasks <- nil
	}
	for _, f := range left {
		f.run()
	}
	close(w.quit)
	w.wg.Wait()
}

// Workers is the number of worker goroutines alive, busy or idle.
func (p *Poller) Workers() int { return int(p.workers.n.Load()) }

// Unstuck is how many workers have been started beside workers stuck in a
// task: a count that grows says ready functions block.
func (p *Poller) Unstuck() int64 { return p.workers.spawned.Load() }
