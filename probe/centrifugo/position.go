package centrifugo

import (
	"bytes"
	"fmt"

	"github.com/imcanary/imcanary/probe"
)

// A user's positions in its channels: the offsets and epochs Centrifugo
// numbers publications with, checked as the server's own sequence, and the
// recovery of what a session missed while it was away.

// subscribed takes the position a subscribe reply gives for ch, counting
// what the server published that this user's earlier sessions never saw,
// and delivers the publications it recovered (to h, or, during the
// handshake, to Serve later).
func (s *session) subscribed(ch string, r *result, pubs []byte, h probe.Handler) error {
	st := s.st
	st.mu.Lock()
	pos := st.pos[ch]
	if pos == nil {
		pos = &position{}
		st.pos[ch] = pos
	}
	var missed uint64
	gap, epochChanged := false, false
	switch {
	case !pos.known || len(r.epoch) == 0:
		// A first subscription, or one without positioning: nothing
		// was promised before.
	case string(r.epoch) != pos.epoch:
		gap, epochChanged = true, true
	case r.recovered:
		// The recovered publications continue from pos.
	case r.offset > pos.offset:
		gap, missed = true, r.offset-pos.offset
	}
	prev := pos.offset
	if len(r.epoch) > 0 {
		continues := pos.known && string(r.epoch) == pos.epoch
		if string(r.epoch) != pos.epoch {
			pos.epoch = string(r.epoch)
		}
		switch {
		case len(pubs) == 0:
			pos.offset = r.offset
		case !continues:
			// Nothing of this stream was seen yet: all it recovered
			// is ahead of the position.
			pos.offset = 0
		default:
			// The position stays at the last publication delivered
			// until deliverRecovered has handed the recovered ones
			// over: if the handshake fails, or the session ends
			// before Serve gets to them, the next subscription
			// recovers them again instead of asking from past them,
			// which would lose them with no count anywhere.
		}
		pos.known = true
	} else {
		pos.known = false
	}
	// The epoch whose position deliverRecovered moves; none without
	// positioning.
	epoch := ""
	if pos.known {
		epoch = pos.epoch
	}
	st.mu.Unlock()
	if gap {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets show publications missed while unsubscribed",
			"user", s.user, "channel", ch, "epoch_changed", epochChanged,
			"last_seen", prev, "offset", r.offset, "missed", missed, "recovering", r.wasRecov)
	}
	if len(pubs) == 0 {
		return nil
	}
	if h == nil {
		return s.keepEarly(early{ch: ch, raw: pubs, epoch: epoch, top: r.offset})
	}
	return s.deliverRecovered(ch, pubs, epoch, r.offset, h)
}

// deliverRecovered delivers the publications of a subscribe reply, then
// moves the user's position in ch up to the reply's offset top, if still
// in epoch (none: no position to move). Only once they are delivered: see
// subscribed.
func (s *session) deliverRecovered(ch string, pubs []byte, epoch string, top uint64, h probe.Handler) error {
	chb := []byte(ch)
	err := parsePubs(pubs, func(pb *pub) error {
		s.d.recovered.Add(1)
		s.onPub(chb, pb, h, true)
		return nil
	})
	if err != nil {
		return fmt.Errorf("recovered publications of %s: %w", ch, err)
	}
	if epoch == "" {
		return nil
	}
	st := s.st
	st.mu.Lock()
	if pos := st.pos[ch]; pos != nil && pos.known && pos.epoch == epoch {
		pos.offset = max(pos.offset, top)
		pos.recovered = max(pos.recovered, top)
	}
	st.mu.Unlock()
	return nil
}

// onPub tracks a publication's offset and delivers it, unless it is the
// user's own or one the user's position shows was delivered already.
// recovered says it came in a subscribe reply.
func (s *session) onPub(ch []byte, pb *pub, h probe.Handler, recovered bool) {
	if pb.offset != 0 && !s.track(ch, pb, recovered) {
		// At or below the position in the same epoch: offsets
		// number a channel's publications within an epoch, so this
		// one was delivered already, as when the live stream
		// repeats one a recovery brought. Delivered again, the
		// ledger would count it a duplicate.
		return
	}
	if bytes.Equal(pb.user, s.userB) {
		// Our own publication, echoed because we are subscribed: the
		// ledger expects a message only at its recipients.
		return
	}
	d := &s.delivery
	d.From, d.Group, d.Body, d.ServerSeq = pb.user, bytes.HasPrefix(ch, s.d.groupPrefix), pb.body, pb.offset
	h.OnDelivery(d)
}

// track advances the user's position in ch and counts a gap when the
// offsets skip or the epoch changes under a live subscription. It reports
// whether pb is fresh: false for an offset at or below a known position in
// the same epoch, a publication already delivered. The gaps of recovered
// publications are not counted here: subscribed counted them from the
// reply's offset.
func (s *session) track(ch []byte, pb *pub, recovered bool) (fresh bool) {
	st := s.st
	st.mu.Lock()
	pos := st.pos[string(ch)]
	if pos == nil || !pos.known {
		st.mu.Unlock()
		return true
	}
	prev := pos.offset
	var missed uint64
	gap := false
	fresh = true
	switch {
	case len(pb.epoch) > 0 && pos.epoch != "" && string(pb.epoch) != pos.epoch:
		gap = true
		pos.epoch, pos.offset = string(pb.epoch), pb.offset
	case pb.offset > pos.offset+1:
		gap, missed = true, pb.offset-pos.offset-1
		pos.offset = pb.offset
	case pb.offset == pos.offset+1:
		pos.offset = pb.offset
	case pb.offset <= pos.recovered:
		// A publication a recovery already delivered, which the live
		// stream also brought: the server's overlap, not a duplicate.
		fresh = false
	}
	// Any other offset at or below the position is delivered again: a
	// server that pushes the same publication twice is at fault, and the
	// ledger counts the duplicate.
	st.mu.Unlock()
	if gap && !recovered {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets skipped publications", "user", s.user, "channel", string(ch),
			"last_seen", prev, "offset", pb.offset, "missed", missed)
	}
	return fresh
}
