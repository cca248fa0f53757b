// Package centrifugo is the probe driver for Centrifugo v6's bidirectional
// WebSocket protocol with JSON encoding: an HS256 token login, channels
// subscribed by the client, publications acknowledged by a reply to the
// publish command, and per-channel offsets and epochs as the server's own
// sequence.
//
// Groups are channels of the group namespace (chat:GROUP); direct messages
// go over user-limited channels of the direct namespace (dm:#alice,bob,
// the two users sorted), which only the users named after the '#' may
// subscribe to. Centrifugo delivers a publication to every subscribed
// connection, the publisher's own included: a session skips what its
// device published (info.client names the connection), and delivers what
// the user's other devices did (MirrorsOwn).
//
// With catch-up (probe.Device.Catchup), a device resubscribes with
// recovery from the offset and epoch it reached, fetches a gap in a
// channel's offsets with the history command, and asks each channel's top
// on Sync: see catchup.go.
package centrifugo

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var (
	_ probe.Driver = (*Driver)(nil)
	_ probe.Mirror = (*Driver)(nil)
)

// Options configures the driver.
type Options struct {
	// URL is Centrifugo's WebSocket endpoint,
	// ws://127.0.0.1:8000/connection/websocket.
	URL string
	// Header is sent with every WebSocket upgrade: imcanary's User-Agent
	// and the configured target.headers. It is not modified.
	Header http.Header
	// Secret is the HMAC key of client.token.hmac_secret_key that signs
	// connection tokens (HS256). It is never logged.
	Secret []byte
	// Heartbeat is the session's WebSocket ping interval; a session that
	// reads nothing for two of them (or two server pings) and a margin is
	// declared dead. Default 30s.
	Heartbeat time.Duration
	// DialTimeout bounds connect, login and the subscriptions together.
	// Default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write. Default 5s: a server that stops
	// reading must not block the sender, which serves other users too,
	// for longer.
	WriteTimeout time.Duration
	// MaxFrame bounds one received frame. Default 4 MiB: a subscribe
	// reply recovers up to 300 publications in one frame
	// (client.recovery_max_publication_limit), a history reply
	// historyPage.
	MaxFrame int64
	// Logger receives debug logs of the server's own gaps; nil discards.
	Logger *slog.Logger
	// TLS, if set, is the client TLS configuration of a wss:// URL (the
	// roots it trusts); nil verifies against the system's roots. The
	// driver's sessions share one TLS session cache either way, so that
	// a reconnect resumes rather than repeats the full handshake.
	TLS *tls.Config
}

// Driver connects users to a Centrifugo server.
type Driver struct {
	opts Options
	cfg  Config
	log  *slog.Logger
	// conn is what every session's connection shares.
	conn *wsconn.Settings
	// key signs the connection tokens, at connect and at each refresh:
	// opts.Secret, until Rekey replaces it.
	key *probe.Key
	// groupPrefix is "chat:", what a group channel starts with.
	groupPrefix []byte

	// chans maps a user to the channels it subscribes to: its groups'
	// and its direct conversations', both those it sends on and those it
	// receives on (a user-limited channel is published to only by a
	// subscriber).
	chans probe.Memberships[string]

	mu sync.Mutex
	// state maps a device to what its sessions saw. It outlives sessions,
	// so that a reconnect can tell, from the offsets, what the server
	// published while the device was away. Per device, not per user: a
	// user's devices are connections of their own, each with its own
	// place in every channel.
	state map[devKey]*devState

	gaps, missed, recovered atomic.Uint64
}

// devKey names one device of one user.
type devKey struct {
	user  string
	index int
}

// devState is what one device's sessions leave the next: its position in
// each channel, and the client ids its latest sessions had.
type devState struct {
	mu  sync.Mutex
	pos map[string]*position
	// clients are the ids Centrifugo gave the device's last sessions,
	// the newest last: a publication whose info.client is one of them
	// is the device's own, echoed (live, or recovered after a
	// reconnect), and the ledger is owed it nowhere on this device.
	clients []string
}

// maxClients bounds devState.clients: a recovery or a history page reaches
// back a few sessions at most, and an own publication older than that is
// only counted ignored by the ledger.
const maxClients = 8

// position is the last offset a device's session saw in a channel, within
// the channel's epoch. known is false until a subscription told the epoch.
// It feeds ServerStats only; what the device holds, for catch-up, is its
// probe.Catchup's.
type position struct {
	offset uint64
	epoch  string
	known  bool
}

// closeGrace is how long Close waits for the server's close reply.
const closeGrace = time.Second

// New returns a driver for the server at o.URL with the section c; a zero
// field of c is its default's.
func New(c Config, o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("centrifugo: no url")
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("centrifugo: no token secret")
	}
	def := DefaultConfig()
	c.GroupNamespace = cmp.Or(c.GroupNamespace, def.GroupNamespace)
	c.DirectNamespace = cmp.Or(c.DirectNamespace, def.DirectNamespace)
	c.TokenTTL = cmp.Or(c.TokenTTL, def.TokenTTL)
	for _, ns := range []string{c.GroupNamespace, c.DirectNamespace} {
		if strings.ContainsAny(ns, ":#,") {
			return nil, fmt.Errorf("centrifugo: namespace %q: must not contain ':', '#' or ','", ns)
		}
	}
	if c.GroupNamespace == c.DirectNamespace {
		return nil, fmt.Errorf("centrifugo: group and direct namespace are both %q", c.GroupNamespace)
	}
	if c.TokenTTL < 2*time.Second {
		return nil, fmt.Errorf("centrifugo: token ttl %v: must be at least 2s", c.TokenTTL)
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = 4 << 20
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{
		opts: o,
		cfg:  c,
		key:  probe.NewKey(o.Secret),
		log:  log,
		// The login raises the idle timeout to two of the server's pings
		// when those are slower (session.connected).
		conn: wsconn.NewSettings(wsconn.Settings{
			URL: o.URL, Header: o.Header, MaxFrame: o.MaxFrame,
			DialTimeout: o.DialTimeout, WriteTimeout: o.WriteTimeout, Heartbeat: o.Heartbeat,
			CloseGrace: closeGrace, TLS: o.TLS,
		}),
		groupPrefix: []byte(c.GroupNamespace + ":"),
		state:       map[devKey]*devState{},
	}, nil
}

// ServerStats counts what Centrifugo's own stream positions revealed to
// this driver's sessions. The ledger, which checks imcanary's own sequence,
// stays the source of truth for loss: these counts say whether the server
// knew.
type ServerStats struct {
	// Gaps counts events: an offset that jumped, an epoch that changed
	// (the stream was lost, as at a restart of a memory engine), or a
	// close for insufficient state.
	Gaps uint64
	// Missed counts the publications the offsets skipped, on channels
	// whose epoch held. A session's own publications are included: the
	// offsets number every publication of a channel.
	Missed uint64
	// Recovered counts publications received through catch-up: the
	// recovery of a resubscribe, and history fetches.
	Recovered uint64
}

// ServerStats returns the driver's counts so far.
func (d *Driver) ServerStats() ServerStats {
	return ServerStats{Gaps: d.gaps.Load(), Missed: d.missed.Load(), Recovered: d.recovered.Load()}
}

// ServerGaps returns how many gaps the server's own numbering revealed:
// see ServerStats.Gaps.
func (d *Driver) ServerGaps() uint64 { return d.gaps.Load() }

// GroupChannel returns the channel of group g.
func (d *Driver) GroupChannel(g string) string { return d.cfg.GroupNamespace + ":" + g }

// DirectChannel returns the user-limited channel of the direct
// conversation between a and b, in either direction.
func (d *Driver) DirectChannel(a, b string) string {
	return string(d.appendDirect(nil, a, b))
}

func (d *Driver) appendDirect(dst []byte, a, b string) []byte {
	if b < a {
		a, b = b, a
	}
	dst = append(dst, d.cfg.DirectNamespace...)
	dst = append(dst, ":#"...)
	dst = append(dst, a...)
	dst = append(dst, ',')
	return append(dst, b...)
}

// Provision implements probe.Driver. Centrifugo creates channels on first
// use and users are whoever holds a token, so nothing is created on the
// server: the plan only says which channels each user subscribes to.
func (d *Driver) Provision(_ context.Context, plan probe.Plan) error {
	set := make(map[string]map[string]bool)
	add := func(u, ch string) {
		if set[u] == nil {
			set[u] = map[string]bool{}
		}
		set[u][ch] = true
	}
	for _, g := range plan.Groups {
		for _, m := range g.Members {
			add(m, d.GroupChannel(g.Name))
		}
	}
	for _, p := range plan.Direct {
		// The user-limited part of a channel lists users separated by
		// ',' after the last '#': a name holding either would name
		// other users.
		for _, u := range []string{p.From, p.To} {
			if strings.ContainsAny(u, "#,") {
				return fmt.Errorf("provision: user %q: a name in a user-limited channel must not contain '#' or ','", u)
			}
		}
		ch := d.DirectChannel(p.From, p.To)
		add(p.From, ch)
		add(p.To, ch)
	}
	chans := make(map[string][]string, len(set))
	for u, chs := range set {
		chans[u] = slices.Sorted(maps.Keys(chs))
	}
	d.chans.Replace(plan.Users, chans)
	return nil
}

// MirrorsOwn implements probe.Mirror: every connection subscribed to a
// channel gets each of its publications, so what one device of a user
// publishes reaches the user's other devices too.
func (d *Driver) MirrorsOwn() bool { return true }

// Connect implements probe.Driver: it logs user in as device dev and
// subscribes to the user's channels, and returns once every subscription
// is confirmed, so that a device counted online receives what is sent to
// it. Devices of one user connect independently, at the same time if they
// like: Centrifugo holds any number of connections per user (but for
// client.user_connection_limit, see closeReason).
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	chans := d.chans.Of(user)
	k := devKey{user, dev.Index}
	d.mu.Lock()
	st := d.state[k]
	if st == nil {
		st = &devState{pos: map[string]*position{}}
		d.state[k] = st
	}
	d.mu.Unlock()
	s, err := d.connect(ctx, user, chans, st, dev)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// token returns a connection token for user.
func (d *Driver) token(user string) (string, error) {
	now := time.Now()
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   user,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(d.cfg.TokenTTL)),
	})
	s, err := t.SignedString(d.key.Bytes())
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

func (d *Driver) connect(ctx context.Context, user string, chans []string, st *devState, dev probe.Device) (*session, error) {
	s := &session{d: d, user: user, userB: []byte(user), st: st, cu: dev.Catchup, chans: chans}
	if s.cu != nil {
		s.marks = make(map[string]streamMark, len(chans))
	}
	_, err := wsconn.Open(ctx, d.conn, dev.Link, user, func(c *wsconn.Conn) error {
		s.conn = c
		return s.handshake(chans)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}
