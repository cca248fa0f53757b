// Package xmpp is the probe driver for XMPP over WebSocket (RFC 7395),
// proven against Prosody 0.12.
//
// A session logs in with SASL (SCRAM-SHA-1, or PLAIN), binds a resource,
// enables XEP-0198 stream management and joins one XEP-0045 room per group
// of its user. Direct messages are acknowledged by stream management: each
// is followed by <r/>, and the server's <a h="N"/> acknowledges every
// stanza up to the Nth. Group messages are acknowledged by the room's
// reflection of the message to its sender. Users are provisioned by in-band
// registration (XEP-0077); rooms are created by their first occupant.
//
// XMPP has no per-conversation sequence the monitor could use (stanza-ids
// are opaque, SM counts are per stream), so gaps are found by the sequence
// in the probe body alone.
//
// A user's devices are sessions of their own: each binds its own resource
// and joins the user's rooms under its own nick, and every session enables
// message carbons (XEP-0280), so what one device sends or receives
// directly reaches the others. With catch-up on, each device fetches what
// it missed from the message archives (XEP-0313) of its account and its
// rooms: see mam.go.
package xmpp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var (
	_ probe.Driver = (*Driver)(nil)
	_ probe.Mirror = (*Driver)(nil)
	_ probe.Syncer = (*session)(nil)
)

// Options configures the driver.
type Options struct {
	// URL is the server's WebSocket endpoint,
	// ws://127.0.0.1:5280/xmpp-websocket.
	URL string
	// Header is sent with every WebSocket upgrade: imcanary's User-Agent
	// and the configured target.headers. It is not modified.
	Header http.Header
	// Password returns the password of user. It is never logged.
	Password func(user string) string
	// Heartbeat is the session's ping interval; a session that reads
	// nothing for two of them and a margin is declared dead.
	Heartbeat time.Duration
	// DialTimeout bounds connect and login together, and each reply of a
	// registration. Default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write. Default 5s: a server that stops
	// reading must not block the sender, which serves other users too,
	// for longer.
	WriteTimeout time.Duration
}

// Driver connects users to an XMPP server.
type Driver struct {
	opts Options
	cfg  Config
	// conn is what every session's connection shares.
	conn  *wsconn.Settings
	salts saltCache

	// roomsOf maps a user to the bare JIDs of its groups' rooms, which it
	// joins at every login: rooms of a non-persistent kind exist only
	// while occupied.
	roomsOf probe.Memberships[string]

	mu sync.Mutex
	// resumable maps a user's device ("user/index") to the stream
	// management state of its last stream that ended other than by
	// Close, when Options.Resume is set.
	resumable map[string]smState
}

// smState is what resuming a stream needs.
type smState struct {
	id string
	h  uint32
}

const (
	// closeGrace is how long Close waits for the server's close reply.
	closeGrace = time.Second
	// maxStanza is the largest stanza the driver writes. The dialer's
	// write buffer holds it whole, so no stanza goes out as fragments:
	// Prosody refuses continuation frames (RFC 7395 §3.3.3 forbids them).
	maxStanza = 64 << 10
	// resource is the resource of each user's first device, and the
	// stem of its others' (see resourceOf). A fixed name makes a new
	// login replace a stale session of the same device (Prosody's default
	// conflict policy kicks the old one) rather than sit beside it and
	// receive copies of its messages.
	resource = "imcanary"
	// registerWindow bounds the registrations in flight on one socket,
	// and registerBatch the registrations per socket.
	registerWindow = 16
	registerBatch  = 250
)

// New returns a driver for the server at o.URL.
func New(c Config, o Options) (*Driver, error) {
	switch {
	case o.URL == "":
		return nil, errors.New("xmpp: no server url")
	case c.Domain == "":
		return nil, errors.New("xmpp: no domain")
	case o.Password == nil:
		return nil, errors.New("xmpp: no password function")
	}
	if err := checkDomain(c.Domain); err != nil {
		return nil, fmt.Errorf("xmpp: domain %q: %w", c.Domain, err)
	}
	if c.MUCService == "" {
		c.MUCService = "conference." + c.Domain
	}
	if err := checkDomain(c.MUCService); err != nil {
		return nil, fmt.Errorf("xmpp: muc service %q: %w", c.MUCService, err)
	}
	return &Driver{
		opts: o,
		cfg:  c,
		conn: wsconn.NewSettings(wsconn.Settings{
			URL: o.URL, Header: o.Header, Subprotocol: "xmpp", MaxFrame: maxFrame,
			// The write buffer holds the largest stanza whole.
			WriteBuffer: maxStanza,
			DialTimeout: o.DialTimeout, WriteTimeout: o.WriteTimeout, Heartbeat: o.Heartbeat,
			CloseGrace: closeGrace,
			// The stream ends with its own <close/>, which the server
			// answers in kind before it closes the WebSocket.
			Farewell: closeStream,
		}),
		resumable: map[string]smState{},
	}, nil
}

// Provision implements probe.Driver: it registers the plan's users when
// Config.Register is set, and remembers the rooms each user joins at
// login. Rooms need no provisioning: the first occupant creates one.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	for _, u := range plan.Users {
		if err := checkLocal(u); err != nil {
			return fmt.Errorf("provision: user %q: %w", u, err)
		}
	}
	// Several populations (background, canary, soak) share the driver,
	// each with users of its own prefix: a plan replaces only its own
	// users' rooms.
	roomsOf := make(map[string][]string)
	for _, g := range plan.Groups {
		if err := checkLocal(g.Name); err != nil {
			return fmt.Errorf("provision: group %q: %w", g.Name, err)
		}
		room := g.Name + "@" + d.cfg.MUCService
		for _, m := range g.Members {
			roomsOf[m] = append(roomsOf[m], room)
		}
	}
	d.roomsOf.Replace(plan.Users, roomsOf)
	if !d.cfg.Register {
		return nil
	}
	for start := 0; start < len(plan.Users); start += registerBatch {
		batch := plan.Users[start:min(start+registerBatch, len(plan.Users))]
		if err := d.register(ctx, batch); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	return nil
}

// register creates users on one unauthenticated stream, a bounded window
// of requests at a time. An existing user ("conflict") is success.
func (d *Driver) register(ctx context.Context, users []string) error {
	conn, err := wsconn.Dial(ctx, d.conn, probe.Link{})
	if err != nil {
		return err
	}
	// Shutdown must not wait for a server that stopped answering.
	stop := conn.Interrupt(ctx)
	defer stop()
	defer conn.Abort()
	s := &session{d: d, conn: conn}
	if err := s.write(openStream(d.cfg.Domain), false); err != nil {
		return err
	}
	var (
		offered    = false
		sent, done int
	)
	step := func(st *stanza) error {
		switch st.kind {
		case kindStreamError:
			return fmt.Errorf("registration stream error: %s", st.errorText())
		case kindClose:
			return errors.New("server closed the registration stream")
		case kindFeatures:
			if !st.featRegister {
				return errors.New("server offers no in-band registration (XEP-0077)")
			}
			offered = true
		case kindIQ:
			i, ok := registerIndex(st.id, len(users))
			if !ok {
				return nil
			}
			switch {
			case st.typ == "result":
			case st.typ == "error" && st.cond == "conflict":
				// Registered before; its password is proven at login.
			case st.typ == "error":
				return fmt.Errorf("register %s: %s", users[i], st.errorText())
			default:
				return nil
			}
			done++
		}
		return nil
	}
	st := new(stanza)
	for done < len(users) {
		for offered && sent < len(users) && sent-done < registerWindow {
			u := users[sent]
			if err := s.write(registerStanza("reg"+strconv.Itoa(sent), u, d.opts.Password(u)), false); err != nil {
				return fmt.Errorf("register %s: %w", u, err)
			}
			sent++
		}
		bp, _, err := conn.Read(d.conn.DialTimeout)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("registration: %w", err)
		}
		err = parseFrame(*bp, st, step)
		wsconn.Release(bp)
		if err != nil {
			return err
		}
	}
	// A courtesy close; the deferred Close tears the socket down.
	_ = s.write(closeStream, false)
	return nil
}

// registerIndex parses the id of a registration request.
func registerIndex(id string, n int) (int, bool) {
	rest, ok := strings.CutPrefix(id, "reg")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0 && i < n
}

// Connect implements probe.Driver.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	if err := checkLocal(user); err != nil {
		return nil, fmt.Errorf("login %q: %w", user, err)
	}
	rooms := d.roomsOf.Of(user)
	key := user + "/" + strconv.Itoa(dev.Index)
	d.mu.Lock()
	prev := d.resumable[key]
	// A resumption is tried once: if it fails, the state is stale.
	delete(d.resumable, key)
	d.mu.Unlock()

	s := &session{d: d, user: user, bare: user + "@" + d.cfg.Domain, resource: resourceOf(dev.Index),
		nick: nickOf(user, dev.Index), index: dev.Index, key: key}
	_, err := wsconn.Open(ctx, d.conn, dev.Link, user, func(c *wsconn.Conn) error {
		s.conn = c
		return s.login(rooms, prev)
	})
	if err != nil {
		return nil, err
	}
	if dev.Catchup != nil {
		s.cat = newCatchup(dev.Catchup, s.bare, rooms)
		// What the device missed while away is asked for at once,
		// not at the first Sync.
		if err := s.Sync(); err != nil {
			s.conn.Abort()
			return nil, fmt.Errorf("catch-up: %w", err)
		}
	}
	return s, nil
}

// MirrorsOwn implements probe.Mirror: every session enables message
// carbons (XEP-0280), so a direct message one device sends reaches the
// user's other devices as a <sent/> carbon, and each device is an
// occupant of its own in the user's rooms, so the room delivers a group
// message to the sender's other devices as to anyone. A device other than
// the first fails its login on a server that refuses carbons.
func (d *Driver) MirrorsOwn() bool { return true }

// resourceOf is device i's resource. The first device keeps the name a
// single-device population has always used; a device that logs in again
// binds the same resource, so the server replaces a stale session of it
// (Prosody: the old one gets a conflict stream error) rather than keep
// both.
func resourceOf(i int) string {
	if i == 0 {
		return resource
	}
	return resource + "-" + strconv.Itoa(i)
}

// nickOf is device i's nickname in the user's rooms: each device is an
// occupant of its own, so that the room reflects a message only to the
// device that sent it (its ack) and delivers it to the others as to any
// other member. Prosody also lets one bare JID join under one nick from
// several resources, but then a device cannot tell its own reflection
// from a sibling's message, nor its own archived messages from theirs.
func nickOf(user string, i int) string {
	if i == 0 {
		return user
	}
	return user + "#" + strconv.Itoa(i)
}

// forget drops what the driver remembers of a device's stream, or keeps
// it for a resumption.
func (d *Driver) forget(key string, st smState, keep bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if keep && d.cfg.Resume && st.id != "" {
		d.resumable[key] = st
		return
	}
	delete(d.resumable, key)
}

// checkLocal checks that s can be used verbatim as the localpart of a JID
// and as a room nickname: printable ASCII without the characters JIDs
// reserve. Anything else would need XEP-0106 escaping, and the names
// would no longer match what the server reflects back.
func checkLocal(s string) error {
	if s == "" || len(s) > 1023 {
		return errors.New("must be 1 to 1023 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("byte %#x at %d: only printable ASCII is allowed", c, i)
		}
		switch c {
		case '"', '&', '\'', '/', ':', '<', '>', '@':
			return fmt.Errorf("character %q at %d is reserved in JIDs", c, i)
		}
	}
	return nil
}

func checkDomain(s string) error {
	if s == "" || len(s) > 1023 {
		return errors.New("must be 1 to 1023 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '[' || c == ']' || c == ':') {
			return fmt.Errorf("character %q at %d is not allowed in a domain", c, i)
		}
	}
	return nil
}
