package engine

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
)

// memServer is an IM server in memory, for the engine's tests under
// testing/synctest: no socket, no encoding, and every time is the bubble's,
// so that a fault of a known size is counted exactly. A message gets the
// next seq of its conversation and is acked to its sender; each delivery
// goes to every session of each recipient (the sender excluded), through
// the faults the test sets. Faults are decided per delivery by the test's
// functions, in the order deliveries are made.
type memServer struct {
	mu     sync.Mutex
	groups map[string][]string
	seqs   map[string]uint64
	online map[string][]*memSession
	// stored holds messages to users with no session, delivered at their
	// next login, as an IM server keeps what a user who is away is sent:
	// the engine owes every member of a group each of its messages.
	stored map[string][]memEvent
	// faults, if set, says what happens to one delivery.
	faults func(d memDelivery) memFault
	// made counts what the faults did.
	made memCounts
	// overflow counts events a full session queue refused: a test whose
	// traffic is sized right sees none.
	overflow atomic.Int64
	// down refuses connects, as a server that is not listening does.
	down bool
	// discarded counts deliveries a killed server never made: queued for
	// a session it ended, or due to one after it ended.
	discarded atomic.Int64
	// stall, while set, holds every Send until it is closed, as a write
	// to a server that has stopped reading does; stalled counts the sends
	// it has held, and routed every send that reached the server.
	stall   atomic.Pointer[chan struct{}]
	stalled atomic.Int64
	routed  atomic.Int64
}

// memDelivery is one delivery the server is about to make.
type memDelivery struct {
	to, from, conv string
	seq            uint64
}

// memFault is what happens to one delivery: dropped, sent twice, held
// until the next delivery from the same sender in the same conversation to
// the same session has gone (reordered, as the ledger sees a stream), or
// delayed.
type memFault struct {
	drop, dup, hold bool
	delay           time.Duration
}

type memCounts struct {
	deliveries, dropped, duplicated, held, delayed int
}

func newMemServer() *memServer {
	return &memServer{groups: map[string][]string{}, seqs: map[string]uint64{}, online: map[string][]*memSession{}, stored: map[string][]memEvent{}}
}

func (s *memServer) counts() memCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.made
}

func (s *memServer) setFaults(f func(memDelivery) memFault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// Provision implements probe.Driver.
func (s *memServer) Provision(_ context.Context, plan probe.Plan) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range plan.Groups {
		s.groups[g.Name] = g.Members
	}
	return nil
}

var errMemDown = errors.New("memserver: connection refused")

// Connect implements probe.Driver.
func (s *memServer) Connect(_ context.Context, user string, _ probe.Device) (probe.Session, error) {
	ss := &memSession{srv: s, user: user, in: make(chan memEvent, 4096), done: make(chan struct{}), gone: make(chan struct{})}
	s.mu.Lock()
	if s.down {
		s.mu.Unlock()
		return nil, errMemDown
	}
	s.online[user] = append(s.online[user], ss)
	for _, ev := range s.stored[user] {
		ss.put(ev)
	}
	delete(s.stored, user)
	s.mu.Unlock()
	// The login's answer takes a while to come back, as over a network:
	// the client learns it is online after the server routes to it, so
	// that a message it is owed (sent after it learnt) always reaches it.
	// Without this the bubble's clock, which does not move, would make
	// the two the same instant, in either order.
	time.Sleep(time.Millisecond)
	return ss, nil
}

// kill ends every session, as a server that dies does, and refuses
// connects until revive: what it had queued for a session, or had yet to
// deliver, is discarded and counted.
func (s *memServer) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = true
	for u, list := range s.online {
		for _, ss := range list {
			ss.dead.Store(true)
			for len(ss.in) > 0 {
				if ev := <-ss.in; !ev.ack {
					s.discarded.Add(1)
				}
			}
			s.discarded.Add(int64(len(ss.held)))
			ss.held = nil
			close(ss.gone)
		}
		delete(s.online, u)
	}
}

// revive takes connects again.
func (s *memServer) revive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = false
}

// memEvent is what a session reads: an ack of its own send, or a delivery.
type memEvent struct {
	ack   bool
	ref   uint64
	from  string
	group bool
	body  []byte
	seq   uint64
}

type memSession struct {
	srv  *memServer
	user string
	in   chan memEvent
	done chan struct{}
	once sync.Once
	// gone is closed, and dead set, when the server kills the session.
	gone chan struct{}
	dead atomic.Bool
	// held is a delivery the reorder fault holds, per conversation and
	// sender.
	held map[string]memEvent
}

var errMemFull = errors.New("memserver: session queue full")

// Serve implements probe.Session.
func (ss *memSession) Serve(h probe.Handler) error {
	defer ss.srv.leave(ss)
	for {
		select {
		case <-ss.done:
			return &probe.Disconnect{Reason: metrics.ReasonShutdown}
		case <-ss.gone:
			return &probe.Disconnect{Reason: metrics.ReasonServerClose}
		case ev := <-ss.in:
			if ss.dead.Load() {
				// Taken as the server died: it never reached us.
				if !ev.ack {
					ss.srv.discarded.Add(1)
				}
				continue
			}
			if ev.ack {
				h.OnAck(ev.ref, probe.Ack{Seq: ev.seq})
				continue
			}
			h.OnDelivery(&probe.Delivery{From: []byte(ev.from), Group: ev.group, Body: ev.body, ServerSeq: ev.seq, At: time.Now().UnixNano()})
		}
	}
}

// Send implements probe.Session: the server routes m at once.
func (ss *memSession) Send(m *probe.Message) error {
	if c := ss.srv.stall.Load(); c != nil {
		ss.srv.stalled.Add(1)
		<-*c
	}
	ss.srv.routed.Add(1)
	return ss.srv.route(ss, m)
}

// Ping implements probe.Session.
func (ss *memSession) Ping() error { return nil }

// Close implements probe.Session.
func (ss *memSession) Close() error {
	ss.once.Do(func() { close(ss.done) })
	return nil
}

func (s *memServer) leave(ss *memSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.online[ss.user]
	for i, o := range list {
		if o == ss {
			s.online[ss.user] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
}

func (s *memServer) route(from *memSession, m *probe.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from.dead.Load() {
		return &probe.Disconnect{Reason: metrics.ReasonServerClose}
	}
	conv, to := "d:"+m.To, []string{m.To}
	if m.Group != "" {
		conv, to = "g:"+m.Group, s.groups[m.Group]
	} else {
		// One conversation per pair, either way round.
		a, b := from.user, m.To
		if b < a {
			a, b = b, a
		}
		conv = "d:" + a + "," + b
	}
	s.seqs[conv]++
	seq := s.seqs[conv]
	body := bytes.Clone(m.Body)
	if !from.put(memEvent{ack: true, ref: m.Ref, seq: seq}) {
		return errMemFull
	}
	for _, u := range to {
		if u == from.user {
			continue
		}
		if len(s.online[u]) == 0 {
			s.stored[u] = append(s.stored[u], memEvent{from: from.user, group: m.Group != "", body: body, seq: seq})
			continue
		}
		for _, ss := range s.online[u] {
			s.deliver(ss, memEvent{from: from.user, group: m.Group != "", body: body, seq: seq}, memDelivery{to: u, from: from.user, conv: conv, seq: seq})
		}
	}
	return nil
}

// deliver makes one delivery to ss through the faults; s.mu is held.
func (s *memServer) deliver(ss *memSession, ev memEvent, d memDelivery) {
	s.made.deliveries++
	key := d.conv + " " + d.from
	var f memFault
	if s.faults != nil {
		f = s.faults(d)
	}
	switch {
	case f.drop:
		s.made.dropped++
		return
	case f.delay > 0:
		s.made.delayed++
		time.AfterFunc(f.delay, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			ss.put(ev)
		})
		return
	case f.hold && ss.held[key].body == nil:
		s.made.held++
		if ss.held == nil {
			ss.held = map[string]memEvent{}
		}
		ss.held[key] = ev
		return
	}
	ss.put(ev)
	if f.dup {
		s.made.duplicated++
		ss.put(ev)
	}
	if h, ok := ss.held[key]; ok {
		delete(ss.held, key)
		ss.put(h)
	}
}

// put queues ev for the session's reader, or reports that its queue is
// full: the tests size their traffic far under it. A session the server
// killed gets nothing: the delivery is counted discarded. s.mu is held.
func (ss *memSession) put(ev memEvent) bool {
	if ss.dead.Load() {
		if !ev.ack {
			ss.srv.discarded.Add(1)
		}
		return true
	}
	select {
	case ss.in <- ev:
		return true
	default:
		ss.srv.overflow.Add(1)
		return false
	}
}
