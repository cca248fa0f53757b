package engine

import (
	"fmt"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// A reconnect-storm drill: a fraction of a population's sessions dropped at
// once without a clean close, as a load balancer restart drops them, and
// every connect attempt of those sessions until each is back.

// StormObserver hears a drill's dropped sessions. Its methods may be
// called from any session's goroutine at once.
type StormObserver interface {
	// Dropped is told of each session Drop is about to abort: user is
	// its user's index in the population, device the device's.
	Dropped(user, device int)
	// Attempt is one connect attempt of a dropped session that began at
	// start and ended at end; err nil means the session is back.
	Attempt(user int, start, end time.Time, err error)
}

// stormMark ties a dropped device to the drill waiting for it.
type stormMark struct{ obs StormObserver }

// Drop aborts fraction (above 0, at most 1) of the sessions online now,
// spread evenly over them, all at once and without a close frame, and
// tells obs about each and about every connect attempt each makes until
// it is back. It returns how many sessions were online and how many it
// dropped. A session of a protocol that cannot abort (not an Aborter) is
// an error, before anything is dropped.
func (p *Population) Drop(fraction float64, obs StormObserver) (online, dropped int, err error) {
	if !(fraction > 0 && fraction <= 1) {
		return 0, 0, fmt.Errorf("engine.Population.Drop: fraction %v, want above 0 and at most 1", fraction)
	}
	type victim struct {
		dev *device
		a   probe.Aborter
	}
	var victims []victim
	for _, u := range p.users {
		u.mu.Lock()
		for _, dev := range u.devices {
			if dev.sess == nil {
				continue
			}
			a, ok := dev.sess.(probe.Aborter)
			if !ok {
				u.mu.Unlock()
				return 0, 0, fmt.Errorf("a reconnect-storm drill drops sessions without a clean close, which this protocol's sessions (%T) cannot do", dev.sess)
			}
			if spread(online, fraction) {
				victims = append(victims, victim{dev, a})
			}
			online++
		}
		u.mu.Unlock()
	}
	// Marked before any is aborted: the first attempt after the drop
	// must find its mark, and the drop must be at once, not spread over
	// the time it takes to mark.
	m := &stormMark{obs: obs}
	for _, v := range victims {
		obs.Dropped(int(v.dev.u.idx), int(v.dev.idx))
		v.dev.storm.Store(m)
	}
	for _, v := range victims {
		v.a.Abort()
	}
	return online, len(victims), nil
}

// stormAttempt tells the drill of m about a connect attempt of dev that
// began at start, and lets dev go once it is back.
func (dev *device) stormAttempt(m *stormMark, start time.Time, err error) {
	if err == nil {
		dev.storm.CompareAndSwap(m, nil)
	}
	m.obs.Attempt(int(dev.u.idx), start, time.Now(), err)
}
