package engine

import (
	"context"
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// The sweep: ack timeouts, the ledger's loss deadlines, and each online
// session's delivery lag (a silent stall).

// sweeper writes off acks that did not come within the deadline and
// deliveries missing past lost_after.
func (p *Population) sweeper(ctx context.Context) {
	// Often enough to write off losses on time and to flag a stalled
	// session within a deadline: the lag threshold is half of one.
	every := max(min(p.opts.LostAfter/4, p.opts.LagThreshold/2, time.Second), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.Sweep(time.Now())
	}
}

// Sweep runs one sweep at now; the sweeper calls it, and tests call it to
// settle the ledger at a moment of their choosing.
func (p *Population) Sweep(now time.Time) {
	set := p.opts.Set
	ns := now.UnixNano()
	deadline := int64(p.opts.Deadline)
	var lagging, slowLag int64
	p.sweepMu.Lock()
	defer p.sweepMu.Unlock()
	for _, u := range p.users {
		u.mu.Lock()
		n := 0
		for _, f := range u.inflight {
			if ns-f.sentAt > deadline {
				f.st.addVoid(f.seq)
				set.SendErrors[metrics.SendAckTimeout].Inc()
				u.unacked(f.ref, metrics.SendAckTimeout, "")
				continue
			}
			u.inflight[n] = f
			n++
		}
		u.inflight = u.inflight[:n]
		u.mu.Unlock()
		for _, dev := range u.devices {
			u.mu.Lock()
			online := dev.sess != nil
			sessStart := dev.sessStart
			u.mu.Unlock()
			dev.inbox.Sweep(ns)
			lag, stalled := p.lag(dev, online, sessStart, ns)
			switch {
			case !online:
			case u.slow:
				slowLag = max(slowLag, lag)
			default:
				set.DeliveryLag.Observe(float64(lag))
				if stalled {
					lagging++
				}
			}
		}
	}
	p.ledger.lost.flush()
	set.Streams.Set(float64(p.ledger.Streams()))
	set.SessionsLagging.Set(float64(lagging))
	p.slowLag.Store(slowLag)
}

// lag returns how many messages the server acknowledged to dev's streams
// that dev has not received, and whether one of them has waited, with nothing
// later of its stream received, longer than the lag threshold while u was
// online: a session the server has silently stopped serving. A message
// lost on the way is not lag once a later one of its stream arrives; the
// ledger counts it as lost.
func (p *Population) lag(dev *device, online bool, sessStart, now int64) (lag int64, stalled bool) {
	if !online {
		for i := range dev.incoming {
			dev.incoming[i].waitSeq = 0
		}
		return 0, false
	}
	seen := p.lagScratch[:0]
	dev.inbox.mu.Lock()
	for _, l := range dev.incoming {
		var m uint64
		if st := dev.inbox.streams[l.st.key]; st != nil {
			m = st.maxSeen
		}
		seen = append(seen, m)
	}
	dev.inbox.mu.Unlock()
	p.lagScratch = seen
	threshold := int64(p.opts.LagThreshold)
	deadline := int64(p.opts.Deadline)
	for i := range dev.incoming {
		l := &dev.incoming[i]
		if p.churn && l.pos >= 0 && !l.st.grp.settled(l.pos, now, deadline) {
			// Out of the group, or changing: nothing of it is owed
			// now.
			l.waitSeq = 0
			continue
		}
		sender := p.users[l.st.from]
		sender.mu.Lock()
		acked := l.st.acked
		want := seen[i] + 1
		var ackedAt int64
		if acked >= want {
			a := l.st.acks[want%ackRing]
			if a.seq != want {
				// Too far behind for the ring: time it from the
				// oldest ack kept, which is later than its own.
				a = l.st.acks[(acked+1)%ackRing]
			}
			ackedAt = a.at
		}
		sender.mu.Unlock()
		if acked < want {
			l.waitSeq = 0
			continue
		}
		lag += int64(acked - seen[i])
		if l.waitSeq != want {
			l.waitSeq, l.since = want, max(ackedAt, sessStart)
		}
		if now-l.since > threshold {
			stalled = true
		}
	}
	return lag, stalled
}
