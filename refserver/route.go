package refserver

import (
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// sendMessage accepts a send frame: it assigns the message its id and
// conversation sequence, acks it and routes its deliveries, all under mu
// so that the order of sequence numbers is the order of acks and of
// deliveries.
func (s *Server) sendMessage(c *conn, f *inFrame) {
	if (f.To == "") == (f.Group == "") {
		c.closeWith(websocket.ClosePolicyViolation, `send: need exactly one of "to" and "group"`)
		return
	}
	body := []byte(f.Body)
	switch {
	case len(body) == 0:
		body = []byte(`""`)
	case body[0] != '"':
		c.closeWith(websocket.ClosePolicyViolation, "send: body must be a JSON string")
		return
	case !utf8.Valid(body):
		// encoding/json lets invalid UTF-8 through in a raw value, and a
		// text frame carrying it would fail at every recipient.
		c.closeWith(websocket.ClosePolicyViolation, "send: body is not valid UTF-8")
		return
	}
	var conv, toKey, to string
	if f.To != "" {
		a, b := c.user, f.To
		if a > b {
			a, b = b, a
		}
		conv, toKey, to = "d:"+a+":"+b, "to", f.To
	} else {
		conv, toKey, to = "g:"+f.Group, "group", f.Group
	}

	// Faults are read before the ack goes out: a client that changes them
	// once it holds the ack must not affect the message acked.
	faults := s.faults.Load()
	s.mu.Lock()
	var g *group
	if f.Group != "" {
		g = s.groups[f.Group]
		if !g.has(c.user) {
			s.mu.Unlock()
			s.enqueue(c, appendError(nil, f.ID, "not_member", fmt.Sprintf("not a member of group %q", f.Group)))
			return
		}
	}
	seq, ok := s.seqs[conv]
	if !ok && len(s.seqs) >= maxConversations {
		s.mu.Unlock()
		s.enqueue(c, appendError(nil, f.ID, "limit", "too many conversations"))
		return
	}
	seq++
	s.seqs[conv] = seq
	s.msgID++
	id := s.msgID
	// If the ack overflows the sender's queue the sender is kicked, but
	// the message was accepted and is still delivered.
	s.enqueue(c, appendAck(make([]byte, 0, 64+len(f.ID)+len(conv)), f.ID, id, conv, seq))
	frame := appendMsg(make([]byte, 0, 96+len(c.user)+len(to)+len(conv)+len(body)), c.user, toKey, to, conv, id, seq, body)
	// The reorder fault swaps deliveries within one sender's messages to
	// one conversation: that is the order a client can check.
	stream := conv + "\x00" + c.user
	if g == nil {
		s.deliver(f.To, stream, frame, faults)
	} else {
		// One frame for all recipients: fan-out costs a queue slot each,
		// not an encoding each.
		for _, m := range g.members {
			if m != c.user {
				s.deliver(m, stream, frame, faults)
			}
		}
	}
	s.mu.Unlock()
	s.stats.sent.Add(1)
}

// has reports whether user is a member of g; a nil g has no members.
func (g *group) has(user string) bool {
	if g == nil {
		return false
	}
	_, ok := g.set[user]
	return ok
}

// setGroup creates or replaces a group. The same members again leave the
// group as it is; a group's sequence survives a change of members.
func (s *Server) setGroup(c *conn, f *inFrame) {
	if f.Group == "" {
		c.closeWith(websocket.ClosePolicyViolation, `group: missing "group" name`)
		return
	}
	members := make([]string, 0, len(f.Members))
	set := make(map[string]struct{}, len(f.Members))
	for _, m := range f.Members {
		if m == "" {
			c.closeWith(websocket.ClosePolicyViolation, "group: empty member name")
			return
		}
		if _, dup := set[m]; !dup {
			set[m] = struct{}{}
			members = append(members, m)
		}
	}
	s.mu.Lock()
	old := s.groups[f.Group]
	if old == nil && len(s.groups) >= maxGroups {
		s.mu.Unlock()
		s.enqueue(c, appendError(nil, f.ID, "limit", "too many groups"))
		return
	}
	if old == nil || !slices.Equal(old.members, members) {
		s.groups[f.Group] = &group{members: members, set: set}
	}
	s.mu.Unlock()
	s.enqueue(c, appendReply(nil, "ok", f.ID))
}

// enqueue hands b to c's writer without ever blocking. Replies other than
// acks are enqueued without mu: they all come from c's own reader, one at
// a time, so they keep their order anyway. A full queue means
// the peer reads slower than it is written to: it is disconnected rather
// than buffered for.
func (s *Server) enqueue(c *conn, b []byte) bool {
	select {
	case c.send <- b:
		return true
	default:
		if c.closeWith(CloseSlowConsumer, "slow consumer") {
			s.stats.slowConsumerKicks.Add(1)
		}
		return false
	}
}

// deliver applies the faults to one delivery of frame to user. Called with
// mu held, which also serialises the calls to s.rand.
func (s *Server) deliver(user, stream string, frame []byte, f *Faults) {
	if f.Drop > 0 && s.rand() < f.Drop {
		s.stats.dropped.Add(1)
		return
	}
	copies := 1
	if f.Duplicate > 0 && s.rand() < f.Duplicate {
		copies = 2
		s.stats.duplicated.Add(1)
	}
	reorder := f.Reorder > 0 && s.rand() < f.Reorder
	d := f.Delay
	if f.Jitter > 0 {
		d += time.Duration(s.rand() * float64(f.Jitter))
	}
	for range copies {
		if d > 0 && s.schedule(delayed{at: s.now() + int64(d), user: user, stream: stream, frame: frame, reorder: reorder}) {
			s.stats.delayed.Add(1)
			continue
		}
		s.toUser(user, stream, frame, reorder)
	}
}

// toUser hands frame to user's live session, or to the user's offline
// queue if there is none or it is closing. A stalled session gets nothing:
// the frame is discarded there, at the moment of delivery, after the
// other faults. Called with mu held.
func (s *Server) toUser(user, stream string, frame []byte, reorder bool) {
	if c := s.users[user]; c != nil && !c.closing.Load() {
		if s.stalls(user) {
			s.stats.stalled.Add(1)
			return
		}
		s.handoff(c, stream, frame, reorder)
		return
	}
	s.offer(user, frame)
}

// handoff queues frame on c, or holds it back for the reorder fault: the
// held delivery goes out right after c's next one of the same stream (one
// sender in one conversation), or after reorderHold.
// Called with mu held.
func (s *Server) handoff(c *conn, stream string, frame []byte, reorder bool) {
	if reorder && c.held == nil {
		c.heldGen++
		if s.schedule(delayed{at: s.now() + int64(reorderHold), held: c, gen: c.heldGen}) {
			c.held, c.heldStream = frame, stream
			return
		}
	}
	if !s.enqueue(c, frame) {
		// c was just kicked; the frame waits for the user's next login.
		s.offer(c.user, frame)
		return
	}
	s.stats.deliveries.Add(1)
	if h := c.held; h != nil && c.heldStream == stream {
		c.held = nil
		if !s.enqueue(c, h) {
			s.offer(c.user, h)
			return
		}
		s.stats.deliveries.Add(1)
		s.stats.reordered.Add(1)
	}
}

// offer puts frame in user's offline queue, dropping the oldest beyond
// OfflineQueue. Called with mu held.
func (s *Server) offer(user string, frame []byte) {
	if s.offBytes+int64(len(frame)) > maxOfflineBytes {
		s.stats.offlineDrop.Add(1)
		return
	}
	q := s.offline[user]
	if q == nil {
		q = &offlineQueue{}
		s.offline[user] = q
	}
	if len(q.frames) >= s.opts.OfflineQueue {
		s.offBytes -= int64(len(q.frames[0]))
		q.frames[0] = nil
		q.frames = q.frames[1:]
		s.stats.offlineDrop.Add(1)
	}
	// append reallocates once the front has been sliced away often
	// enough, so the backing array stays within a small multiple of the
	// bound.
	q.frames = append(q.frames, frame)
	s.offBytes += int64(len(frame))
	s.stats.offlineQueued.Add(1)
}

// delayed is an entry of the delay line: a delivery to release to user,
// or, if held is set, the reorderHold timeout of held's held delivery.
type delayed struct {
	at      int64  // release time, ns since Server.epoch
	n       uint64 // insertion order, breaks ties in at
	user    string
	stream  string
	frame   []byte
	reorder bool
	held    *conn
	gen     uint64
}

// delayHeap is a min-heap by (at, n). It is hand-rolled rather than
// container/heap so a push does not box its entry.
type delayHeap []delayed

func (h delayHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].n < h[j].n
}

func (h *delayHeap) push(d delayed) {
	*h = append(*h, d)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *delayHeap) pop() delayed {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = delayed{} // let the frame go
	q = q[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(q) && q.less(l, m) {
			m = l
		}
		if r < len(q) && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// schedule adds d to the delay line, starting its goroutine on first use.
// It reports false if the server is closed or the line is full. Called
// with mu held.
func (s *Server) schedule(d delayed) bool {
	if s.closed || len(s.delays) >= maxDelayed {
		return false
	}
	s.delayN++
	d.n = s.delayN
	s.delays.push(d)
	if !s.delaying {
		s.delaying = true
		s.bg.Add(1)
		go s.delayLoop() // exits when Close closes done
	}
	if s.delays[0].n == d.n {
		// The new entry is the earliest: the loop's timer is too late.
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// delayLoop is the one goroutine behind every delay, jitter and reorder
// timeout: a single timer set to the heap's earliest entry, rather than a
// timer per message.
func (s *Server) delayLoop() {
	defer s.bg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := s.now()
		for len(s.delays) > 0 && s.delays[0].at <= now {
			s.release(s.delays.pop())
		}
		wait := time.Duration(-1)
		if len(s.delays) > 0 {
			wait = time.Duration(s.delays[0].at - now)
		}
		s.mu.Unlock()
		if wait >= 0 {
			t.Reset(wait)
		} else {
			t.Stop()
		}
		select {
		case <-s.done:
			return
		case <-s.wake:
		case <-t.C:
		}
	}
}

// release acts on a due entry of the delay line. Called with mu held.
func (s *Server) release(d delayed) {
	if c := d.held; c != nil {
		if c.held != nil && c.heldGen == d.gen {
			h := c.held
			c.held = nil
			// Routed by user, not to c: c may be closing by now.
			s.toUser(c.user, c.heldStream, h, false)
		}
		return
	}
	s.toUser(d.user, d.stream, d.frame, d.reorder)
}
