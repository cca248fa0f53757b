package engine

import (
	"bytes"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// What a session reads: acks and rejections of the user's own messages,
// and deliveries, which go to the device's inbox in the ledger. A device is
// its sessions' Handler.

// OnAck implements Handler.
func (dev *device) OnAck(ref uint64, _ probe.Ack) {
	u := dev.u
	now := time.Now().UnixNano()
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		f.st.ackedAt(f.seq, now)
		f.st.fate.ack(f.seq)
	}
	u.mu.Unlock()
	if !ok {
		// Already written off after an ack timeout.
		return
	}
	u.p.opts.Set.Kind[f.st.kind].AckLatency.Observe(float64(now-f.sentAt) / 1e9)
	normal, slow := int(f.st.fanout-f.st.slowFanout), int(f.st.slowFanout)
	if f.st.grp != nil {
		normal, slow = u.p.oweGroup(f.st, f.seq, f.intended, f.sentAt, now)
	}
	u.p.ledger.Owe(f.st.kind, normal, slow)
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
func (dev *device) OnReject(ref uint64, reason string) {
	u := dev.u
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

// OnSendFailed implements SendFailer: a send request that never got an
// answer counts as a failed write.
func (dev *device) OnSendFailed(ref uint64, err error) {
	u := dev.u
	u.mu.Lock()
	f, ok := u.take(ref)
	if ok {
		f.st.addVoid(f.seq)
		u.unacked(ref, metrics.SendWrite, "")
	}
	u.mu.Unlock()
	if ok {
		u.p.opts.Set.SendErrors[metrics.SendWrite].Inc()
		u.p.log.Debug("send failed", "user", u.name, "err", err)
	}
}

// OnDelivery implements Handler. Latency is measured to when the frame was
// read off the socket when the adapter says so; the time from there to the
// ledger is the prober's own receive lag, recorded apart.
func (dev *device) OnDelivery(d *probe.Delivery) {
	at := d.At
	if at == 0 {
		at = time.Now().UnixNano()
	}
	p := dev.u.p
	// A clock body fetched by catch-up dates from its fetch, not its
	// delivery: neither a sample nor a probe message.
	if c := p.clock; c != nil && (d.Recovered && bytes.HasPrefix(d.Body, []byte(clockMagic+" ")) || !d.Recovered && c.onDelivery(dev, d.Body, at)) {
		return
	}
	if d.Recovered {
		dev.inbox.Recover(d.Body, at)
	} else {
		dev.inbox.Receive(d.Body, at)
	}
	if dev.u.slow {
		dev.readSlowly()
		return
	}
	if h := p.opts.Health; h != nil && d.At != 0 {
		h.ReceiveLag(time.Duration(time.Now().UnixNano() - d.At))
	}
}

// readSlowly holds a slow reader's reading: the frames behind this one
// wait in the socket buffers, and then on the server.
func (dev *device) readSlowly() {
	p := dev.u.p
	sr := p.opts.SlowReaders
	if sr.Pause > 0 && dev.nextPause >= 0 && time.Now().UnixNano() >= dev.nextPause {
		dev.nextPause = -1
		if sr.PauseEvery > 0 {
			dev.nextPause = time.Now().Add(sr.Pause + sr.PauseEvery).UnixNano()
		}
		dev.hold(sr.Pause)
	}
	if sr.ReadDelay > 0 {
		dev.hold(sr.ReadDelay)
	}
}

// hold stops the device's reading for d: a watched session stops being
// read once this frame is handled (probe.Holder), with nothing asleep;
// one read by Serve sleeps here, on its read loop.
func (dev *device) hold(d time.Duration) {
	u := dev.u
	u.mu.Lock()
	h, ok := dev.sess.(probe.Holder)
	u.mu.Unlock()
	if ok && h.Hold(d) {
		return
	}
	probe.Sleep(u.p.ctx, d)
}
