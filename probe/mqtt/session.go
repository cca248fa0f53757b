package mqtt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

// maxInflight is the most QoS 1 publishes a session has unacknowledged:
// packet ids are 16 bits, and an id is reused only once its PUBACK came.
const maxInflight = 1<<16 - 1

// maxEarly bounds the publishes a session keeps from its login, read
// before the SUBACK (a persistent session's queue arrives first), for
// Serve to deliver.
const maxEarly = 4096

// maxSubscribes bounds the SUBSCRIBEs of one login: a broker that says
// the packet id of one is in use is asked again under another (see
// login), a few times, not for ever.
const maxSubscribes = 4

// codeIDInUse is the SUBACK code of a SUBSCRIBE refused for its packet
// id (MQTT 5 §3.9.3); mochi-mqtt sends it to 3.1.1 sessions too.
const codeIDInUse = 0x91

type session struct {
	d    *Driver
	conn *wsconn.Conn
	user string
	// present is CONNACK's word that the broker kept the device's
	// persistent session: what it queued meanwhile arrives now.
	present bool
	// loginAt (Unix ns) is when the CONNACK came: a message intended
	// before it that this session receives was queued while the device
	// was away.
	loginAt int64

	mu sync.Mutex
	// h is Serve's handler; qos 0 acks from Send go to it, and refs
	// written before Serve wait in written.
	h       probe.Handler
	written []uint64
	nextID  uint16
	// inflight are the QoS 1 publishes not yet acknowledged, in the
	// order sent, which is the order a broker acknowledges them in.
	inflight []flight

	// Serve's own, on its goroutine.
	carry    []byte
	acks     []byte
	early    []early
	delivery probe.Delivery
	hdr      probe.Header
}

type flight struct {
	id  uint16
	ref uint64
}

type early struct {
	p  packet
	at int64
}

// Connect dials the broker, sends CONNECT, and subscribes to the user's
// topics; the session is logged in once the SUBACK grants every one.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	topics := d.topics.Of(user)
	if len(topics) == 0 {
		return nil, fmt.Errorf("mqtt: user %q was not provisioned", user)
	}
	s := &session{d: d, user: user}
	persistent := dev.Catchup != nil
	var err error
	s.conn, err = wsconn.Open(ctx, d.conn, dev.Link, user, func(c *wsconn.Conn) error {
		s.conn = c
		return s.login(d.clientID(user, dev.Index), persistent, topics, d.noLocal(topics))
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// timedOut reports whether a read ended by its deadline or by the session's
// own close, rather than by the broker.
func timedOut(err error) bool {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return true
	}
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed)
}

func (s *session) login(clientID string, persistent bool, topics []string, noLocal []bool) error {
	d := s.d
	expiry := uint32(d.cfg.SessionExpiry / time.Second)
	password := d.password.Bytes()
	if err := passwordFits(d.cfg, len(password) > 0); err != nil {
		// A secret rekeyed in since New: the CONNECT could only be
		// refused.
		return err
	}
	if err := s.conn.Write(d.c.connect(clientID, d.cfg.Username, password, !persistent, d.keepalive, expiry)); err != nil {
		return fmt.Errorf("CONNECT: %w", err)
	}
	subID := uint16(1)
	s.nextID = 2
	connacked, subscribes := false, 1
	for {
		bp, at, err := s.conn.Read(d.conn.DialTimeout)
		if err != nil {
			if !connacked && !timedOut(err) {
				// The broker gives no reason: mosquitto logs one and
				// closes, for a malformed CONNECT, a password without
				// a user name, or a client id it will not take. The
				// close itself is not in the message, since how it
				// reads ("read tcp …") would stand for the cause.
				d.log.Debug("connection closed before CONNACK", "user", s.user, "err", err)
				return errors.New("broker refused the CONNECT: it closed the connection without a CONNACK, which is how mosquitto refuses one (the broker's log says why)")
			}
			if !connacked {
				return fmt.Errorf("waiting for CONNACK: %w", err)
			}
			return fmt.Errorf("waiting for SUBACK: %w", err)
		}
		done := false
		err = s.packets(*bp, func(p *packet) error {
			switch {
			case p.typ == typeConnack:
				if connacked {
					return errors.New("a second CONNACK")
				}
				if r := d.c.refusal(p.code); r != "" {
					return fmt.Errorf("broker refused CONNECT: %s (code %d)", r, p.code)
				}
				connacked, s.present, s.loginAt = true, p.present, at
				return s.conn.Write(d.c.subscribe(subID, topics, d.qos, noLocal))
			case !connacked:
				return fmt.Errorf("%s before CONNACK", packetName(p.typ))
			case p.typ == typeSuback:
				if p.id != subID {
					return fmt.Errorf("SUBACK for packet %d, want %d", p.id, subID)
				}
				if len(p.codes) != len(topics) {
					return fmt.Errorf("SUBACK grants %d topics, asked %d", len(p.codes), len(topics))
				}
				if subscribes < maxSubscribes && slices.Contains(p.codes, codeIDInUse) {
					// mochi-mqtt holds a SUBSCRIBE's packet id against
					// its own publishes to the session not yet
					// acknowledged, though each side numbers its packets
					// on its own (MQTT 3.1.1 §2.3.1, 5 §2.2.1). A
					// persistent session meets that at reconnect: mochi
					// numbers its publishes to the new connection from 1
					// again and replays the session's queue before the
					// SUBACK, and this session acknowledges those only
					// once Serve has recorded them. Failing the login
					// would leave them unacknowledged, so that every
					// later login is refused too and the device never
					// gets back to its queue: ask again under an id none
					// of them has.
					subID = s.freeID(subID)
					subscribes++
					return s.conn.Write(d.c.subscribe(subID, topics, d.qos, noLocal))
				}
				for i, rc := range p.codes {
					if rc >= 0x80 {
						return fmt.Errorf("broker refused the subscription to %s (code 0x%02x)", topics[i], rc)
					}
				}
				done = true
			case p.typ == typePublish:
				if len(s.early) >= maxEarly {
					return fmt.Errorf("more than %d publishes before SUBACK", maxEarly)
				}
				s.early = append(s.early, early{p: *p, at: at})
			}
			return nil
		})
		wsconn.Release(bp)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// freeID returns a packet id for the login's next SUBSCRIBE, after last
// was refused as in use: the next one down from the top that none of the
// publishes held for Serve has. From the top, since a broker numbers its
// publishes to a new connection upwards, and the next of them should not
// take the id first. Fewer than maxEarly are held, so one is found well
// before the bottom.
func (s *session) freeID(last uint16) uint16 {
	id := last
	if last == 1 {
		id = 0 // the first retry: 0 - 1 is the top
	}
	for {
		id--
		if id != 0 && !slices.ContainsFunc(s.early, func(e early) bool { return e.p.qos > 0 && e.p.id == id }) {
			return id
		}
	}
}

// packets splits b, with what an earlier frame left of a packet, into
// whole packets and hands each, decoded, to f.
func (s *session) packets(b []byte, f func(*packet) error) error {
	if len(s.carry) > 0 {
		s.carry = append(s.carry, b...)
		b = s.carry
	}
	for len(b) > 0 {
		n, whole, err := split(b, s.d.cfg.MaxPacket)
		if err != nil {
			return err
		}
		if !whole {
			// Kept only until the packet's last frame: an idle session
			// holds no buffer.
			s.carry = append(s.carry[:0], b...)
			return nil
		}
		p, err := s.d.c.decode(b[:n])
		if err != nil {
			return err
		}
		if err := f(&p); err != nil {
			return err
		}
		b = b[n:]
	}
	s.carry = nil
	return nil
}

// Serve implements probe.Session.
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
	return wsconn.Session{Conn: s.conn, Proto: &reader{s: s, h: h}, Begin: func() error { return s.begin(h) }}
}

// begin acks what was written before h was set and hands it the
// publishes kept from the connect, in order.
func (s *session) begin(h probe.Handler) error {
	s.mu.Lock()
	s.h = h
	written := s.written
	s.written = nil
	s.mu.Unlock()
	for _, ref := range written {
		h.OnAck(ref, probe.Ack{})
	}
	for i := range s.early {
		s.publish(&s.early[i].p, s.early[i].at, h)
	}
	s.early = nil
	if err := s.flushAcks(); err != nil {
		err = s.conn.Failed(err)
		s.conn.Abort()
		return err
	}
	return nil
}

// reader is the session as its connection's wsconn.Protocol.
type reader struct {
	s  *session
	h  probe.Handler
	at int64 // when the frame being handled was read
}

func (r *reader) Frame(b []byte, at int64) error {
	r.at = at
	if err := r.s.packets(b, r.handle); err != nil {
		return err
	}
	return r.s.flushAcks()
}

// handle handles one packet read after the login.
func (r *reader) handle(p *packet) error {
	s := r.s
	switch p.typ {
	case typePublish:
		if p.qos > 1 {
			// Subscriptions are granted QoS 1 at most; QoS 3 is
			// malformed.
			return fmt.Errorf("PUBLISH of QoS %d on a subscription of QoS 1 at most", p.qos)
		}
		s.publish(p, r.at, r.h)
	case typePuback:
		s.acked(p.id, p.code, r.h)
	case typePingresp:
	case typeDisconn:
		// MQTT 5: the broker says why it ends the session. 0x8E is
		// another connection of the same client id taking the
		// session over: a conflict, never loss.
		reason := metrics.ReasonServerClose
		if p.code == 0x8e {
			reason = metrics.ReasonConflict
		}
		return &probe.Disconnect{Reason: reason, Err: fmt.Errorf("broker sent DISCONNECT: %s", reason5(p.code))}
	default:
		return fmt.Errorf("unexpected %s from broker", packetName(p.typ))
	}
	return nil
}

func (r *reader) Ended(err error) *probe.Disconnect { return wsconn.Ended(err, nil) }

// publish delivers p and queues its PUBACK.
func (s *session) publish(p *packet, at int64, h probe.Handler) {
	d := &s.delivery
	*d = probe.Delivery{Body: p.payload, At: at}
	switch t := p.topic; {
	case strings.HasPrefix(t, s.d.dmPrefix):
		rest := t[len(s.d.dmPrefix):]
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			s.d.unmatched.Add(1)
			break
		}
		d.From = []byte(rest[i+1:])
		s.deliver(p, h)
	case strings.HasPrefix(t, s.d.gPrefix):
		d.Group = true
		s.deliver(p, h)
	default:
		s.d.unmatched.Add(1)
	}
	if p.qos > 0 {
		s.acks = appendPuback(s.acks, p.id)
	}
}

func (s *session) deliver(p *packet, h probe.Handler) {
	d := &s.delivery
	// A resend (DUP) may be of what the device has; a message intended
	// before this session began was queued for it while it was away.
	d.Recovered = p.dup
	if !d.Recovered && s.present && probe.ParseBody(p.payload, &s.hdr) == nil && s.hdr.Intended < s.loginAt {
		d.Recovered = true
	}
	h.OnDelivery(d)
}

// flushAcks writes the PUBACKs of the frame just handled, together.
func (s *session) flushAcks() error {
	if len(s.acks) == 0 {
		return nil
	}
	err := s.conn.Write(s.acks)
	s.acks = s.acks[:0]
	if cap(s.acks) > 4<<10 {
		s.acks = nil
	}
	return err
}

// acked reports the publish of packet id as accepted, or, for an MQTT 5
// reason code of 0x80 or more, as refused.
func (s *session) acked(id uint16, code byte, h probe.Handler) {
	s.mu.Lock()
	ref, ok := uint64(0), false
	for i, f := range s.inflight {
		if f.id == id {
			ref, ok = f.ref, true
			// Acknowledged in order, as brokers do, this removes the
			// head; an earlier one left behind is the broker's
			// omission, written off by the population's ack timeout.
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			break
		}
	}
	if len(s.inflight) == 0 {
		s.inflight = nil
	}
	s.mu.Unlock()
	if !ok {
		s.d.unmatched.Add(1)
		return
	}
	if code >= 0x80 {
		h.OnReject(ref, reason5(code))
		return
	}
	h.OnAck(ref, probe.Ack{})
}

// Send implements probe.Session.
func (s *session) Send(m *probe.Message) error {
	d := s.d
	var topic string
	switch {
	case m.Group != "":
		topic = d.gPrefix + m.Group
	case m.To != "":
		topic = d.dmPrefix + m.To + "/" + s.user
	default:
		return errors.New("mqtt: message with neither recipient nor group")
	}
	if len(m.Body)+len(topic)+8 > d.cfg.MaxPacket {
		return fmt.Errorf("mqtt: message of %d bytes: larger than max_packet %d", len(m.Body), d.cfg.MaxPacket)
	}
	if d.qos == 0 {
		if err := s.conn.Write(d.c.publish(topic, 0, 0, m.Body)); err != nil {
			return err
		}
		s.mu.Lock()
		h := s.h
		if h == nil {
			s.written = append(s.written, m.Ref)
		}
		s.mu.Unlock()
		if h != nil {
			h.OnAck(m.Ref, probe.Ack{})
		}
		return nil
	}
	s.mu.Lock()
	if len(s.inflight) >= maxInflight {
		s.mu.Unlock()
		return fmt.Errorf("mqtt: %d publishes unacknowledged: no packet id free", maxInflight)
	}
	id := s.nextID
	s.nextID++
	if s.nextID == 0 {
		s.nextID = 1
	}
	s.inflight = append(s.inflight, flight{id: id, ref: m.Ref})
	s.mu.Unlock()
	// Written outside mu: the PUBACK may come before Write returns, and
	// finds the flight recorded.
	return s.conn.Write(d.c.publish(topic, id, 1, m.Body))
}

// Ping implements probe.Session: a PINGREQ, answered by PINGRESP, which
// the read loop's idle deadline sees like any frame.
func (s *session) Ping() error { return s.conn.Write(pingreq) }

// Abort implements probe.Aborter: the connection is dropped with no
// close, as a lost link or a load balancer restart drops it.
func (s *session) Abort() { s.conn.Abort() }

var _ probe.Aborter = (*session)(nil)

// Close implements probe.Session: DISCONNECT, after which the broker
// closes the connection.
func (s *session) Close() error { return s.conn.Close() }
