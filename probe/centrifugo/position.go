package centrifugo

import (
	"bytes"
	"fmt"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// A device's positions in its channels: the offsets and epochs Centrifugo
// numbers publications with, checked as the server's own sequence
// (ServerStats), and the publications a resubscribe recovered.

// subscribed takes the position a subscribe reply gives for ch, counting
// what the server published that this device's earlier sessions never saw,
// places the device in ch for catch-up, and delivers the publications it
// recovered (to h, or, during the handshake, to Serve later).
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
			// counts them again.
		}
		pos.known = true
	} else {
		pos.known = false
	}
	st.mu.Unlock()
	if gap {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets show publications missed while unsubscribed",
			"user", s.user, "channel", ch, "epoch_changed", epochChanged,
			"last_seen", prev, "offset", r.offset, "missed", missed, "recovering", r.wasRecov)
	}
	// Catch-up's place moves now for what needs no delivery first (a
	// first subscription, a lost stream, nothing recovered), else once
	// the recovered publications are delivered, as the position does.
	if len(pubs) == 0 {
		s.placed(ch, string(r.epoch), r.offset, false)
		return nil
	}
	s.placed(ch, string(r.epoch), r.offset, true)
	if h == nil {
		return s.keepEarly(early{ch: ch, raw: pubs, epoch: string(r.epoch), top: r.offset})
	}
	return s.deliverRecovered(ch, pubs, string(r.epoch), r.offset, h)
}

// deliverRecovered delivers the publications a subscribe reply recovered in
// ch, then moves the device's position in ch up to the reply's offset top,
// if still in epoch, and tells catch-up where the stream stands. Only once
// they are delivered: see subscribed.
func (s *session) deliverRecovered(ch string, pubs []byte, epoch string, top uint64, h probe.Handler) error {
	chb := []byte(ch)
	last := uint64(0)
	err := parsePubs(pubs, func(pb *pub) error {
		s.d.recovered.Add(1)
		last = max(last, pb.offset)
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
	}
	st.mu.Unlock()
	// Centrifugo answers a full recovery with the offset it was asked
	// from, the publications bringing the stream to its top: the top is
	// the higher of the two.
	s.behind(ch, epoch, max(top, last))
	return nil
}

// onPub tracks a publication's offset, tells catch-up the device holds it,
// and delivers it unless the device published it itself. recovered says it
// was fetched (a subscribe's recovery, a history page), not pushed.
func (s *session) onPub(ch []byte, pb *pub, h probe.Handler, recovered bool) {
	if pb.offset != 0 {
		s.track(ch, pb, recovered)
		if s.cu != nil {
			if m, ok := s.marks[string(ch)]; ok {
				s.cu.Got(ch, pb.offset+m.shift, time.Now().UnixNano())
			}
		}
	}
	if s.ownEcho(pb.client) {
		// This device's own publication, echoed because it is
		// subscribed: its inbox holds it already (or, with one device,
		// is owed it nowhere). One of the user's other devices'
		// publications is delivered: the user's devices mirror each
		// other (MirrorsOwn).
		return
	}
	d := &s.delivery
	d.From, d.Group, d.Body, d.ServerSeq, d.Recovered = pb.user, bytes.HasPrefix(ch, s.d.groupPrefix), pb.body, pb.offset, recovered
	h.OnDelivery(d)
}

// track advances the device's position in ch and counts a gap when the
// offsets skip or the epoch changes under a live subscription. The gaps of
// fetched publications are not counted here: subscribed counted them from
// the reply's offset, and a history page fills a gap already counted.
// Every publication is delivered, one at or below the position too: a
// server that pushes one twice is at fault, and the ledger counts the
// duplicate; a push of what catch-up fetched (or the reverse) it counts
// as the overlap it is.
func (s *session) track(ch []byte, pb *pub, recovered bool) {
	st := s.st
	st.mu.Lock()
	pos := st.pos[string(ch)]
	if pos == nil || !pos.known {
		st.mu.Unlock()
		return
	}
	prev := pos.offset
	var missed uint64
	gap := false
	switch {
	case len(pb.epoch) > 0 && pos.epoch != "" && string(pb.epoch) != pos.epoch:
		gap = true
		pos.epoch, pos.offset = string(pb.epoch), pb.offset
	case pb.offset > pos.offset+1:
		gap, missed = true, pb.offset-pos.offset-1
		pos.offset = pb.offset
	case pb.offset == pos.offset+1:
		pos.offset = pb.offset
	}
	st.mu.Unlock()
	if gap && !recovered {
		s.d.gaps.Add(1)
		s.d.missed.Add(missed)
		s.d.log.Debug("server offsets skipped publications", "user", s.user, "channel", string(ch),
			"last_seen", prev, "offset", pb.offset, "missed", missed)
	}
}
