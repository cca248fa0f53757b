package jsonws

// The login: the mapping's steps, run in order with a window of
// subscribes in flight, each waiting for the reply that matches it.

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/gorilla/websocket"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// subscribeWindow is how many subscribe steps a session has in flight.
const subscribeWindow = 16

// maxEarlyFactor bounds what the login keeps for Serve, in frames' worth.
const maxEarlyFactor = 4

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
					if r == metrics.ConnectUnauthorized {
						return probe.Unauthorized(fmt.Errorf("server closed the connection during %s: %d %q", open[0].st.key, ce.Code, ce.Text))
					}
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
	send, what := st.send, ".send"
	if ec.resume {
		send, what = st.resume, ".resume"
	}
	if send == nil {
		return w, nil
	}
	b, err := send.render(nil, &ec)
	if err != nil {
		return waiting{}, fmt.Errorf("%s%s: %w", st.key, what, err)
	}
	s.trace("send", st.key+what, s.redacted(send, &ec))
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
	var conv url.Values
	for _, c := range st.captures {
		v := m.vals[c.slot]
		if !v.present() {
			return fmt.Errorf("%s: the reply has nothing at %s to capture as %s", stepName(st), s.d.m.dec.paths[c.slot], c.name)
		}
		val := string(v.b)
		if st.conv {
			if conv == nil {
				conv = url.Values{}
			}
			conv.Set(c.name, val)
			continue
		}
		if w.e.capGroup != "" {
			s.d.dir.set(true, w.e.capGroup, c.name, val)
		} else {
			s.attrs[c.name] = val
			s.d.dir.set(false, s.user, c.name, val)
		}
		s.trace("step", st.key+".capture."+c.name, "captured")
	}
	if conv != nil && s.cu != nil {
		// Kept with the device's place: its next session resumes
		// with what this one was told.
		s.cu.SetMark(w.e.conv, conv.Encode())
		s.trace("step", st.key+".capture", "captured of "+w.e.conv)
	}
	if err := s.keepListed(w, m); err != nil {
		return err
	}
	s.trace("step", st.key, "ok")
	return nil
}

// keepListed keeps what the reply m to a subscribe step says of its
// conversation, the deliveries it lists and the newest seq, for Serve to
// hand on in order with the frames that came after it.
func (s *session) keepListed(w *waiting, m *msg) error {
	st := w.st
	e := early{reply: true, conv: w.e.conv, group: w.e.group != "", at: s.at}
	if st.list != nil {
		if v := m.vals[st.list.slot]; v.kind == kindArray {
			e.b, e.list = bytes.Clone(v.b), st.list
		}
	}
	if st.newest >= 0 && s.cu != nil {
		// A reply without it says 0: servers leave zero values out
		// (Centrifugo's offset of a channel with nothing in it yet).
		v := m.vals[st.newest]
		n, ok := v.uint()
		if v.present() && !ok {
			return fmt.Errorf("%s: the newest seq at %s is not a whole number: %.40q", stepName(st), s.d.m.dec.paths[st.newest], v.b)
		}
		e.newest, e.hasNewest = n, true
	}
	if e.list == nil && !e.hasNewest {
		return nil
	}
	if s.earlySize += len(e.b); s.earlySize > maxEarlyFactor*int(s.d.m.maxFrame) {
		return fmt.Errorf("too much traffic during login: over %d bytes before the session was ready", maxEarlyFactor*s.d.m.maxFrame)
	}
	s.early = append(s.early, e)
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
// and when they came off the socket (Delivery.At). A subscribe step's
// reply (reply) is kept as what it says of its conversation conv: the
// array of the deliveries it lists in b, read with list, and the newest
// seq.
type early struct {
	b  []byte
	at int64

	reply     bool
	list      *listDec
	conv      string
	group     bool
	newest    uint64
	hasNewest bool
}

// copyFrom returns a copy of the bytes of raw that m came from: the whole
// frame, or with line framing, m's own line.
func (m *msg) copyFrom(raw []byte) []byte {
	return bytes.Clone(raw[m.start:m.end])
}
