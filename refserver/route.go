package refserver

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/internal/minheap"
)

// sendMessage accepts a send frame: it assigns the message its id and
// conversation sequence, acks it, keeps it in history and routes its
// deliveries, all under mu so that the order of sequence numbers is the
// order of acks and of deliveries.
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
	var conv, toKey, to, a, b string
	if f.To != "" {
		a, b = c.user, f.To
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
	if faults.Refuse > 0 && s.rand() < faults.Refuse {
		s.mu.Unlock()
		s.stats.refused.Add(1)
		s.enqueue(c, appendError(nil, f.ID, "overloaded", "send refused: the server is shedding load (Refuse fault)"))
		return
	}
	var g *group
	if f.Group != "" {
		g = s.groups[f.Group]
		if !g.has(c.user) {
			s.mu.Unlock()
			s.enqueue(c, appendError(nil, f.ID, "not_member", fmt.Sprintf("not a member of group %q", f.Group)))
			return
		}
	}
	cv := s.convs[conv]
	switch {
	case cv == nil && len(s.convs) >= maxConversations:
		s.mu.Unlock()
		s.enqueue(c, appendError(nil, f.ID, "limit", "too many conversations"))
		return
	case cv == nil:
		cv = &conversation{name: conv, a: a, b: b}
		s.convs[conv] = cv
		if g == nil {
			s.indexDirect(a, cv)
			if b != a {
				s.indexDirect(b, cv)
			}
		}
	case cv.a != a || cv.b != b:
		// "d:a:b:c" is both a:b with c and a with b:c. The first pair to
		// write owns it; the other would read and extend its history.
		s.mu.Unlock()
		s.enqueue(c, appendError(nil, f.ID, "conflict", fmt.Sprintf("conversation %q belongs to another pair of users", conv)))
		return
	}
	cv.seq++
	seq := cv.seq
	s.msgID++
	id := s.msgID
	// Counted before the ack goes out: a client that has its ack may read
	// the stats at once.
	s.stats.sent.Add(1)
	// If the ack overflows the sender's queue the sender is kicked, but
	// the message was accepted and is still delivered.
	s.enqueue(c, appendAck(make([]byte, 0, 64+len(f.ID)+len(conv)), f.ID, id, conv, seq))
	frame := appendMsg(make([]byte, 0, 96+len(c.user)+len(to)+len(conv)+len(body)), c.user, toKey, to, conv, id, seq, body)
	s.hist.add(cv, seq, frame)
	// The reorder fault swaps deliveries within one sender's messages to
	// one conversation: that is the order a client can check.
	p := push{stream: conv + "\x00" + c.user, frame: frame}
	if g == nil {
		s.deliver(f.To, p, faults, cv, seq)
	} else {
		// One frame for all recipients: fan-out costs a queue slot each,
		// not an encoding each.
		for _, m := range g.members {
			if m != c.user {
				s.deliver(m, p, faults, cv, seq)
			}
		}
	}
	// Self-sync: the sender's other sessions get what it sent. A message
	// to oneself already went to all of them above.
	if f.To != c.user && s.hasOther(c) {
		p.self, p.except = true, c
		s.deliver(c.user, p, faults, cv, seq)
	}
	// Names hidden by the drop fault count against the byte cap too.
	s.hist.trim()
	s.mu.Unlock()
}

// indexDirect lists cv among user's conversations for seqs, up to
// maxUserDirect. Called with mu held.
func (s *Server) indexDirect(user string, cv *conversation) {
	if l := s.userDirect[user]; len(l) < maxUserDirect {
		s.userDirect[user] = append(l, cv)
	}
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
// group as it is; a group's sequence and history survive a change of
// members.
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
		if old != nil {
			for m := range old.set {
				if _, still := set[m]; !still {
					gs := s.userGroups[m]
					delete(gs, f.Group)
					if len(gs) == 0 {
						delete(s.userGroups, m)
					}
				}
			}
		}
		for m := range set {
			gs := s.userGroups[m]
			if gs == nil {
				gs = make(map[string]struct{})
				s.userGroups[m] = gs
			}
			gs[f.Group] = struct{}{}
		}
	}
	s.mu.Unlock()
	s.enqueue(c, appendReply(nil, "ok", f.ID))
}

// member returns the conversation named conv if user may read it: a group
// conversation if user is a current member of the group, a direct one if
// user is one of its two users. The conversation is nil if it has no
// message yet.
// Called with mu held.
func (s *Server) member(user, conv string) (*conversation, bool) {
	cv := s.convs[conv]
	if name, ok := strings.CutPrefix(conv, "g:"); ok {
		return cv, s.groups[name].has(user)
	}
	if !strings.HasPrefix(conv, "d:") {
		return nil, false
	}
	if cv != nil {
		return cv, cv.a == user || cv.b == user
	}
	// Not written to yet: user must be able to write to it, as the first
	// or the second of a sorted pair.
	if other, ok := strings.CutPrefix(conv, "d:"+user+":"); ok && other >= user {
		return nil, true
	}
	if first, ok := strings.CutSuffix(conv[2:], ":"+user); ok && first <= user {
		return nil, true
	}
	return nil, false
}

// history answers a history request: the page of messages after f.After
// that the user may see, then the ok that ends it. Both are queued under
// mu, so a message of the conversation newer than the ok's "last" is
// pushed after the ok.
func (s *Server) history(c *conn, f *inFrame) {
	if f.Conv == "" {
		c.closeWith(websocket.ClosePolicyViolation, `history: missing "conv"`)
		return
	}
	limit := MaxHistoryPage
	if f.Limit != nil {
		if *f.Limit < 0 {
			c.closeWith(websocket.ClosePolicyViolation, fmt.Sprintf("history: limit %d is negative", *f.Limit))
			return
		}
		limit = min(*f.Limit, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cv, ok := s.member(c.user, f.Conv)
	if !ok {
		s.enqueue(c, appendError(nil, f.ID, "not_member", fmt.Sprintf("not a member of %q", f.Conv)))
		return
	}
	var last, first uint64 = 0, 1
	var frames [][]byte
	more := false
	if cv != nil {
		last, first = cv.seq, cv.firstKept()
		// The page is cut to the room left in the send queue, less one
		// for the ok, so that an answer never overflows it by itself:
		// only a reader that leaves it full is a slow consumer.
		room := max(c.room()-1, 0)
		frames, more = cv.page(c.user, f.After, min(limit, room))
	}
	for _, fr := range frames {
		if !s.enqueue(c, appendHistMsg(make([]byte, 0, len(fr)+len(f.ID)+8), f.ID, fr)) {
			return
		}
		s.stats.historyServed.Add(1)
	}
	s.enqueue(c, appendHistOK(nil, f.ID, f.Conv, last, first, more))
}

// seqs answers a seqs request with the newest seq of each of the user's
// conversations, sorted by name.
func (s *Server) seqs(c *conn, f *inFrame) {
	s.mu.Lock()
	direct, groups := s.userDirect[c.user], s.userGroups[c.user]
	convs := make([]convSeq, 0, len(direct)+len(groups))
	for _, cv := range direct {
		convs = append(convs, convSeq{cv.name, cv.seq})
	}
	for g := range groups {
		name := "g:" + g
		var seq uint64
		if cv := s.convs[name]; cv != nil {
			seq = cv.seq
		}
		convs = append(convs, convSeq{name, seq})
	}
	s.mu.Unlock()
	// Sorted so that a cut list is always the same one.
	slices.SortFunc(convs, func(x, y convSeq) int { return strings.Compare(x.conv, y.conv) })
	s.enqueue(c, appendSeqs(nil, f.ID, convs, maxSeqsBytes))
}

// enqueue hands b to c's writer without ever blocking. Replies other than
// acks are enqueued without mu: they all come from c's own reader, one at
// a time, so they keep their order anyway. A full queue means
// the peer reads slower than it is written to: it is disconnected rather
// than buffered for.
func (s *Server) enqueue(c *conn, b []byte) bool {
	if c.p != nil {
		if c.push(b) {
			return true
		}
	} else {
		select {
		case c.send <- b:
			return true
		default:
		}
	}
	if c.closeWith(CloseSlowConsumer, "slow consumer") {
		s.stats.slowConsumerKicks.Add(1)
	}
	return false
}

// push is one message on its way to a user's sessions: its frame, its
// stream for the reorder fault, and whether it is a self-sync delivery,
// which skips the sending session, except, and never goes to the offline
// queue.
type push struct {
	stream string
	frame  []byte
	self   bool
	except *conn
}

// deliver applies the faults to one delivery of p to user, that is to
// every session of user. cv and seq name the message in history, for
// the drop fault to hide it there. Called with mu held, which also
// serialises the calls to s.rand.
func (s *Server) deliver(user string, p push, f *Faults, cv *conversation, seq uint64) {
	if f.Drop > 0 && s.rand() < f.Drop {
		s.stats.dropped.Add(1)
		s.hist.hide(cv, seq, user)
		return
	}
	if f.DropPush > 0 && s.rand() < f.DropPush {
		s.stats.droppedPush.Add(1)
		return
	}
	copies := 1
	if f.Duplicate > 0 && s.rand() < f.Duplicate {
		copies = 2
		s.stats.duplicated.Add(1)
	}
	reorder := f.Reorder > 0 && s.rand() < f.Reorder
	d := f.Delay
	if f.Capacity > 0 {
		wait, ok := s.capacityWait(f.Capacity)
		if !ok {
			s.stats.capacityDropped.Add(1)
			s.hist.hide(cv, seq, user)
			return
		}
		if wait > 0 {
			s.stats.capacityQueued.Add(1)
			d += wait
		}
	}
	if f.Jitter > 0 {
		d += time.Duration(s.rand() * float64(f.Jitter))
	}
	// skip is where among the user's sessions the skipped one is, drawn
	// now so that both copies of a duplicate skip the same session; -1
	// skips none.
	skip := -1.0
	if f.SkipDevice > 0 && s.rand() < f.SkipDevice {
		skip = s.rand()
	}
	for range copies {
		if d > 0 && s.schedule(delayed{at: s.now() + int64(d), user: user, push: p, reorder: reorder, skip: skip}) {
			s.stats.delayed.Add(1)
			continue
		}
		s.toUser(user, p, reorder, skip)
	}
}

// capacityWait takes the next slot of the Capacity queue, drained at
// perSec deliveries a second: how long this delivery waits for it, or
// false when that is past capacityMaxWait and it is shed. Called with mu
// held.
func (s *Server) capacityWait(perSec int) (time.Duration, bool) {
	now := s.now()
	at := max(now, s.capNext)
	wait := time.Duration(at - now)
	if wait > capacityMaxWait {
		return 0, false
	}
	s.capNext = at + int64(time.Second)/int64(perSec)
	return wait, true
}

// isOpen reports whether session c may be handed deliveries: it is not
// closing. A closing session stays in Server.users until it is gone.
func isOpen(c *conn) bool { return !c.closing.Load() }

// hasOther reports whether c's user has an open session besides c.
// Called with mu held.
func (s *Server) hasOther(c *conn) bool {
	for _, o := range s.users[c.user] {
		if o != c && isOpen(o) {
			return true
		}
	}
	return false
}

// toUser hands p to every open session of user but p.except, less the
// one the skip-device fault picked (see deliver), or to the user's
// offline queue if none is open. A self-sync delivery never goes to the
// offline queue: the sender's next session finds it in
// history. A stalled user's sessions get nothing: the frame is discarded
// there, at the moment of delivery, after the other faults. Called with
// mu held.
func (s *Server) toUser(user string, p push, reorder bool, skip float64) {
	sessions := s.users[user]
	n := 0
	for _, c := range sessions {
		if c != p.except && isOpen(c) {
			n++
		}
	}
	if n == 0 {
		if !p.self {
			s.offer(user, p.frame)
		}
		return
	}
	if s.stalls(user) {
		s.stats.stalled.Add(uint64(n))
		return
	}
	skipped := -1
	if skip >= 0 && n >= 2 {
		skipped = min(int(skip*float64(n)), n-1)
		s.stats.skippedDevice.Add(1)
	}
	i := 0
	for _, c := range sessions {
		if c == p.except || !isOpen(c) {
			continue
		}
		if i != skipped {
			s.handoff(c, p, reorder)
		}
		i++
	}
}

// handoff queues p on c, or holds it back for the reorder fault: the
// held delivery goes out right after c's next one of the same stream (one
// sender in one conversation), or after reorderHold.
// Called with mu held.
func (s *Server) handoff(c *conn, p push, reorder bool) {
	if reorder && c.held == nil {
		c.heldGen++
		if s.schedule(delayed{at: s.now() + int64(reorderHold), held: c, gen: c.heldGen}) {
			c.held, c.heldStream, c.heldSelf, c.heldAt = p.frame, p.stream, p.self, s.logins
			s.stats.held.Add(1)
			return
		}
	}
	if !s.enqueue(c, p.frame) {
		// c was just kicked; the user's other sessions have their own
		// copy, or else the frame waits for the user's next login.
		s.missed(c.user, p.frame, p.self, s.logins)
		return
	}
	s.stats.deliveries.Add(1)
	if h := c.held; h != nil && c.heldStream == p.stream {
		c.held = nil
		if !s.enqueue(c, h) {
			s.missed(c.user, h, c.heldSelf, c.heldAt)
			return
		}
		s.stats.deliveries.Add(1)
		s.stats.reordered.Add(1)
	}
}

// releaseHeld sends c's held delivery on, on its reorderHold timeout or
// as c closes: to c while it is open, else as missed.
// Called with mu held.
func (s *Server) releaseHeld(c *conn) {
	h := c.held
	c.held = nil
	if isOpen(c) && slices.Contains(s.users[c.user], c) {
		if s.stalls(c.user) {
			s.stats.stalled.Add(1)
			return
		}
		s.handoff(c, push{stream: c.heldStream, frame: h, self: c.heldSelf}, false)
		return
	}
	s.missed(c.user, h, c.heldSelf, c.heldAt)
}

// missed reroutes a frame that one of user's sessions was to get but did
// not, because it closed: to the user's open sessions that logged in
// after login number since (the others were routed their own copy), or,
// if the user has no open session, to the offline queue, unless it is a
// self-sync frame. Called with mu held.
func (s *Server) missed(user string, frame []byte, self bool, since uint64) {
	online := false
	for _, c := range s.users[user] {
		if !isOpen(c) {
			continue
		}
		online = true
		if c.loginN <= since {
			continue
		}
		if s.stalls(user) {
			s.stats.stalled.Add(1)
			continue
		}
		s.handoff(c, push{frame: frame, self: self}, false)
	}
	if !online && !self {
		s.offer(user, frame)
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
	push    push
	reorder bool
	skip    float64
	held    *conn
	gen     uint64
}

// delayHeap is a min-heap by (at, n) (see minheap).
type delayHeap []delayed

func delayedLess(a, b delayed) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.n < b.n
}

func (h *delayHeap) push(d delayed) { *h = minheap.Push(*h, d, delayedLess) }

func (h *delayHeap) pop() (d delayed) {
	d, *h = minheap.Pop(*h, delayedLess)
	return d
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
			s.releaseHeld(c)
		}
		return
	}
	s.toUser(d.user, d.push, d.reorder, d.skip)
}
