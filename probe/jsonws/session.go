package jsonws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/jsonscan"
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
	// convs are the names of the user's conversations, for catch-up.
	convs []string
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

// fetch is one history request in flight.
type fetch struct {
	id    uint64
	conv  string
	after uint64
	n     int
	got   uint64
}

// subscribeWindow is how many subscribe steps a session has in flight.
const subscribeWindow = 16

// maxAsked bounds the history requests a session has in flight.
const maxAsked = 16

// maxEarlyFactor bounds what the login keeps for Serve, in frames' worth.
const maxEarlyFactor = 4

// sendPool holds encoded frames between uses.
var sendPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// open dials and logs user in as device dev; with subscribe, it runs the
// subscribe steps of the user's conversations too.
func (d *Driver) open(ctx context.Context, user string, dev int, link probe.Link, subscribe bool) (*session, error) {
	e, err := d.env(user, dev)
	if err != nil {
		return nil, fmt.Errorf("login %s: %w", user, err)
	}
	s := &session{d: d, user: user, dev: dev, env: e, attrs: map[string]string{}, msg: d.m.dec.newMsg()}
	s.handle = s.handleMsg
	e.attr = s.attr
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
				steps, envs = append(steps, d.m.subDirect), append(envs, &pe)
			}
		}
		if d.m.subGroup != nil {
			for _, g := range d.groups.Of(user) {
				ge := *s.env
				ge.group = g
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

// tracing reports whether a trace is on: steady-state paths check it
// before they build what they would trace.
func (s *session) tracing() bool { return s.d.opts.Trace != nil }

func (s *session) trace(what, key, detail string) {
	if t := s.d.opts.Trace; t != nil {
		t(Event{User: s.user, What: what, Key: key, Detail: s.redact(detail)})
	}
}

// redact removes the session's secrets from what a trace shows: its token
// and password, and what its steps captured under a name that says secret
// (a session token a server hands back).
func (s *session) redact(detail string) string {
	for _, sec := range []string{s.env.token, s.env.password} {
		if len(sec) >= 4 {
			detail = strings.ReplaceAll(detail, sec, "[redacted]")
		}
	}
	for name, v := range s.attrs {
		if len(v) >= 4 && secretName(name) {
			detail = strings.ReplaceAll(detail, v, "[redacted]")
		}
	}
	// A server that hands back a session token of its own (Tinode's
	// login reply) names it so.
	return secretField.ReplaceAllString(detail, `$1"[redacted]"`)
}

// secretField is a JSON string field whose name says it holds a secret.
var secretField = regexp.MustCompile(`("[^"]*(?i:token|secret|password)[^"]*"\s*:\s*)"(?:[^"\\]|\\.)*"`)

// secretName reports whether a capture's name says it holds a secret.
func secretName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"token", "secret", "password", "key", "auth"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// redacted renders t for a trace, with the secrets left out.
func (s *session) redacted(t *template, e *env) string {
	re := *e
	re.token, re.password = "[token]", "[password]"
	for i := range t.parts {
		if a := t.parts[i].act; a != nil && a.fn == "base64" {
			// What is encoded holds a password as often as not.
			b, _ := t.redactedBase64(&re)
			return string(b)
		}
	}
	b, _ := t.render(nil, &re)
	return string(b)
}

// redactedBase64 renders t with every base64 action shown as [base64].
func (t *template) redactedBase64(e *env) ([]byte, error) {
	var b []byte
	for i := range t.parts {
		p := &t.parts[i]
		switch {
		case p.act == nil:
			b = append(b, p.lit...)
		case p.act.fn == "base64":
			if !p.act.inString {
				b = append(b, '"')
			}
			b = append(b, "[base64]"...)
			if !p.act.inString {
				b = append(b, '"')
			}
		default:
			var err error
			if b, err = p.act.render(b, e); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

// waiting is a step sent and not yet answered, its rules bound to the
// request.
type waiting struct {
	st                           *step
	e                            *env
	reply, success, when, unauth *rule
	done                         bool
}

// runSteps runs steps, each with its env (nil: the session's), window at
// a time, each sent only once the server answered enough of those before
// it, and returns once all are answered, or the first failure. A step's
// otherwise steps run, in order, in its place when it is refused with its
// otherwise.when.
func (s *session) runSteps(steps []*step, envs []*env, window int, timeout time.Duration) error {
	end := time.Now().Add(timeout)
	var open []waiting
	next := 0
	for next < len(steps) || len(open) > 0 {
		for next < len(steps) && len(open) < window {
			e := s.env
			if envs != nil {
				e = envs[next]
			}
			w, err := s.start(steps[next], e)
			if err != nil {
				return err
			}
			open = append(open, w)
			next++
		}
		bp, at, err := s.conn.Read(time.Until(end))
		if err != nil {
			if ce, ok := errors.AsType[*websocket.CloseError](err); ok {
				if r, isCode := s.d.m.closeCodes[ce.Code]; isCode {
					return fmt.Errorf("server closed the connection during %s: %s %d %q", open[0].st.key, r, ce.Code, ce.Text)
				}
				return fmt.Errorf("server closed the connection during %s: %d %q", open[0].st.key, ce.Code, ce.Text)
			}
			return fmt.Errorf("waiting for the reply to %s: %w", open[0].st.key, err)
		}
		s.at = at
		raw := bytes.Clone(*bp)
		wsconn.Release(bp)
		if s.tracing() {
			// Traced before its captures are known: a secret the
			// frame hands back is redacted by the server's word for
			// it only once captured, so the frame is shown redacted
			// of what the mapping will capture from it.
			s.trace("read", "", s.redactCaptures(raw, open))
		}
		var failed error
		var retry []waiting
		err = s.d.m.dec.each(bytes.Clone(raw), s.msg, func(m *msg) error {
			for i := range open {
				w := &open[i]
				if w.done || !w.reply.match(m) {
					continue
				}
				if s.tracing() {
					s.trace("match", w.st.key+".reply", w.reply.String())
				}
				if err := s.answered(w, m); err != nil {
					if errors.Is(err, errOtherwise) {
						retry = append(retry, *w)
					} else {
						failed = err
					}
				}
				w.done = true
				return nil
			}
			return s.loginFrame(m, raw)
		})
		if err != nil {
			return fmt.Errorf("during %s: %w", open[0].st.keyOr(), err)
		}
		if failed != nil {
			return failed
		}
		for _, w := range retry {
			// The otherwise steps, in order, each waiting for the one
			// before it.
			if err := s.runSteps(w.st.otherwise, repeat(w.e, len(w.st.otherwise)), 1, time.Until(end)); err != nil {
				return err
			}
		}
		kept := open[:0]
		for _, w := range open {
			if !w.done {
				kept = append(kept, w)
			}
		}
		open = kept
	}
	return nil
}

func repeat(e *env, n int) []*env {
	out := make([]*env, n)
	for i := range out {
		out[i] = e
	}
	return out
}

func (st *step) keyOr() string {
	if st == nil {
		return "login"
	}
	return st.key
}

// errOtherwise says a step was refused as its otherwise.when expects.
var errOtherwise = errors.New("otherwise")

// start sends st (if it sends anything) and returns what it waits for.
func (s *session) start(st *step, e *env) (waiting, error) {
	ec := *e
	ec.id = s.newID()
	reply, err := st.reply.bind(&ec)
	if err != nil {
		return waiting{}, err
	}
	w := waiting{st: st, e: &ec, reply: reply}
	for _, b := range []struct {
		dst **rule
		r   *rule
	}{{&w.success, st.success}, {&w.when, st.when}, {&w.unauth, st.unauthorized}} {
		if *b.dst, err = b.r.bind(&ec); err != nil {
			return waiting{}, err
		}
	}
	if st.send == nil {
		return w, nil
	}
	b, err := st.send.render(nil, &ec)
	if err != nil {
		return waiting{}, fmt.Errorf("%s.send: %w", st.key, err)
	}
	s.trace("send", st.key+".send", s.redacted(st.send, &ec))
	if err := s.conn.Write(b); err != nil {
		return waiting{}, fmt.Errorf("%s: %w", st.key, err)
	}
	return w, nil
}

// answered handles the reply m to w: success and its captures, or a
// refusal with the server's reason.
func (s *session) answered(w *waiting, m *msg) error {
	st := w.st
	if w.success != nil && !w.success.match(m) {
		if w.when != nil && w.when.match(m) {
			s.trace("match", st.key+".otherwise.when", w.when.String())
			return errOtherwise
		}
		reason := "the reply did not match " + st.key + ".success (" + w.success.String() + ")"
		if st.reason >= 0 && m.vals[st.reason].present() {
			reason = string(m.vals[st.reason].b)
		}
		err := fmt.Errorf("%s refused: %s", stepName(st), reason)
		s.trace("error", st.key, err.Error())
		if w.unauth != nil && w.unauth.match(m) {
			return probe.Unauthorized(err)
		}
		return err
	}
	for _, c := range st.captures {
		v := m.vals[c.slot]
		if !v.present() {
			return fmt.Errorf("%s: the reply has nothing at %s to capture as %s", stepName(st), s.d.m.dec.paths[c.slot], c.name)
		}
		val := string(v.b)
		if w.e.capGroup != "" {
			s.d.dir.set(true, w.e.capGroup, c.name, val)
		} else {
			s.attrs[c.name] = val
			s.d.dir.set(false, s.user, c.name, val)
		}
		s.trace("step", st.key+".capture."+c.name, "captured")
	}
	s.trace("step", st.key, "ok")
	return nil
}

func stepName(st *step) string {
	if st.name != "" {
		return st.key + " (" + st.name + ")"
	}
	return st.key
}

// loginFrame handles a message read during the login that answers no
// step: a disconnect frame fails the login, a keepalive is answered, and
// anything else is kept for Serve.
func (s *session) loginFrame(m *msg, raw []byte) error {
	for _, ef := range s.d.m.errFrames {
		if ef.match.match(m) {
			text := ""
			if ef.text >= 0 {
				text = string(m.vals[ef.text].b)
			}
			return fmt.Errorf("server ended the session: %s %s", ef.reason, text)
		}
	}
	if handled, err := s.control(m); handled || err != nil {
		return err
	}
	if s.ignorable(m) {
		return nil
	}
	// Serve handles it again from a copy, with a handler.
	if s.earlySize += len(raw); s.earlySize > maxEarlyFactor*int(s.d.m.maxFrame) {
		return fmt.Errorf("too much traffic during login: over %d bytes before the session was ready", maxEarlyFactor*s.d.m.maxFrame)
	}
	s.early = append(s.early, early{b: m.copyFrom(raw), at: s.at})
	return nil
}

// early is a message kept from the login for Serve: a copy of its bytes,
// and when they came off the socket (Delivery.At).
type early struct {
	b  []byte
	at int64
}

// copyFrom returns a copy of the bytes of raw that m came from: the whole
// frame, or with line framing, m's own line.
func (m *msg) copyFrom(raw []byte) []byte {
	return bytes.Clone(raw[m.start:m.end])
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
		b, err := s.d.m.ping.render(nil, s.env)
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
func (s *session) Serve(h probe.Handler) error {
	s.h = h
	for i, e := range s.early {
		if err := s.Frame(e.b, e.at); err != nil {
			s.early = nil
			err = s.conn.Failed(err)
			s.conn.Abort()
			return err
		}
		s.early[i] = early{}
	}
	s.early = nil
	err := s.conn.Serve(s)
	// What the session never saw by its end counts now.
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
	if len(s.holes) > 0 {
		s.settleHoles(at)
	}
	if s.lacking && s.d.m.fetch != nil {
		s.lacking = false
		if err := s.fetchDue(at); err != nil {
			return &probe.Disconnect{Reason: metrics.ReasonError, Err: fmt.Errorf("history: %w", err)}
		}
	}
	return nil
}

// Ended implements wsconn.Protocol: the mapping's close codes.
func (s *session) Ended(err error) *probe.Disconnect {
	return wsconn.Ended(err, func(code int, text string) *probe.Disconnect {
		if r, ok := s.d.m.closeCodes[code]; ok {
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

// hole is a span of a conversation's server seqs a session has not seen
// though it saw one after them, since when.
type hole struct {
	conv   string
	lo, hi uint64
	since  int64
}

// Holes are counted as the server's gaps only once they stayed open for
// holeGrace: an ack of the session's own message may come after a later
// delivery of the same conversation, and a reordered push after the next
// one. maxHoles bounds what a session tracks; past it a hole counts at
// once.
const (
	holeGrace = int64(time.Second)
	maxHoles  = 64
)

// fillHole removes seq of conv from the session's holes.
func (s *session) fillHole(conv []byte, seq uint64) {
	for i := 0; i < len(s.holes); i++ {
		h := &s.holes[i]
		if h.conv != string(conv) || seq < h.lo || seq > h.hi {
			continue
		}
		switch {
		case h.lo == h.hi:
			s.holes = append(s.holes[:i], s.holes[i+1:]...)
		case seq == h.lo:
			h.lo++
		case seq == h.hi:
			h.hi--
		case len(s.holes) < maxHoles:
			up := *h
			up.lo, h.hi = seq+1, seq-1
			s.holes = append(s.holes, up)
		default:
			// No room to split: the seq found stays counted.
		}
		return
	}
}

// settleHoles counts the holes open for holeGrace at now (all of them,
// with now 0) as gaps in the server's numbering.
func (s *session) settleHoles(now int64) {
	n := 0
	for _, h := range s.holes {
		if now != 0 && now-h.since < holeGrace {
			s.holes[n] = h
			n++
			continue
		}
		s.d.gaps.Add(1)
		s.d.missed.Add(h.hi - h.lo + 1)
	}
	s.holes = s.holes[:n]
}

// sawSeq checks seq of conv against the last the session saw: a jump is
// a gap in the server's own numbering.
func (s *session) sawSeq(conv []byte, seq uint64) {
	if s.lastSeq == nil {
		return
	}
	last, known := s.lastSeq[string(conv)]
	switch {
	case !known && len(s.lastSeq) < maxSeqConvs:
		s.lastSeq[string(conv)] = seq
	case known && seq > last:
		if seq > last+1 {
			if len(s.holes) < maxHoles {
				s.holes = append(s.holes, hole{conv: string(conv), lo: last + 1, hi: seq - 1, since: s.at})
			} else {
				s.d.gaps.Add(1)
				s.d.missed.Add(seq - last - 1)
			}
		}
		s.lastSeq[string(conv)] = seq
	case known && len(s.holes) > 0:
		s.fillHole(conv, seq)
	}
}

// fetchOf returns the history request in flight whose range holds seq of
// conv, or -1.
func (s *session) fetchOf(conv []byte, seq uint64) int {
	for i := range s.asked {
		f := &s.asked[i]
		if f.conv == string(conv) && seq > f.after && seq <= f.after+uint64(f.n) {
			return i
		}
	}
	return -1
}

func (s *session) findAsked(id uint64) int {
	for i, f := range s.asked {
		if f.id == id {
			return i
		}
	}
	return -1
}

// fetchDue asks for every gap of the device that is due, within maxAsked.
func (s *session) fetchDue(now int64) error {
	if len(s.asked) >= maxAsked {
		return nil
	}
	s.due = s.cu.Due(now, s.due[:0], maxAsked-len(s.asked))
	for _, f := range s.due {
		f.N = min(f.N, s.d.m.limit)
		if err := s.ask(f); err != nil {
			return err
		}
	}
	return nil
}

// ask writes one history request.
func (s *session) ask(f probe.Fetch) error {
	e := *s.env
	e.id, e.conv, e.after, e.limit = s.newID(), f.Conv, f.After, uint64(f.N)
	b, err := s.d.m.fetch.render(s.wbuf[:0], &e)
	if err != nil {
		return err
	}
	s.wbuf = b
	s.asked = append(s.asked, fetch{id: e.id, conv: f.Conv, after: f.After, n: f.N})
	if s.tracing() {
		s.trace("send", "catch_up.fetch", string(b))
	}
	return s.conn.Write(b)
}

// answeredFetch closes the history request at i: the server sent what it
// holds in the range. A full page means there may be more: the rest of
// the range is asked at once.
func (s *session) answeredFetch(i int, m *msg) error {
	f := s.asked[i]
	s.asked = append(s.asked[:i], s.asked[i+1:]...)
	if f.got >= f.after+uint64(f.n) {
		s.cu.Answered(f.conv, f.after, f.got)
		return nil
	}
	upTo := f.after + uint64(f.n)
	if s.d.m.done.last >= 0 {
		if last, ok := m.vals[s.d.m.done.last].uint(); ok && last > f.got && last < upTo {
			// The server holds up to last: what it did not send of
			// (after, last] it does not have for this device.
			upTo = last
		}
	}
	s.cu.Answered(f.conv, f.after, max(upTo, f.got))
	return nil
}

// maxSyncs bounds the newest-seq requests a session keeps waiting for: a
// server that never answers them must not grow the list.
const maxSyncs = 4

// Sync implements probe.Syncer: it asks the server for the newest seq of
// each of the user's conversations (catch_up.newest), and the answer
// opens a gap wherever the device is behind.
func (s *session) Sync() error {
	nw := s.d.m.newest
	if s.cu == nil || nw.send == nil {
		return nil
	}
	e := *s.env
	e.id = s.newID()
	reply, err := nw.reply.bind(&e)
	if err != nil {
		return err
	}
	b, err := nw.send.render(nil, &e)
	if err != nil {
		return fmt.Errorf("catch_up.newest.send: %w", err)
	}
	s.pmu.Lock()
	if len(s.syncs) == maxSyncs {
		s.syncs = s.syncs[1:]
	}
	s.syncs = append(s.syncs, reply)
	s.nsyncs.Store(int32(len(s.syncs)))
	s.pmu.Unlock()
	if s.tracing() {
		s.trace("send", "catch_up.newest.send", string(b))
	}
	return s.conn.Write(b)
}

// synced handles m if it answers a newest-seq request.
func (s *session) synced(m *msg) bool {
	s.pmu.Lock()
	i := slices.IndexFunc(s.syncs, func(r *rule) bool { return r.match(m) })
	if i >= 0 {
		s.syncs = slices.Delete(s.syncs, i, i+1)
		s.nsyncs.Store(int32(len(s.syncs)))
	}
	s.pmu.Unlock()
	if i < 0 {
		return false
	}
	v := m.vals[s.d.m.newest.convs]
	if el := s.d.m.newest.elem; el != nil {
		s.syncedList(el, v)
	} else if v.kind == kindObject {
		s.syncedObject(v)
	}
	// A conversation the server lists none of yet still has its place
	// from now: its first message is then owed, and fetched if missed.
	for _, c := range s.convs {
		s.cu.Behind(c, 0, s.at)
	}
	s.lacking = true
	return true
}

// syncedList reads a list of objects each naming a conversation and its
// newest seq (Tinode's subscriptions).
func (s *session) syncedList(el *decoder, v value) {
	if v.kind != kindArray {
		return
	}
	p := jsonscan.Scanner{B: v.b}
	p.I++ // the '[', which the decoder found
	p.WS()
	if p.Eat(']') {
		return
	}
	em := el.newMsg()
	for {
		em.reset()
		if el.walk(&p, &el.root, em, 0) != nil {
			return
		}
		if seq, ok := em.vals[1].uint(); ok && em.vals[0].kind == kindString {
			s.cu.Behind(string(em.vals[0].b), seq, s.at)
		}
		p.WS()
		if !p.Eat(',') {
			return
		}
	}
}

// syncedObject reads an object of conversation to newest seq.
func (s *session) syncedObject(v value) {
	p := jsonscan.Scanner{B: v.b}
	if p.Open() != nil {
		return
	}
	for first := true; ; first = false {
		key, ok, err := p.Field(first)
		if err != nil || !ok {
			break
		}
		last, err := p.Uint()
		if err != nil {
			break
		}
		s.cu.Behind(string(key), last, s.at)
	}
}

// redactCaptures returns raw as a trace may show it: with the values the
// open steps would capture under a secret's name removed.
func (s *session) redactCaptures(raw []byte, open []waiting) string {
	out := string(raw)
	m := s.d.m.dec.newMsg()
	_ = s.d.m.dec.each(bytes.Clone(raw), m, func(m *msg) error {
		for _, w := range open {
			for _, c := range w.st.captures {
				if v := m.vals[c.slot]; v.present() && len(v.b) >= 4 && secretName(c.name) {
					out = strings.ReplaceAll(out, string(v.b), "[redacted]")
				}
			}
		}
		return nil
	})
	return out
}
