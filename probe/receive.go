package probe

import (
	"time"

	"github.com/imcanary/imcanary/metrics"
)

// What a session reads: acks and rejections of the user's own messages,
// and deliveries, which go to the user's inbox in the ledger.

// OnAck implements Handler.
func (u *user) OnAck(ref uint64, _ Ack) {
	now := time.Now().UnixNano()
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		st := f.st
		st.acked = max(st.acked, f.seq)
		st.acks[f.seq%ackRing] = ackStamp{seq: f.seq, at: now}
	}
	u.mu.Unlock()
	if !ok {
		// Already written off after an ack timeout.
		return
	}
	u.p.opts.Set.Kind[f.st.kind].AckLatency.Observe(float64(now-f.sentAt) / 1e9)
	u.p.ledger.Owe(f.st.kind, f.st.fanout-f.st.slowFanout, f.st.slowFanout)
	if obs := u.p.opts.Observer; obs != nil {
		obs.Ack(ref, f.st.kind == metrics.Group, time.Duration(now-f.sentAt))
	}
}

// unacked tells the observer, if any, that ref was written off.
func (u *user) unacked(ref uint64, reason, code string) {
	if obs := u.p.opts.Observer; obs != nil {
		obs.Unacked(ref, reason, code)
	}
}

// OnReject implements Handler.
func (u *user) OnReject(ref uint64, reason string) {
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		f.st.addVoid(f.seq)
		u.unacked(ref, metrics.SendRejected, reason)
	}
	u.mu.Unlock()
	if ok {
		u.p.opts.Set.SendErrors[metrics.SendRejected].Inc()
		u.p.log.Debug("message rejected", "user", u.name, "reason", reason)
	}
}

// OnDelivery implements Handler. Latency is measured to when the frame was
// read off the socket when the adapter says so; the time from there to the
// ledger is the prober's own receive lag, recorded apart.
func (u *user) OnDelivery(d *Delivery) {
	at := d.At
	if at == 0 {
		at = time.Now().UnixNano()
	}
	u.inbox.Receive(d.Body, at)
	p := u.p
	if u.slow {
		u.readSlowly()
		return
	}
	if h := p.opts.Health; h != nil && d.At != 0 {
		h.ReceiveLag(time.Duration(time.Now().UnixNano() - d.At))
	}
}

// readSlowly holds a slow reader's read loop: the frames behind this one
// wait in the socket buffers, and then on the server.
func (u *user) readSlowly() {
	sr := u.p.opts.SlowReaders
	if sr.Pause > 0 && u.nextPause >= 0 && time.Now().UnixNano() >= u.nextPause {
		u.nextPause = -1
		if sr.PauseEvery > 0 {
			u.nextPause = time.Now().Add(sr.Pause + sr.PauseEvery).UnixNano()
		}
		Sleep(u.p.ctx, sr.Pause)
	}
	if sr.ReadDelay > 0 {
		Sleep(u.p.ctx, sr.ReadDelay)
	}
}
