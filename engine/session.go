package engine

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"golang.org/x/time/rate"
)

// A user's sessions: provisioning, connecting (at the population's
// connect rate, over the user's link), the read loop's lifetime and the
// reconnect backoff.

// ConnectLimiter is the token bucket of MaxConnectRate, which every
// connect attempt of the populations sharing it draws from, and the count
// of those attempts: what a reconnect-storm drill measures the achieved
// connect rate by.
type ConnectLimiter struct {
	// mu orders the reservations by the time they are taken at: see
	// reserve.
	mu       sync.Mutex
	lim      *rate.Limiter
	attempts atomic.Int64
}

// NewConnectLimiter returns the limiter of MaxConnectRate: a tenth of a
// second's worth of burst, enough that a ramp at the limit does not stutter
// on timer granularity, too little to be a storm.
func NewConnectLimiter(perSecond float64) *ConnectLimiter {
	return &ConnectLimiter{lim: rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/10)))}
}

// Limit is the connect attempts per second allowed.
func (l *ConnectLimiter) Limit() float64 { return float64(l.lim.Limit()) }

// Burst is how many attempts may go at once, over the rate.
func (l *ConnectLimiter) Burst() int { return l.lim.Burst() }

// Attempts counts the connect attempts let through: those whose token
// came, when it came, not when they asked for it.
func (l *ConnectLimiter) Attempts() int64 { return l.attempts.Load() }

// reserve takes one attempt's token and returns how long the attempt
// must wait for it; the attempt counts once it has (went).
//
// The time is read under mu: rate.Limiter.Reserve reads the clock before
// it locks, and a reservation stamped earlier than the one before it moves
// the bucket's clock back, so that the interval between is refilled twice.
// Hundreds of logins at once let a few tokens more through than the rate
// (TestConnectRateHoldsForTheProcess: 400 attempts in 3.877 s at 100/s
// with a burst of 10).
func (l *ConnectLimiter) reserve() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	return l.lim.ReserveN(now, 1).DelayFrom(now) // always OK: one token, burst at least 1
}

// went counts an attempt whose wait for its token is over.
func (l *ConnectLimiter) went() { l.attempts.Add(1) }

// provision retries until the server takes the plan: a daemon that starts
// before its target must wait for it, not exit.
func (p *Population) provision(ctx context.Context) error {
	plan := p.Plan()
	for attempt := 0; ; attempt++ {
		err := p.opts.Driver.Provision(ctx, plan)
		if err == nil {
			if attempt > 0 {
				// Only after a failure: provisioning that works says
				// nothing the first login will not.
				p.opts.Reach.Succeeded()
				p.log.Info("provisioned", "attempts", attempt+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		// A provisioning attempt is a connect attempt that failed
		// before any session: counted as one, under the reason it
		// could not connect for, or provisioning if it did connect.
		err = probe.Provisioning(err)
		reason := p.failed(err)
		// Once per outage: each attempt is counted, and the daemon's
		// watch logs the target's state; a line per retry would bury it.
		log := p.log.Debug
		if attempt == 0 {
			log = p.log.Warn
		}
		log("provisioning failed, retrying", "reason", reason, "err", err)
		if !probe.Sleep(ctx, p.backoff(attempt)) {
			return nil
		}
	}
}

// backoff is exponential with full jitter: uniform in [0, min(max, min·2^n)).
func (p *Population) backoff(attempt int) time.Duration {
	c := p.opts.BackoffMax
	// Shift only while it cannot overflow: a negative cap would panic.
	if attempt < 62 && p.opts.BackoffMin <= c>>attempt {
		c = p.opts.BackoffMin << attempt
	}
	return time.Duration(rand.Int64N(int64(c)) + 1)
}

// startDevice starts dev at its ramp slot (or when late users log in). The
// wait holds a timer, not a goroutine: a goroutine that ever existed
// leaves its descriptor (about 450 bytes) in the runtime for good, so a
// goroutine per device sleeping through the ramp would cost each session
// that much for the life of the process.
func (p *Population) startDevice(ctx context.Context, dev *device, start time.Time) {
	o := p.opts
	u := dev.u
	var at time.Time
	// Slots over this process's users: a shard ramps its slice in over
	// the whole ramp, as the shards of one population start together.
	if all := p.localUsers() * o.Devices; all > 1 && o.Ramp > 0 {
		slot := (int(u.idx)-p.Slice().Lo)*o.Devices + int(dev.idx)
		at = start.Add(time.Duration(int64(o.Ramp) * int64(slot) / int64(all)))
	}
	if u.late && start.Add(o.LateAfter).After(at) {
		at = start.Add(o.LateAfter)
	}
	wait := time.Until(at)
	if wait <= 0 && p.poller != nil {
		// Not even a timer's goroutine: with no ramp, every device
		// starts at once, and a timer each would start them all.
		p.attempt(ctx, dev, 0)
		return
	}
	afterCtx(ctx, wait, func() { p.next(ctx, dev, 0) }, p.devices.Done)
}

// next starts dev's next connect attempt: with a poller, as a chain of
// timers and dialer callbacks that holds no goroutine while it waits
// (attempt); without, on a goroutine of its own that serves the session
// and reconnects (cycle).
func (p *Population) next(ctx context.Context, dev *device, attempt int) {
	if p.poller != nil {
		p.attempt(ctx, dev, attempt)
		return
	}
	p.cycle(ctx, dev, attempt)
}

// attempt is cycle's first half for a population with a poller: the
// connect rate's token, waited for on a timer, then the connect queued
// for a dialer (connected goes on from its result).
func (p *Population) attempt(ctx context.Context, dev *device, attempt int) {
	if ctx.Err() != nil {
		p.devices.Done()
		return
	}
	if d := p.connectToken(); d > 0 {
		afterCtx(ctx, d, func() {
			p.tokenWaited(d, true)
			p.dial(ctx, dev, attempt)
		}, func() {
			p.tokenWaited(d, false)
			p.devices.Done()
		})
		return
	}
	p.dial(ctx, dev, attempt)
}

// dial queues dev's connect for a dialer; connected runs on the dialer
// with its result.
func (p *Population) dial(ctx context.Context, dev *device, attempt int) {
	t0 := time.Now()
	d := p.linkOf(dev)
	name := dev.u.name
	p.dialers.start(&dialReq{
		fn:   func() (probe.Session, error) { return p.opts.Driver.Connect(ctx, name, d) },
		then: func(sess probe.Session, err error) { p.connected(ctx, dev, attempt, t0, sess, err) },
	})
}

// connected is cycle's second half for a population with a poller: the
// connect's result counted, then the session handed to the poller, or a
// retry after a backoff on a timer. A session the poller cannot watch is
// served on a goroutine of its own, as cycle would.
func (p *Population) connected(ctx context.Context, dev *device, attempt int, t0 time.Time, sess probe.Session, err error) {
	if !p.counted(ctx, dev, t0, err) {
		if sess != nil {
			_ = sess.Close()
		}
		p.devices.Done()
		return
	}
	if err != nil {
		afterCtx(ctx, p.backoff(attempt), func() { p.attempt(ctx, dev, attempt+1) }, p.devices.Done)
		return
	}
	l := p.goOnline(ctx, dev, sess)
	if w, ok := sess.(probe.Watcher); ok && w.Watch(dev, func(err error) { p.resume(ctx, l, err, attempt) }) {
		return
	}
	// Its last step is cycle's, which marks the device done.
	go p.serve(ctx, l, attempt)
}

// counted counts a connect's result, as cycle does, and reports whether
// the device goes on (ctx has not ended).
func (p *Population) counted(ctx context.Context, dev *device, t0 time.Time, err error) bool {
	u := dev.u
	if obs := p.opts.Observer; obs != nil && ctx.Err() == nil {
		obs.Login(int(u.idx), time.Since(t0), err)
	}
	if m := dev.storm.Load(); m != nil && ctx.Err() == nil {
		dev.stormAttempt(m, t0, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		reason := p.failed(err)
		p.log.Debug("connect failed", "user", u.name, "device", dev.idx, "reason", reason, "err", err)
	}
	return true
}

// serve serves l's session on this goroutine, then goes on as cycle.
func (p *Population) serve(ctx context.Context, l *live, attempt int) {
	p.served.Add(1)
	err := l.sess.Serve(l.dev)
	p.served.Add(-1)
	next, live := p.goOffline(ctx, l, err, attempt)
	if !live || !probe.Sleep(ctx, p.backoff(next)) {
		p.devices.Done()
		return
	}
	p.cycle(ctx, l.dev, next+1)
}

// cycle connects dev, serves its session and reconnects after it ends,
// until ctx ends; then it marks the device done (p.devices). A session
// the population's Poller can watch (probe.Watcher) is handed to it
// instead: cycle returns, and the session's end carries on (resume), so
// that an online session holds no goroutine.
func (p *Population) cycle(ctx context.Context, dev *device, attempt int) {
	for ctx.Err() == nil {
		// Before t0: the wait is imcanary's, not the server's login time.
		if !p.awaitConnect(ctx) {
			break
		}
		t0 := time.Now()
		sess, err := p.connect(ctx, dev)
		if !p.counted(ctx, dev, t0, err) {
			break
		}
		if err != nil {
			if !probe.Sleep(ctx, p.backoff(attempt)) {
				break
			}
			attempt++
			continue
		}
		l := p.goOnline(ctx, dev, sess)
		if w, ok := sess.(probe.Watcher); ok && p.poller != nil && w.Watch(dev, func(err error) { p.resume(ctx, l, err, attempt) }) {
			return
		}
		p.served.Add(1)
		err = sess.Serve(dev)
		p.served.Add(-1)
		next, live := p.goOffline(ctx, l, err, attempt)
		if !live || !probe.Sleep(ctx, p.backoff(next)) {
			break
		}
		attempt = next + 1
	}
	p.devices.Done()
}

// resume is a watched session's end: what cycle does after Serve, then
// the backoff on a timer and the next attempt.
func (p *Population) resume(ctx context.Context, l *live, err error, attempt int) {
	next, live := p.goOffline(ctx, l, err, attempt)
	if !live {
		p.devices.Done()
		return
	}
	afterCtx(ctx, p.backoff(next), func() { p.next(ctx, l.dev, next+1) }, p.devices.Done)
}

// afterCtx runs f on a goroutine of its own after d, or cancelled (on
// the context's goroutine) if ctx ends first: exactly one of them runs.
// The wait holds a timer, not a goroutine.
func afterCtx(ctx context.Context, d time.Duration, f, cancelled func()) {
	var once atomic.Bool
	var stop func() bool
	// The timer exists, stopped, before the context can fire, so neither
	// callback reads a variable the other is still writing.
	t := time.AfterFunc(time.Hour, func() {
		if once.CompareAndSwap(false, true) {
			stop()
			f()
		}
	})
	t.Stop()
	stop = context.AfterFunc(ctx, func() {
		if once.CompareAndSwap(false, true) {
			t.Stop()
			cancelled()
		}
	})
	t.Reset(max(d, 0))
}

// live is one session of a device, online: what its end undoes.
type live struct {
	dev  *device
	sess probe.Session
	// began is when the session logged in (Unix ns).
	began   int64
	churned atomic.Bool
	// lifetime churns the session, if the population churns.
	lifetime *time.Timer
}

// goOnline counts dev's new session online and arms its end: ctx's end
// (closeSessions), and its lifetime if sessions churn.
func (p *Population) goOnline(ctx context.Context, dev *device, sess probe.Session) *live {
	o := p.opts
	u := dev.u
	o.Set.ConnectOK.Inc()
	o.Reach.Succeeded()
	l := &live{dev: dev, sess: sess, began: time.Now().UnixNano()}
	u.mu.Lock()
	dev.sess = sess
	dev.sessStart = l.began
	u.mu.Unlock()
	dev.inbox.onlineSince.Store(l.began)
	if o.OwedAfterLogin {
		dev.inbox.owedFrom.CompareAndSwap(0, l.began+int64(firstOwed))
	}
	dev.online.Store(true)
	dev.nextPause = 0
	u.everOnline.Store(true)
	o.Set.Online.Inc()
	if p.addOnline(1) == int64(p.localUsers()*o.Devices) && !p.ready.Swap(true) {
		if !o.Block {
			o.Set.Ready.Set(1)
		}
		close(p.readyC)
		p.log.Info("population online", "users", o.Users, "devices", o.Devices, "took", time.Since(p.started).Round(time.Millisecond))
	}
	// Run's end closes every session it finds in dev.sess; one that
	// was not there yet when it looked is closed here.
	if ctx.Err() != nil {
		_ = sess.Close()
	}
	if o.SessionLifetime > 0 {
		life := time.Duration(rand.ExpFloat64() * float64(o.SessionLifetime))
		l.lifetime = time.AfterFunc(life, func() { l.churned.Store(true); _ = sess.Close() })
	}
	return l
}

// goOffline counts l's session, ended with err, offline. It returns the
// attempt number the reconnect's backoff is for, and false if ctx has
// ended.
func (p *Population) goOffline(ctx context.Context, l *live, err error, attempt int) (int, bool) {
	o := p.opts
	dev, u, obs := l.dev, l.dev.u, o.Observer
	if l.lifetime != nil {
		l.lifetime.Stop()
	}
	_ = l.sess.Close()
	dev.online.Store(false)
	dev.inbox.onlineSince.Store(0)
	o.Set.Online.Dec()
	p.addOnline(-1)
	reason := probe.ReasonOf(err)
	if l.churned.Load() && ctx.Err() == nil {
		reason = metrics.ReasonChurn
	}
	o.Set.Disconnects[reason].Inc()
	if obs != nil {
		obs.Disconnect(int(u.idx), reason, err)
	}
	dev.endSession()
	if ctx.Err() != nil {
		return attempt, false
	}
	p.ends.note(u.name, dev.idx, reason, err)
	// A session that held for a while earns a fresh backoff; one the
	// server kills at once keeps backing off, so a flapping server
	// is not stormed.
	if time.Since(time.Unix(0, l.began)) > o.BackoffMax || reason == metrics.ReasonChurn {
		attempt = 0
	}
	return attempt, true
}

// failed counts a failed connect, login or provisioning attempt under its
// reason and tells Reach; it returns the reason.
func (p *Population) failed(err error) string {
	reason := probe.FailureReason(err)
	p.opts.Set.Failed(reason)
	p.opts.Reach.Failed(reason, err)
	return reason
}

// connect runs the driver's Connect for dev on one of the population's
// dialers (see dialers).
func (p *Population) connect(ctx context.Context, dev *device) (probe.Session, error) {
	d := p.linkOf(dev)
	return p.dialers.do(ctx, func() (probe.Session, error) { return p.opts.Driver.Connect(ctx, dev.u.name, d) })
}

// linkOf is what the driver is told of dev's connection.
func (p *Population) linkOf(dev *device) probe.Device {
	u := dev.u
	// Slow readers dial as a slow link; a device keeps its source address
	// across reconnects.
	d := probe.Device{Index: int(dev.idx), Link: probe.Link{Slow: u.slow, Connect: &p.opts.Set.Connect, Poller: p.poller}, Catchup: dev.catchup}
	if a := p.opts.SourceAddrs; len(a) > 0 {
		d.Link.Source = a[(int(u.idx)*p.opts.Devices+int(dev.idx))%len(a)]
	}
	return d
}

// awaitConnect takes the token of one connect attempt, waiting as long as
// MaxConnectRate requires, and reports whether ctx is still live.
func (p *Population) awaitConnect(ctx context.Context) bool {
	d := p.connectToken()
	if d == 0 {
		return ctx.Err() == nil
	}
	// Should ctx end, the token is not given back: the population ends
	// with it.
	live := probe.Sleep(ctx, d)
	p.tokenWaited(d, live)
	return live
}

// connectToken takes the token of one connect attempt: 0 if the attempt
// may go now, else how long it must wait first, counted as held until
// tokenWaited.
func (p *Population) connectToken() time.Duration {
	if p.connects == nil {
		return 0
	}
	d := p.connects.reserve()
	if d <= 0 {
		p.connects.went()
		return 0
	}
	p.held.Add(1)
	return d
}

// tokenWaited ends a wait of d for a connect token; live is whether the
// attempt goes on (the population's context has not ended).
func (p *Population) tokenWaited(d time.Duration, live bool) {
	waiting := p.held.Add(-1)
	if live {
		p.connects.went()
		p.noteHeldBack(d, waiting)
	}
}

// noteHeldBack logs, at most once a second, an attempt that the rate limit
// held back for d and how many still wait: a mass reconnect is held back
// by design, and an operator wondering why sessions come back slowly sees
// it at Debug, a line a second while it lasts.
func (p *Population) noteHeldBack(d time.Duration, waiting int64) {
	now := time.Now().UnixNano()
	last := p.heldLogged.Load()
	if now-last < int64(time.Second) || !p.heldLogged.CompareAndSwap(last, now) {
		return
	}
	p.log.Debug("connects held back by population.max_connect_rate",
		"max_connect_rate", p.opts.MaxConnectRate, "waited", d.Round(time.Millisecond), "waiting", waiting)
}

// endSession writes off every message of the device's ended session that
// the server never acknowledged.
func (dev *device) endSession() {
	u := dev.u
	set := u.p.opts.Set
	u.mu.Lock()
	defer u.mu.Unlock()
	dev.sess = nil
	n := 0
	for _, f := range u.inflight {
		if f.dev != dev {
			u.inflight[n] = f
			n++
			continue
		}
		f.st.addVoid(f.seq)
		u.unacked(f.ref, metrics.SendDisconnected, "")
	}
	if lost := len(u.inflight) - n; lost > 0 {
		set.SendErrors[metrics.SendDisconnected].Add(float64(lost))
	}
	u.inflight = u.inflight[:n]
}

// closeSessions closes every session online: Run's end. One hook for the
// population, not one per session (a context.AfterFunc each cost about
// 150 bytes a session).
func (p *Population) closeSessions() {
	var open []probe.Session
	for _, u := range p.users {
		u.mu.Lock()
		for _, dev := range u.devices {
			if dev.sess != nil {
				open = append(open, dev.sess)
			}
		}
		u.mu.Unlock()
		// Closed outside the lock: a close may end the session's
		// watch at once, and its end takes the lock.
		for _, s := range open {
			_ = s.Close()
		}
		clear(open)
		open = open[:0]
	}
}
