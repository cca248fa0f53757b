package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// dialers runs connects (a dial and a login) on a pool of goroutines that
// outlive one connect.
//
// Why not the user's own goroutine: a dial and a login (TLS, an HTTP
// upgrade, a parser) run deep and would grow its stack for good, while the
// user's goroutine spends its life in a shallow read loop; an idle session
// should keep a small stack. Why not a fresh goroutine per connect, as this
// once was: each one grew its stack from 2 KiB, copying it at every step
// (a tenth of a ramp's CPU profile). A pooled dialer grows once.
//
// The pool also bounds how many connects are in flight. A ramp faster than
// the machine (or the server) can log users in then queues here, in order,
// instead of as thousands of runnable goroutines: ramping 19,000 sessions
// as fast as two cores allow, the scheduler's p99 latency fell from about
// 300 ms to 75 ms with the pool, at the same CPU per login.
// Dialers that have been idle for dialerIdle exit, returning their stacks.
type dialers struct {
	ctx  context.Context // the population's: dialers exit when it ends
	max  int
	idle time.Duration

	mu sync.Mutex
	// pending are the connects waiting for a dialer, oldest from head.
	// A connect waits here as a small struct, not as a goroutine: a
	// ramp faster than the dialers queues thousands, and a goroutine
	// leaves its descriptor in the runtime for good.
	pending []*dialReq
	head    int
	// alive counts the dialers; parked, those waiting for work. A
	// connect that finds one parked takes it off the count and sends a
	// token on wake, which any parked dialer takes.
	alive, parked int
	wake          chan struct{}
	wg            sync.WaitGroup
}

// dialReq is one connect: fn runs on a dialer, and then is given its
// result, on the dialer's goroutine.
type dialReq struct {
	fn   func() (probe.Session, error)
	then func(probe.Session, error)
	// state is pending, taken by a dialer, or given up by its caller
	// (do's context ended first): a dialer skips one given up.
	state atomic.Int32
}

const (
	reqPending int32 = iota
	reqTaken
	reqGivenUp
)

type dialResult struct {
	s   probe.Session
	err error
}

const (
	// maxDialers bounds the connects in flight. Enough for 2,500
	// logins/s against a server 100 ms away; on loopback a few dozen
	// keep two cores busy.
	maxDialers = 256
	// dialerIdle is how long a dialer waits for work before it exits.
	dialerIdle = 2 * time.Second
)

// newDialers returns a pool of at most n dialers that exit after idle
// without work, or when ctx ends.
func newDialers(ctx context.Context, n int, idle time.Duration) *dialers {
	return &dialers{ctx: ctx, max: n, idle: idle, wake: make(chan struct{}, n)}
}

// running returns how many dialers are running.
func (d *dialers) running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.alive
}

// queued returns how many connects wait for a dialer.
func (d *dialers) queued() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending) - d.head
}

// start queues r and returns at once: a parked dialer takes it, or a new
// one if fewer than max run, or the first to finish its connect. Once the
// population's context has ended, r.then is called at once with its error.
// fn must return once that context ends (a driver's Connect does).
func (d *dialers) start(r *dialReq) {
	d.mu.Lock()
	if err := d.ctx.Err(); err != nil {
		d.mu.Unlock()
		r.then(nil, err)
		return
	}
	d.pending = append(d.pending, r)
	switch {
	case d.parked > 0:
		d.parked--
		d.mu.Unlock()
		d.wake <- struct{}{} // buffered for every dialer: never blocks
	case d.alive < d.max:
		d.alive++
		d.wg.Add(1)
		d.mu.Unlock()
		// Exits after idle without work, or when the population ends.
		go d.dialer()
	default:
		d.mu.Unlock()
	}
}

// do runs fn on a dialer and returns its result. A connect still waiting
// for a dialer when ctx ends gives up; one that has begun is waited for,
// so a session a late login opened is never dropped unclosed.
func (d *dialers) do(ctx context.Context, fn func() (probe.Session, error)) (probe.Session, error) {
	done := make(chan dialResult, 1)
	r := &dialReq{fn: fn, then: func(s probe.Session, err error) { done <- dialResult{s, err} }}
	d.start(r)
	select {
	case res := <-done:
		return res.s, res.err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqPending, reqGivenUp) {
			return nil, ctx.Err()
		}
		res := <-done
		return res.s, res.err
	}
}

// take returns the oldest pending connect not given up, or nil; d.mu is
// held.
func (d *dialers) take() *dialReq {
	for d.head < len(d.pending) {
		r := d.pending[d.head]
		d.pending[d.head] = nil
		d.head++
		if d.head == len(d.pending) {
			d.pending, d.head = d.pending[:0], 0
		}
		if r.state.CompareAndSwap(reqPending, reqTaken) {
			return r
		}
	}
	return nil
}

func (d *dialers) dialer() {
	defer d.wg.Done()
	idle := time.NewTimer(d.idle)
	defer idle.Stop()
	for {
		d.mu.Lock()
		r := d.take()
		if r == nil {
			d.parked++
			d.mu.Unlock()
			idle.Reset(d.idle)
			select {
			case <-d.wake:
				continue
			case <-idle.C:
			case <-d.ctx.Done():
			}
			d.mu.Lock()
			if d.parked == 0 {
				// A connect counted on a parked dialer and its
				// token is ours to take: this one stays.
				d.mu.Unlock()
				<-d.wake
				continue
			}
			d.parked--
			d.alive--
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		s, err := r.fn()
		r.then(s, err)
	}
}

// wait returns once every dialer has exited; the population's context must
// have ended.
func (d *dialers) wait() { d.wg.Wait() }
