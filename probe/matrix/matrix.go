// Package matrix is the probe driver for the Matrix client-server API, the
// open federation protocol behind Element, tested against Dendrite (Synapse
// serves the same API).
//
// Matrix pushes nothing: each session keeps one long-poll /sync in flight
// (probe/internal/longpoll), and sends with PUT /rooms/ROOM/send/
// m.room.message/TXNID, whose transaction id makes a retry idempotent: a
// send that got no answer is tried again with the same id, and the server
// answers with the event it already made, so a retry is never counted
// twice.
//
// Users are registered through the registration shared secret (the target
// secret), each with a password derived from it, so that a restart of
// imcanary logs the same users in again. Each device logs in with a device
// id of its own (IMC0, IMC1, …) and its token is kept for its next
// session. Groups are private rooms, direct conversations two-member rooms
// (is_direct), each found again by its alias: #PREFIX_g_GROUP and
// #PREFIX_d_A_B. Every device of every member gets every room event,
// the sender's other devices included (MirrorsOwn).
//
// Matrix numbers nothing per room that a client can check (event ids are
// hashes, stream tokens opaque): imcanary's own seq in the body is the
// truth. Catch-up: with target.catch_up on, a device keeps its /sync
// position across sessions, as a client's store does, and resumes from it:
// what arrived while it was away comes in the first answer, counted
// recovered. When the server says a room's timeline is limited (it left
// events out), the session pages back with /messages to the last event it
// had, and what it fetches counts recovered too. With catch-up off, a
// session starts from the server's present and a limited timeline's gap
// stays a gap: lost.
package matrix

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
)

var (
	_ probe.Driver       = (*Driver)(nil)
	_ probe.FrameCounter = (*Driver)(nil)
	_ probe.Mirror       = (*Driver)(nil)
	_ probe.Retrier      = (*Driver)(nil)
)

// Options are what the driver needs of the target beside its section.
type Options struct {
	// URL is the homeserver's client API base, http://127.0.0.1:8008.
	URL    string
	Header http.Header
	// Secret is the registration shared secret; never logged.
	Secret []byte
	// RequestTimeout bounds a login and its first /sync together, and
	// each send attempt and catch-up page. Default 30 s.
	RequestTimeout time.Duration
	Logger         *slog.Logger
}

// Driver connects users to a Matrix homeserver.
type Driver struct {
	cfg  Config
	opts Options
	log  *slog.Logger
	base string
	pool *longpoll.Pool
	// filter is the /sync filter, URL-ready.
	filter string
	// nonce starts every transaction id, so that ids stay unique across
	// restarts of imcanary for a device whose token survived.
	nonce string
	sends chan struct{}

	mu sync.RWMutex
	// groups and directs map a conversation to its room; rooms maps a
	// room back, for deliveries.
	groups  map[string]string
	directs map[[2]string]string
	rooms   map[string]room
	// tokens are the devices' access tokens, by user and device id:
	// secrets, kept in memory only, never logged.
	tokens map[string]string

	unmatched atomic.Uint64
	retries   atomic.Uint64
}

// room is what a room is to imcanary.
type room struct {
	group bool
	name  string
}

// New returns a driver for the homeserver at o.URL.
func New(c Config, o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("matrix: no url")
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("matrix: url %q: want http://HOST[:PORT] or https://…", probe.RedactURL(o.URL))
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("matrix: no registration shared secret (target.secret_file or IMCANARY_TARGET_SECRET)")
	}
	if errs := c.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("matrix: %s: %w", errs[0].Key, errs[0].Err)
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var n [6]byte
	_, _ = rand.Read(n[:])
	return &Driver{
		cfg: c, opts: o, log: log, base: strings.TrimSuffix(u.String(), "/"),
		pool:   longpoll.NewPool(longpoll.Settings{Header: o.Header, MaxConns: c.MaxConnections, MaxBody: int64(c.MaxBody)}),
		filter: filter(c.TimelineLimit), nonce: hex.EncodeToString(n[:]),
		sends:  make(chan struct{}, c.MaxSends),
		groups: map[string]string{}, directs: map[[2]string]string{}, rooms: map[string]room{},
		tokens: map[string]string{},
	}, nil
}

// userID is user's Matrix id.
func (d *Driver) userID(user string) string { return "@" + user + ":" + d.cfg.ServerName }

// password is user's password, derived from the shared secret: the same
// on every run, and worthless without the secret.
func (d *Driver) password(user string) string {
	m := hmac.New(sha256.New, d.opts.Secret)
	m.Write([]byte("imcanary matrix password\x00" + user))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

// deviceID names device dev of a user: the same on every login, so that
// the server keeps one device per device, not one per login.
func deviceID(dev int) string { return "IMC" + strconv.Itoa(dev) }

func tokenKey(user string, dev int) string { return user + "\x00" + strconv.Itoa(dev) }

func (d *Driver) token(user string, dev int) string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.tokens[tokenKey(user, dev)]
}

func (d *Driver) setToken(user string, dev int, tok string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if tok == "" {
		delete(d.tokens, tokenKey(user, dev))
		return
	}
	d.tokens[tokenKey(user, dev)] = tok
}

// deviceToken returns a token of device dev of user: the one it had, or a
// new login's.
func (d *Driver) deviceToken(ctx context.Context, link probe.Link, user string, dev int) (string, error) {
	if tok := d.token(user, dev); tok != "" {
		return tok, nil
	}
	tok, err := d.login(ctx, link, user, deviceID(dev))
	if err != nil {
		return "", err
	}
	d.setToken(user, dev, tok)
	return tok, nil
}

// provisionWorkers is how many users or rooms Provision sets up at once:
// a login is a password hash on the server, and more in parallel than it
// has cores only queues there.
const provisionWorkers = 8

// Provision registers every user of plan (a user that exists is logged
// in instead) and makes sure a room exists for each group and direct pair,
// with every member joined. Rooms are found by alias, so a second run,
// after a restart of either side, creates nothing.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	for _, u := range plan.Users {
		if !localPart.MatchString(u) || len(d.userID(u)) > 255 {
			return probe.Provisioning(fmt.Errorf("matrix: user %q: a Matrix user's local part is a-z 0-9 . _ = / + - only", u))
		}
	}
	tokens := make([]string, len(plan.Users))
	err := probe.Parallel(ctx, len(plan.Users), provisionWorkers, func(ctx context.Context, i int) error {
		tok, err := d.ensureUser(ctx, plan.Users[i])
		tokens[i] = tok
		return err
	})
	if err != nil {
		return err
	}
	tokenOf := make(map[string]string, len(plan.Users))
	for i, u := range plan.Users {
		tokenOf[u] = tokens[i]
	}
	type want struct {
		alias   string
		members []string
		r       room
		pair    [2]string
	}
	var wants []want
	for _, g := range plan.Groups {
		if len(g.Members) == 0 {
			continue
		}
		wants = append(wants, want{alias: d.cfg.AliasPrefix + "_g_" + g.Name, members: g.Members, r: room{group: true, name: g.Name}})
	}
	seen := map[[2]string]bool{}
	for _, p := range plan.Direct {
		k := pairKey(p.From, p.To)
		if seen[k] {
			continue
		}
		seen[k] = true
		wants = append(wants, want{alias: d.cfg.AliasPrefix + "_d_" + k[0] + "_" + k[1], members: []string{k[0], k[1]}, pair: k})
	}
	ids := make([]string, len(wants))
	err = probe.Parallel(ctx, len(wants), provisionWorkers, func(ctx context.Context, i int) error {
		w := wants[i]
		id, err := d.ensureRoom(ctx, w.alias, w.members, w.r.group, tokenOf)
		ids[i] = id
		return err
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, w := range wants {
		if w.r.group {
			d.groups[w.r.name] = ids[i]
		} else {
			d.directs[w.pair] = ids[i]
		}
		d.rooms[ids[i]] = w.r
	}
	return nil
}

// pairKey orders a direct pair, so that A→B and B→A share a room.
func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// ensureUser registers user, or logs it in as device 0 if it exists, and
// returns a token for provisioning.
func (d *Driver) ensureUser(ctx context.Context, user string) (string, error) {
	if tok := d.token(user, 0); tok != "" {
		return tok, nil
	}
	tok, err := d.register(ctx, user, d.password(user))
	switch {
	case err == nil:
		return tok, nil
	case errcodeOf(err) == "M_USER_IN_USE":
		tok, err := d.login(ctx, probe.Link{}, user, deviceID(0))
		if err != nil {
			return "", probe.Provisioning(fmt.Errorf("matrix: user %s exists, but logging it in failed (registered with another secret?): %w", user, err))
		}
		d.setToken(user, 0, tok)
		return tok, nil
	case statusOf(err) == http.StatusForbidden || statusOf(err) == http.StatusUnauthorized:
		// The shared secret refused: unauthorized, so that a rotated
		// secret the server does not have yet pages as one.
		return "", probe.Unauthorized(fmt.Errorf("matrix: registering %s: %w (is the shared secret the server's registration_shared_secret?)", user, err))
	}
	return "", probe.Provisioning(fmt.Errorf("matrix: registering %s: %w", user, err))
}

// ensureRoom returns the room of alias, creating it (by the first member,
// who invites the others) if there is none, and has every member join.
func (d *Driver) ensureRoom(ctx context.Context, alias string, members []string, group bool, tokenOf map[string]string) (string, error) {
	creator := tokenOf[members[0]]
	full := "#" + alias + ":" + d.cfg.ServerName
	var dir struct {
		RoomID string `json:"room_id"`
	}
	err := d.call(ctx, probe.Link{}, http.MethodGet, "/_matrix/client/v3/directory/room/"+url.PathEscape(full), nil, creator, nil, &dir)
	switch {
	case err == nil && dir.RoomID != "":
	case statusOf(err) == http.StatusNotFound:
		invite := make([]string, 0, len(members)-1)
		for _, m := range members[1:] {
			invite = append(invite, d.userID(m))
		}
		in := map[string]any{
			"preset": "private_chat", "room_alias_name": alias, "invite": invite,
			"is_direct": !group, "name": alias,
		}
		err = d.call(ctx, probe.Link{}, http.MethodPost, "/_matrix/client/v3/createRoom", nil, creator, in, &dir)
		if errcodeOf(err) == "M_ROOM_IN_USE" {
			// Another imcanary made it meanwhile.
			return d.ensureRoom(ctx, alias, members, group, tokenOf)
		}
		if err != nil {
			return "", probe.Provisioning(fmt.Errorf("matrix: creating room %s: %w", full, err))
		}
	default:
		if err == nil {
			err = errors.New("no room_id in the answer")
		}
		return "", probe.Provisioning(fmt.Errorf("matrix: looking up room %s: %w", full, err))
	}
	for _, m := range members[1:] {
		if err := d.join(ctx, dir.RoomID, m, members[0], tokenOf); err != nil {
			return "", probe.Provisioning(fmt.Errorf("matrix: %s joining %s: %w", m, full, err))
		}
	}
	return dir.RoomID, nil
}

// join has user join roomID; a user not invited (a member added to a
// group after its room was made) is invited by the creator first. Joining
// a room one is in already succeeds.
func (d *Driver) join(ctx context.Context, roomID, user, creator string, tokenOf map[string]string) error {
	path := "/_matrix/client/v3/join/" + url.PathEscape(roomID)
	err := d.call(ctx, probe.Link{}, http.MethodPost, path, nil, tokenOf[user], struct{}{}, nil)
	if statusOf(err) != http.StatusForbidden {
		return err
	}
	in := map[string]string{"user_id": d.userID(user)}
	if err := d.call(ctx, probe.Link{}, http.MethodPost, "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/invite", nil, tokenOf[creator], in, nil); err != nil {
		return fmt.Errorf("invite: %w", err)
	}
	return d.call(ctx, probe.Link{}, http.MethodPost, path, nil, tokenOf[user], struct{}{}, nil)
}

// roomOf returns the room a message goes to.
func (d *Driver) roomOf(self string, m *probe.Message) (string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if m.Group != "" {
		id, ok := d.groups[m.Group]
		return id, ok
	}
	id, ok := d.directs[pairKey(self, m.To)]
	return id, ok
}

// roomInfo returns what roomID is to imcanary.
func (d *Driver) roomInfo(roomID string) (room, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r, ok := d.rooms[roomID]
	return r, ok
}

// MirrorsOwn implements probe.Mirror: every device of a room's member
// gets every event of the room, the sender's other devices too.
func (d *Driver) MirrorsOwn() bool { return true }

// FramesUnmatched counts timeline events in rooms imcanary did not make,
// and message events that carry no text body.
func (d *Driver) FramesUnmatched() uint64 { return d.unmatched.Load() }

// ServerGaps is always zero: Matrix numbers nothing per room.
func (d *Driver) ServerGaps() (gaps, missed uint64) { return 0, 0 }

// Retries counts sends tried again after getting no answer, or a 5xx or
// 429.
func (d *Driver) Retries() uint64 { return d.retries.Load() }

// CloseIdleConnections implements probe.IdleCloser.
func (d *Driver) CloseIdleConnections() { d.pool.CloseIdle() }
