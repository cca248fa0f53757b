package engine

import (
	"context"
	"sync"
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
	reqs chan dialReq
	// slots holds a token per running dialer: at most cap(slots).
	slots chan struct{}
	idle  time.Duration
	wg    sync.WaitGroup
}

// dialReq is one connect: fn runs on a dialer, its result goes to done.
type dialReq struct {
	fn   func() (probe.Session, error)
	done chan<- dialResult
}

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
	return &dialers{ctx: ctx, reqs: make(chan dialReq), slots: make(chan struct{}, n), idle: idle}
}

// running returns how many dialers are running.
func (d *dialers) running() int { return len(d.slots) }

// do runs fn on a dialer and returns its result. fn must return once ctx
// ends (a driver's Connect does); do waits for it, so a session a late
// login opened is never dropped unclosed.
func (d *dialers) do(ctx context.Context, fn func() (probe.Session, error)) (probe.Session, error) {
	done := make(chan dialResult, 1)
	r := dialReq{fn: fn, done: done}
	select {
	case d.reqs <- r: // an idle dialer took it
	default:
		select {
		case d.reqs <- r:
		case d.slots <- struct{}{}:
			d.wg.Add(1)
			// Exits after dialerIdle without work, or when the
			// population ends.
			go d.dialer(r)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res := <-done
	return res.s, res.err
}

func (d *dialers) dialer(r dialReq) {
	defer d.wg.Done()
	defer func() { <-d.slots }()
	idle := time.NewTimer(d.idle)
	defer idle.Stop()
	for {
		s, err := r.fn()
		r.done <- dialResult{s, err}
		idle.Reset(d.idle)
		select {
		case r = <-d.reqs:
		case <-idle.C:
			return
		case <-d.ctx.Done():
			return
		}
	}
}

// wait returns once every dialer has exited; the population's context must
// have ended.
func (d *dialers) wait() { d.wg.Wait() }
