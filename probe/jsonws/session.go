package jsonws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// session is one logged-in connection of one device, speaking through the
// driver's mapping.
type session struct {
	d    *Driver
	conn *wsconn.Conn
	user string
	dev  int
	env  *env
	// attrs are what this session's steps captured of its own user;
	// they take precedence over the directory's, which holds the last
	// session's of any device.
	attrs map[string]string
	h     probe.Handler
	// handle is s.handleMsg, made once: a method value made per frame
	// would allocate.
	handle func(*msg) error

	ids atomic.Uint64
	// pmu guards pending: the sends awaiting their ack, id to ref.
	pmu     sync.Mutex
	pending map[uint64]uint64
	// syncs are the newest-seq requests awaiting their reply (Sync), and
	// nsyncs their number, read without the lock on every frame.
	syncs  []*rule
	nsyncs atomic.Int32

	// Serve's own, reused for every frame.
	msg      *msg
	delivery probe.Delivery
	at       int64

	// cu is the device's place in its conversations, nil with catch-up
	// off; asked are the history requests in flight, due scratch.
	cu *probe.Catchup
	// convs are the names of the user's conversations, for catch-up:
	// the direct ones first, nDirect of them.
	convs   []string
	nDirect int
	// dueAt is when Frame next asks the Catchup what is due, while the
	// device lacks something.
	dueAt int64
	asked []fetch
	due   []probe.Fetch
	// lastSeq is the last server seq the session saw in each
	// conversation, for the server-side gap count; nil without
	// delivery.seq. Serve's.
	lastSeq map[string]uint64
	// holes are the spans of seqs below lastSeq not seen yet. Serve's.
	holes []hole
	// lacking is set when a frame showed the device lacks something, so
	// that what is due is asked once the frame is handled.
	lacking bool

	// early holds what arrived during the login that was no step's
	// reply, copies of the messages, for Serve to handle first.
	early     []early
	earlySize int
	// wbuf is the scratch of writes made on Serve's goroutine.
	wbuf []byte
}

// sendPool holds encoded frames between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// open dials and logs user in as device dev; with subscribe, it runs the
// subscribe steps of the user's conversations too, resuming each where
// the device's place in it, cu (nil for none), says.
func (d *Driver) open(ctx context.Context, user string, dev int, link probe.Link, subscribe bool, cu *probe.Catchup) (*session, error) {
	e, err := d.env(user, dev)
	if err != nil {
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	s := &session{d: d, user: user, dev: dev, env: e, attrs: map[string]string{}, msg: d.m.dec.newMsg(), cu: cu}
	s.handle = s.handleMsg
	e.attr = s.attr
	if cu != nil {
		e.convAttr = s.convAttr
	}
	_, err = wsconn.Open(ctx, d.conn, link, user, func(c *wsconn.Conn) error {
		s.conn = c
		// Login steps in order, each sent once the one before it
		// was answered: a step may need what the one before did.
		if err := s.runSteps(d.m.login, nil, 1, d.conn.DialTimeout); err != nil {
			return err
		}
		if !subscribe {
			return nil
		}
		var steps []*step
		var envs []*env
		if d.m.subDirect != nil {
			for _, p := range d.peers.Of(user) {
				pe := *s.env
				pe.peer = p
				if err := s.place(d.m.subDirect, d.m.directConv, &pe); err != nil {
					return fmt.Errorf("catch_up.direct_conv: %w", err)
				}
				steps, envs = append(steps, d.m.subDirect), append(envs, &pe)
			}
		}
		if d.m.subGroup != nil {
			for _, g := range d.groups.Of(user) {
				ge := *s.env
				ge.group = g
				if err := s.place(d.m.subGroup, d.m.groupConv, &ge); err != nil {
					return fmt.Errorf("catch_up.group_conv: %w", err)
				}
				steps, envs = append(steps, d.m.subGroup), append(envs, &ge)
			}
		}
		// The conversations' steps are independent: a window of them
		// in flight, as a client subscribing to its chats does.
		return s.runSteps(steps, envs, subscribeWindow, d.conn.DialTimeout)
	})
	if err != nil {
		return nil, err
	}
	if d.m.delivery.hasSeq {
		// Per session: a jump across a reconnect is what the device
		// missed while away, which catch-up fetches; a jump within a
		// session is a push the server skipped.
		s.lastSeq = map[string]uint64{}
	}
	return s, nil
}

// place names the conversation of the subscribe step st in e (.Conv),
// with conv, its catch_up name, and where the device has a place in it
// already sets e to resume there (.After).
func (s *session) place(st *step, conv *template, e *env) error {
	if conv == nil {
		return nil
	}
	b, err := conv.render(nil, e)
	if err != nil {
		return err
	}
	e.conv = string(b)
	if s.cu == nil || st.resume == nil {
		return nil
	}
	// Resumed only from a place the device had: Centrifugo recovers a
	// whole stream for a position it has never heard of.
	if seq, mark := s.cu.Position(e.conv); seq > 0 || mark != "" {
		e.resume, e.after = true, seq
	}
	return nil
}

// convAttr looks up what a subscribe step captured of conv: it is kept,
// URL-query encoded, as the mark of the device's place there, so that the
// device's next session resumes with it.
func (s *session) convAttr(conv, name string) (string, bool) {
	_, mark := s.cu.Position(conv)
	q, err := url.ParseQuery(mark)
	if err != nil || !q.Has(name) {
		return "", false
	}
	return q.Get(name), true
}

// attr looks up an attribute: this session's own captures first.
func (s *session) attr(group bool, who, name string) (string, bool) {
	if !group && who == s.user {
		if v, ok := s.attrs[name]; ok {
			return v, true
		}
	}
	return s.d.dir.attr(group, who, name)
}

func (s *session) newID() uint64 {
	for {
		if id := s.ids.Add(1); id != 0 {
			return id
		}
	}
}

// ignorable reports whether m is a frame the mapping says to ignore, or
// a step reply that came late.
func (s *session) ignorable(m *msg) bool {
	for _, r := range s.d.m.ignore {
		if r.match(m) {
			return true
		}
	}
	return false
}

// control handles Engine.IO's own packets and the mapping's keepalive
// answers; handled says m was one.
func (s *session) control(m *msg) (handled bool, err error) {
	dec := s.d.m.dec
	if dec.typeSlot >= 0 {
		switch string(m.vals[dec.typeSlot].b) {
		case "ping":
			// Engine.IO's heartbeat: the server closes a client that
			// does not answer within pingTimeout.
			return true, s.conn.Write([]byte("3"))
		case "pong", "noop", "other_namespace":
			return true, nil
		case "close", "disconnect":
			return true, &probe.Disconnect{Reason: metrics.ReasonServerClose, Err: fmt.Errorf("server sent Engine.IO %s", m.vals[dec.typeSlot].b)}
		}
	}
	if s.d.m.pong.match(m) {
		// Its arrival extended the idle deadline: nothing else to do.
		return true, nil
	}
	for _, a := range s.d.m.answers {
		if a.when.match(m) {
			b, err := a.send.render(s.wbuf[:0], s.env)
			if err != nil {
				return true, err
			}
			s.wbuf = b
			return true, s.conn.Write(b)
		}
	}
	return false, nil
}

// Send implements probe.Session.
func (s *session) Send(m *probe.Message) error {
	t := s.d.m.sendDirect
	if m.Group != "" {
		t = s.d.m.sendGroup
	}
	if t == nil {
		kind := "direct"
		if m.Group != "" {
			kind = "group"
		}
		return fmt.Errorf("the mapping has no send.%s template", kind)
	}
	id := s.newID()
	// Registered before the write: the ack can beat the write's return.
	s.pmu.Lock()
	if s.pending == nil {
		s.pending = make(map[uint64]uint64)
	}
	s.pending[id] = m.Ref
	s.pmu.Unlock()
	e := *s.env
	e.id, e.to, e.group, e.body = id, m.To, m.Group, m.Body
	bp := sendPool.Get().(*[]byte)
	b, err := t.render((*bp)[:0], &e)
	if err == nil {
		if s.d.opts.Trace != nil {
			s.trace("send", "send", string(b))
		}
		err = s.conn.Write(b)
	}
	*bp = b
	sendPool.Put(bp)
	if err != nil {
		s.pmu.Lock()
		delete(s.pending, id)
		s.pmu.Unlock()
	}
	return err
}

// Ping implements probe.Session with the mapping's keepalive.
func (s *session) Ping() error {
	switch {
	case s.d.m.pingWS:
		return s.conn.Ping()
	case s.d.m.ping != nil:
		// A request of its own: its {{.ID}} is a fresh one, which a
		// pong may echo.
		e := *s.env
		e.id = s.newID()
		b, err := s.d.m.ping.render(nil, &e)
		if err != nil {
			return err
		}
		return s.conn.Write(b)
	}
	return nil
}

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session.
func (s *session) Close() error { return s.conn.Close() }

// Serve implements probe.Session: what the login kept first, then what
// the connection reads.
func (s *session) Serve(h probe.Handler) error { return s.run(h).Serve() }

// Watch implements probe.Watcher: the session read by the Poller of its
// link, without a goroutine of its own.
func (s *session) Watch(h probe.Handler, done func(error)) bool { return s.run(h).Watch(done) }

// Hold implements probe.Holder: a watched slow reader's pause.
func (s *session) Hold(d time.Duration) bool { return s.conn.Hold(d) }

var (
	_ probe.Watcher = (*session)(nil)
	_ probe.Holder  = (*session)(nil)
)

func (s *session) run(h probe.Handler) wsconn.Session {
	return wsconn.Session{Conn: s.conn, Proto: s, Begin: func() error { return s.begin(h) }, Finish: s.finish}
}

// begin hands h the frames kept from the login, in order.
func (s *session) begin(h probe.Handler) error {
	s.h = h
	for i, e := range s.early {
		var err error
		if e.reply {
			err = s.listed(&e)
		} else {
			err = s.Frame(e.b, e.at)
		}
		if err != nil {
			s.early = nil
			err = s.conn.Failed(err)
			s.conn.Abort()
			return err
		}
		s.early[i] = early{}
	}
	s.early = nil
	return nil
}

// finish counts, at the session's end, what it never saw.
func (s *session) finish(err error) error {
	s.settleHoles(0)
	return err
}

// Frame implements wsconn.Protocol.
func (s *session) Frame(b []byte, at int64) error {
	s.at = at
	if s.d.opts.Trace != nil {
		s.trace("read", "", string(b))
	}
	if err := s.d.m.dec.each(b, s.msg, s.handle); err != nil {
		return err
	}
	return s.handled(at)
}

// dueEvery is how often a session that lacks something asks its Catchup
// what is due: a gap waits for its grace anyway.
const dueEvery = int64(50 * time.Millisecond)

// handled ends the handling of a frame read at at: holes open long enough
// are counted, and what the device lacks is fetched once due. A gap is
// due only after its grace, so that the device asks again on later
// frames, each dueEvery, until it lacks nothing.
func (s *session) handled(at int64) error {
	if len(s.holes) > 0 {
		s.settleHoles(at)
	}
	if s.lacking && s.d.m.fetch != nil && at >= s.dueAt {
		s.dueAt = at + dueEvery
		if err := s.fetchDue(at); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("history: %w", err)}
		}
		s.lacking = s.cu.Lacks()
	}
	return nil
}

// listed hands on what a subscribe step's reply said of its
// conversation: the deliveries it listed, fetched by the server's
// recovery, then the conversation's newest seq.
func (s *session) listed(e *early) error {
	s.at = e.at
	if e.list != nil {
		err := s.deliverList(e.list, e.b, []byte(e.conv), e.group, func(seq uint64) {
			// Recovered in order, from where the device was: a jump
			// in them is one the server's own numbering shows.
			s.sawSeq([]byte(e.conv), seq)
		})
		if err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("deliveries of %s: %w", e.conv, err)}
		}
	}
	if e.hasNewest && s.cu != nil {
		s.cu.Behind(e.conv, e.newest, e.at)
		s.lacking = true
	}
	return s.handled(e.at)
}

// deliverList delivers the messages of the array arr of conv, each read
// with ld, as fetched by catch-up, and calls got with each one's seq.
func (s *session) deliverList(ld *listDec, arr, conv []byte, group bool, got func(seq uint64)) error {
	return ld.dec.eachElem(arr, ld.dec.newMsg(), func(em *msg) {
		d := &s.delivery
		*d = probe.Delivery{At: s.at, Body: em.vals[elemBody].b, Group: group, Recovered: true}
		if ld.from >= 0 {
			d.From = em.vals[ld.from].b
		}
		if seq, ok := em.vals[elemSeq].uint(); ok && seq != 0 {
			d.ServerSeq = seq
			got(seq)
			if s.cu != nil && s.cu.Got(conv, seq, s.at) {
				s.lacking = true
			}
		}
		if s.tracing() {
			s.trace("match", "deliveries", "listed in a reply")
		}
		s.h.OnDelivery(d)
	})
}

// Ended implements wsconn.Protocol: the mapping's close codes.
func (s *session) Ended(err error) *probe.Disconnect {
	return wsconn.Ended(err, func(code int, text string) *probe.Disconnect {
		if r, ok := s.d.m.closeCodes[code]; ok {
			if r == metrics.ConnectUnauthorized {
				// Credentials withdrawn from a running session: the
				// server ended it, and the next login says why.
				r = metrics.ReasonServerClose
			}
			return &probe.Disconnect{Reason: r, Code: code, Text: text}
		}
		return nil
	})
}

// handleMsg handles one message of a running session.
func (s *session) handleMsg(m *msg) error {
	mp := s.d.m
	for i := range mp.errFrames {
		ef := &mp.errFrames[i]
		if ef.match.match(m) {
			text := ""
			if ef.text >= 0 {
				text = string(m.vals[ef.text].b)
			}
			if s.tracing() {
				s.trace("match", ef.match.key, ef.match.String())
			}
			return &probe.Disconnect{Reason: ef.reason, Text: text}
		}
	}
	if handled, err := s.control(m); handled || err != nil {
		if err != nil {
			if _, ok := errors.AsType[*probe.Disconnect](err); !ok {
				err = &probe.Disconnect{Reason: metrics.ReasonError, Err: err}
			}
		}
		return err
	}
	if mp.ack.match.match(m) {
		if id, ok := corrID(m.vals[mp.ack.id]); ok {
			s.pmu.Lock()
			ref, isAck := s.pending[id]
			if isAck {
				delete(s.pending, id)
			}
			s.pmu.Unlock()
			if isAck {
				s.onAck(ref, m)
				return nil
			}
		}
	}
	if mp.done.match != nil && mp.done.match.match(m) {
		if id, ok := corrID(m.vals[mp.done.id]); ok {
			if i := s.findAsked(id); i >= 0 {
				if s.tracing() {
					s.trace("match", mp.done.match.key, mp.done.match.String())
				}
				return s.answeredFetch(i, m)
			}
		}
	}
	if s.nsyncs.Load() > 0 && s.synced(m) {
		return nil
	}
	if mp.delivery.match.match(m) {
		s.deliver(m)
		return nil
	}
	if s.ignorable(m) {
		return nil
	}
	s.d.unmatched.Add(1)
	s.trace("match", "", "no rule matched: counted unmatched")
	if s.d.log.Enabled(context.Background(), slog.LevelDebug) && s.d.sample.Allow() {
		sample := m.raw
		if len(sample) > 256 {
			sample = sample[:256]
		}
		s.d.log.Debug("frame matched no rule of the mapping", "user", s.user, "frame", string(sample))
	}
	return nil
}

// corrID reads a correlation id: the digits of a number or a string,
// after any other prefix ("h12" is 12).
func corrID(v value) (uint64, bool) {
	if !v.present() {
		return 0, false
	}
	b := v.b
	i := len(b)
	for i > 0 && b[i-1] >= '0' && b[i-1] <= '9' {
		i--
	}
	if i == len(b) || len(b)-i > 20 {
		return 0, false
	}
	return value{b: b[i:], kind: kindNumber}.uint()
}

// onAck reports an ack or rejection of the send ref.
func (s *session) onAck(ref uint64, m *msg) {
	mp := s.d.m
	if s.tracing() {
		s.trace("match", mp.ack.match.key, mp.ack.match.String())
	}
	if mp.ack.success != nil && !mp.ack.success.match(m) {
		code := "rejected"
		if mp.ack.code >= 0 && m.vals[mp.ack.code].present() {
			code = string(m.vals[mp.ack.code].b)
		}
		s.h.OnReject(ref, code)
		return
	}
	var a probe.Ack
	if mp.ack.serverID >= 0 {
		a.ServerID = m.vals[mp.ack.serverID].b
	}
	if mp.ack.seq >= 0 {
		a.Seq, _ = m.vals[mp.ack.seq].uint()
	}
	s.h.OnAck(ref, a)
	if a.Seq != 0 && mp.ack.cv >= 0 {
		conv := m.vals[mp.ack.cv].b
		// The sender's own message takes a seq of its conversation,
		// which no push brings back to the sending session.
		s.sawSeq(conv, a.Seq)
		if s.cu != nil && s.cu.Got(conv, a.Seq, s.at) {
			s.lacking = true
		}
	}
}

// deliver reports a delivery.
func (s *session) deliver(m *msg) {
	mp := s.d.m
	d := &s.delivery
	*d = probe.Delivery{At: s.at}
	d.Body = m.vals[mp.delivery.body].b
	if mp.delivery.hasFrom {
		d.From = m.vals[mp.delivery.from].b
	}
	if mp.delivery.group != nil {
		d.Group = mp.delivery.group.match(m)
	}
	if s.tracing() {
		s.trace("match", mp.delivery.match.key, mp.delivery.match.String())
	}
	if !mp.delivery.hasSeq {
		s.h.OnDelivery(d)
		return
	}
	seq, ok := m.vals[mp.delivery.seq].uint()
	conv := m.vals[mp.delivery.conv].b
	if !ok || seq == 0 {
		s.h.OnDelivery(d)
		return
	}
	d.ServerSeq = seq
	if i := s.fetchOf(conv, seq); i >= 0 {
		d.Recovered = true
		s.asked[i].got = max(s.asked[i].got, seq)
	} else {
		s.sawSeq(conv, seq)
	}
	if s.cu != nil && s.cu.Got(conv, seq, s.at) {
		// Asked at the end of the frame (Frame), once.
		s.lacking = true
	}
	s.h.OnDelivery(d)
}
