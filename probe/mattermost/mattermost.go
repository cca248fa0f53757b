// Package mattermost is the probe driver for Mattermost, the open-source
// team chat, tested against Mattermost v6.7.2 (its REST API v4 and
// WebSocket are the ones current servers still serve).
//
// A message is sent by REST, POST /api/v4/posts, whose 201 answer (the
// post) is the ack; it carries a pending_post_id, which the server keeps
// for 30 s and answers a repeat of with the post it already made, so a
// send that got no answer is retried under it and never counted twice.
// It is received as a "posted" event on the user's WebSocket
// (/api/v4/websocket, authenticated on the upgrade with the session's
// token), whose post is JSON inside a JSON string.
//
// Users sign up on an open server (EnableOpenServer) with a password
// derived from the target secret, so a restart logs the same users in;
// each device logs in with a device id of its own, which revokes the
// device's previous session instead of piling sessions up. A direct
// conversation is a direct channel, a group a group channel (Mattermost's
// kind for 3 to 8 members); the server makes each once and returns it
// again for the same members, so provisioning is idempotent.
//
// Every event on a connection carries seq, numbered per connection (hello
// is 0), not per channel: a jump in it is an event the server skipped on
// this connection (imcanary_server_sequence_gaps_total). Catch-up: with
// target.catch_up on, a device reconnects with its connection_id and the
// next sequence_number, and the server replays what it queued meanwhile
// (the last 128 events sent and up to 256 not yet sent), counted
// recovered; when it cannot (it answers with a new hello and a new
// connection_id), or seq jumped, the device fetches each of its channels'
// posts since the newest it had (GET /channels/ID/posts?since=), counted
// recovered too. With catch-up off a device connects afresh each time, and
// what was posted while it was away is lost to it. The server closes a
// connection whose send queue (256 events) is full with a close frame
// without a status, 1005: slow_consumer.
package mattermost

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var (
	_ probe.Driver       = (*Driver)(nil)
	_ probe.FrameCounter = (*Driver)(nil)
	_ probe.Mirror       = (*Driver)(nil)
	_ probe.Retrier      = (*Driver)(nil)
)

// Options are what the driver needs of the target beside its section.
type Options struct {
	// URL is the server's site URL, http://127.0.0.1:8065: the REST API
	// is under /api/v4, the WebSocket at /api/v4/websocket (ws, or wss
	// for https).
	URL    string
	Header http.Header
	// Secret derives the users' passwords; never logged.
	Secret []byte
	// Heartbeat is the WebSocket ping interval. Default 30 s.
	Heartbeat time.Duration
	// DialTimeout bounds a dial and its upgrade. Default 10 s.
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Driver connects users to a Mattermost server.
type Driver struct {
	cfg  Config
	opts Options
	log  *slog.Logger
	base string
	pool *longpoll.Pool
	ws   *wsconn.Settings
	// nonce starts every pending_post_id, so that ids stay unique across
	// restarts of imcanary.
	nonce string
	sends chan struct{}

	mu sync.RWMutex
	// ids and names map users to their Mattermost ids and back.
	ids   map[string]string
	names map[string]string
	// groups and directs map a conversation to its channel; channels
	// maps a channel back, for deliveries.
	groups   map[string]string
	directs  map[[2]string]string
	channels map[string]room
	// of lists each user's channels, for catch-up.
	of probe.Memberships[string]
	// tokens are the devices' session tokens, by user and device:
	// secrets, in memory only, never logged.
	tokens map[string]string
	// devices hold where each device's connection stood, for its
	// reconnect.
	devices map[string]*position

	unmatched, gaps, missed, retries atomic.Uint64
	// fetched counts posts delivered by a catch-up fetch, for tests.
	fetched atomic.Uint64
}

// room is what a channel is to imcanary.
type room struct {
	group bool
	name  string
}

// position is where a device's connection stood when its session ended:
// what it needs to resume, or to fetch what it missed.
type position struct {
	mu     sync.Mutex
	connID string
	// next is the seq the device wants next.
	next int64
	// since is the create_at (ms) of the newest post the device has.
	since int64
}

func (p *position) get() (connID string, next, since int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connID, p.next, p.since
}

// New returns a driver for the server at o.URL.
func New(c Config, o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("mattermost: no url")
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("mattermost: url %q: want http://HOST[:PORT] or https://…, the site URL", probe.RedactURL(o.URL))
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("mattermost: no secret to derive the users' passwords from")
	}
	if errs := c.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("mattermost: %s: %w", errs[0].Key, errs[0].Err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := strings.TrimSuffix(u.String(), "/")
	wsu := *u
	wsu.Scheme = "ws"
	if u.Scheme == "https" {
		wsu.Scheme = "wss"
	}
	wsu.Path = strings.TrimSuffix(wsu.Path, "/") + "/api/v4/websocket"
	var n [6]byte
	_, _ = rand.Read(n[:])
	return &Driver{
		cfg: c, opts: o, log: log, base: base,
		pool: longpoll.NewPool(longpoll.Settings{Header: o.Header, MaxConns: c.MaxConnections, MaxBody: int64(c.MaxBody)}),
		ws: wsconn.NewSettings(wsconn.Settings{
			URL: wsu.String(), Header: o.Header, MaxFrame: int64(c.MaxFrame),
			DialTimeout: o.DialTimeout, Heartbeat: o.Heartbeat, CloseGrace: time.Second,
			TextOnly: true,
		}),
		nonce: hex.EncodeToString(n[:]),
		sends: make(chan struct{}, c.MaxSends),
		ids:   map[string]string{}, names: map[string]string{},
		groups: map[string]string{}, directs: map[[2]string]string{}, channels: map[string]room{},
		tokens: map[string]string{}, devices: map[string]*position{},
	}, nil
}

// password is user's password, derived from the secret: the same on
// every run, and worthless without the secret.
func (d *Driver) password(user string) string {
	m := hmac.New(sha256.New, d.opts.Secret)
	m.Write([]byte("imcanary mattermost password\x00" + user))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

func deviceKey(user string, dev int) string { return user + "\x00" + strconv.Itoa(dev) }

// deviceID names device dev of user to the server: a login with it
// revokes the device's earlier session.
func deviceID(user string, dev int) string { return "imcanary:" + user + ":" + strconv.Itoa(dev) }

func (d *Driver) token(user string, dev int) string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.tokens[deviceKey(user, dev)]
}

func (d *Driver) setToken(user string, dev int, tok string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if tok == "" {
		delete(d.tokens, deviceKey(user, dev))
		return
	}
	d.tokens[deviceKey(user, dev)] = tok
}

// position returns device dev of user's position, made on first use.
func (d *Driver) position(user string, dev int) *position {
	k := deviceKey(user, dev)
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.devices[k]
	if p == nil {
		p = &position{}
		d.devices[k] = p
	}
	return p
}

// login logs device dev of user in and returns its session token and user.
func (d *Driver) login(ctx context.Context, link probe.Link, name string, dev int) (string, user, error) {
	in := map[string]string{"login_id": name, "password": d.password(name), "device_id": deviceID(name, dev)}
	var u user
	r, err := d.call(ctx, link, http.MethodPost, "/api/v4/users/login", nil, "", in, &u)
	if err != nil {
		return "", u, err
	}
	tok := r.Header.Get("Token")
	if tok == "" || u.ID == "" {
		return "", u, errors.New("POST /api/v4/users/login: answer without a Token header or user id")
	}
	return tok, u, nil
}

// deviceToken returns a token of device dev of user: the one it had, if
// the server still takes it, or a new login's. The check matters: the
// server upgrades a WebSocket whose token it refuses and then sends it
// nothing, which a resumed session, which waits for no hello, would take
// for a quiet channel.
func (d *Driver) deviceToken(ctx context.Context, link probe.Link, name string, dev int) (string, error) {
	if tok := d.token(name, dev); tok != "" {
		_, err := d.call(ctx, link, http.MethodGet, "/api/v4/users/me", nil, tok, nil, nil)
		if err == nil {
			return tok, nil
		}
		if statusOf(err) != http.StatusUnauthorized {
			return "", err
		}
		d.setToken(name, dev, "")
	}
	tok, _, err := d.login(ctx, link, name, dev)
	if err != nil {
		return "", err
	}
	d.setToken(name, dev, tok)
	return tok, nil
}

// provisionWorkers is how many users or channels Provision sets up at
// once: a login is a password hash on the server, and more in parallel
// than it has cores only queues there.
const provisionWorkers = 8

// Provision signs every user of plan up (a user that exists is logged in
// instead) and makes the direct channel of each pair and the group channel
// of each group; the server returns a channel that exists for the same
// members, so a second run creates nothing.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	for _, u := range plan.Users {
		if !username.MatchString(u) || len(u) > 64 {
			return probe.Provisioning(fmt.Errorf("mattermost: user %q: a Mattermost username is 1 to 64 of a-z 0-9 . - _", u))
		}
	}
	for _, g := range plan.Groups {
		if n := len(g.Members); n > 0 && (n < 3 || n > 8) {
			return probe.Provisioning(fmt.Errorf("mattermost: group %q has %d members: Mattermost's group channels hold 3 to 8 (population.group_size)", g.Name, n))
		}
	}
	tokens := make([]string, len(plan.Users))
	ids := make([]string, len(plan.Users))
	err := probe.Parallel(ctx, len(plan.Users), provisionWorkers, func(ctx context.Context, i int) error {
		tok, id, err := d.ensureUser(ctx, plan.Users[i])
		tokens[i], ids[i] = tok, id
		return err
	})
	if err != nil {
		return err
	}
	idOf := make(map[string]string, len(plan.Users))
	tokenOf := make(map[string]string, len(plan.Users))
	for i, u := range plan.Users {
		idOf[u], tokenOf[u] = ids[i], tokens[i]
	}
	type want struct {
		members []string
		r       room
		pair    [2]string
	}
	var wants []want
	for _, g := range plan.Groups {
		if len(g.Members) > 0 {
			wants = append(wants, want{members: g.Members, r: room{group: true, name: g.Name}})
		}
	}
	seen := map[[2]string]bool{}
	for _, p := range plan.Direct {
		k := pairKey(p.From, p.To)
		if seen[k] {
			continue
		}
		seen[k] = true
		wants = append(wants, want{members: []string{k[0], k[1]}, pair: k})
	}
	chans := make([]string, len(wants))
	err = probe.Parallel(ctx, len(wants), provisionWorkers, func(ctx context.Context, i int) error {
		w := wants[i]
		mids := make([]string, len(w.members))
		for j, m := range w.members {
			if mids[j] = idOf[m]; mids[j] == "" {
				return probe.Provisioning(fmt.Errorf("mattermost: %s is in a conversation but not among the plan's users", m))
			}
		}
		path := "/api/v4/channels/direct"
		if w.r.group {
			path = "/api/v4/channels/group"
		}
		var ch channel
		if _, err := d.call(ctx, probe.Link{}, http.MethodPost, path, nil, tokenOf[w.members[0]], mids, &ch); err != nil {
			return probe.Provisioning(fmt.Errorf("mattermost: channel of %s: %w", strings.Join(w.members, ", "), err))
		}
		if ch.ID == "" {
			return probe.Provisioning(fmt.Errorf("mattermost: channel of %s: answer without an id", strings.Join(w.members, ", ")))
		}
		chans[i] = ch.ID
		return nil
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// Added to what other plans made: the background, canary and soak
	// populations share the driver, each with users of its own.
	for i, u := range plan.Users {
		d.ids[u], d.names[ids[i]] = ids[i], u
	}
	of := make(map[string][]string, len(plan.Users))
	for i, w := range wants {
		if w.r.group {
			d.groups[w.r.name] = chans[i]
		} else {
			d.directs[w.pair] = chans[i]
		}
		d.channels[chans[i]] = w.r
		for _, m := range w.members {
			of[m] = append(of[m], chans[i])
		}
	}
	d.of.Replace(plan.Users, of)
	return nil
}

// ensureUser logs user in as device 0, signing it up first if it does not
// exist, and returns its token and id.
func (d *Driver) ensureUser(ctx context.Context, name string) (string, string, error) {
	tok, u, err := d.login(ctx, probe.Link{}, name, 0)
	if statusOf(err) == http.StatusUnauthorized {
		in := map[string]string{"username": name, "email": name + "@" + d.cfg.EmailDomain, "password": d.password(name)}
		if _, cerr := d.call(ctx, probe.Link{}, http.MethodPost, "/api/v4/users", nil, "", in, nil); cerr != nil {
			if statusOf(cerr) == http.StatusBadRequest && strings.Contains(cerr.Error(), "exists") {
				// Its password refused: unauthorized, as a login
				// refused later would be.
				return "", "", probe.Unauthorized(fmt.Errorf("mattermost: user %s exists, but logging it in failed (made with another secret?): %w", name, err))
			}
			return "", "", probe.Provisioning(fmt.Errorf("mattermost: signing %s up (is the server open, EnableOpenServer?): %w", name, cerr))
		}
		tok, u, err = d.login(ctx, probe.Link{}, name, 0)
	}
	if err != nil {
		return "", "", probe.Provisioning(fmt.Errorf("mattermost: logging %s in: %w", name, err))
	}
	d.setToken(name, 0, tok)
	return tok, u.ID, nil
}

// pairKey orders a direct pair, so that A→B and B→A share a channel.
func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// channelOf returns the channel a message of self goes to.
func (d *Driver) channelOf(self string, m *probe.Message) (string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if m.Group != "" {
		id, ok := d.groups[m.Group]
		return id, ok
	}
	id, ok := d.directs[pairKey(self, m.To)]
	return id, ok
}

// lookup returns what channel id is, and who user id is.
func (d *Driver) lookup(channelID, userID string) (room, string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r, ok := d.channels[channelID]
	name := d.names[userID]
	return r, name, ok && name != ""
}

// channelsOf returns user's channels.
func (d *Driver) channelsOf(user string) []string { return d.of.Of(user) }

// MirrorsOwn implements probe.Mirror: every connection of a channel's
// member gets its posted events, the sender's own included.
func (d *Driver) MirrorsOwn() bool { return true }

// FramesUnmatched counts posted events in channels imcanary did not make,
// or from users it did not make.
func (d *Driver) FramesUnmatched() uint64 { return d.unmatched.Load() }

// ServerGaps counts jumps in a connection's seq, and the events they
// skipped.
func (d *Driver) ServerGaps() (gaps, missed uint64) { return d.gaps.Load(), d.missed.Load() }

// Retries counts posts tried again under their pending_post_id.
func (d *Driver) Retries() uint64 { return d.retries.Load() }

// CloseIdleConnections implements probe.IdleCloser.
func (d *Driver) CloseIdleConnections() { d.pool.CloseIdle() }
