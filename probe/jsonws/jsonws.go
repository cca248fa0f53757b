// Package jsonws is the probe driver for JSON-over-WebSocket protocols that
// a user describes rather than programs: the mapping under target.jsonws
// says how frames are framed, how a session logs in (ordered steps, with
// a token signed by a well-kept JWT library when the server wants one),
// how users' conversations and groups are provisioned, what a send and its
// ack look like, which frames are deliveries and where their body, sender,
// conversation and server sequence are, how history is fetched after a gap
// and how the server says goodbye.
//
// The mapping is compiled once (mapping.go): every path into one trie of
// the decoder (decode.go), every template into literal runs and
// references (template.go), every rule checked. A delivery is then decoded
// in one pass over the frame without allocating, as the hand-written
// adapters are; BenchmarkFrameToLedger measures it beside the native
// reference adapter.
package jsonws

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var (
	_ probe.Syncer       = (*session)(nil)
	_ probe.Driver       = (*Driver)(nil)
	_ probe.Mirror       = (*Driver)(nil)
	_ probe.FrameCounter = (*Driver)(nil)
)

// Options configures the driver.
type Options struct {
	URL    string
	Header http.Header
	// Secret signs JWTs (token.source jwt), keys HMAC tokens (hmac) and
	// derives passwords ({{.Password}}). Never logged.
	Secret []byte
	// Heartbeat is the sessions' keepalive interval.
	Heartbeat time.Duration
	// DialTimeout bounds connect and login together. Default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write. Default 5s.
	WriteTimeout time.Duration
	// DataDir keeps what provisioning learnt of the server (the ids it
	// gave users and groups), so that a restart reuses it; "" keeps it
	// in memory only.
	DataDir string
	// Logger receives debug samples of frames no rule matched; nil
	// discards.
	Logger *slog.Logger
	// Trace, if set, is told every frame written and read and every rule
	// that matched (imcanary jsonws try). Secrets are redacted first.
	Trace func(Event)
}

// Event is one thing a session did, for a trace.
type Event struct {
	User string
	// What is "send", "read", "match", "step" or "error".
	What   string
	Key    string // the mapping key involved
	Detail string
}

// Driver connects users through a mapping.
type Driver struct {
	opts Options
	m    *mapping
	conn *wsconn.Settings
	log  *slog.Logger
	// key signs the tokens (token.source jwt, hmac): opts.Secret, until
	// Rekey replaces it. Passwords keep deriving from opts.Secret.
	key *probe.Key
	// tokens are token.file's, by user.
	tokens map[string]string
	dir    *directory

	peers  probe.Memberships[string]
	groups probe.Memberships[string]

	// names caches user names as the server knows them (user_name).
	names sync.Map

	unmatched, gaps, missed atomic.Uint64
	// sample limits the debug log of unmatched frames.
	sample *rate.Limiter
}

// maxSeqConvs bounds a session's lastSeq: a server that invents
// conversations gets no gap count for the rest.
const maxSeqConvs = 4096

// New compiles cfg and returns a driver for it.
func New(cfg Config, o Options) (*Driver, error) {
	if cfg.Empty() {
		return nil, fmt.Errorf("target.jsonws: %w", errNoMapping)
	}
	m, errs := compile(cfg)
	if len(errs) > 0 {
		return nil, joinProblems(errs)
	}
	if o.URL == "" {
		return nil, errors.New("jsonws: no target url")
	}
	d := &Driver{opts: o, m: m, log: o.Logger, key: probe.NewKey(o.Secret), sample: rate.NewLimiter(rate.Every(10*time.Second), 3)}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	switch m.token.source {
	case "jwt", "hmac":
		if len(o.Secret) == 0 {
			return nil, fmt.Errorf("target.jsonws.token.source %s needs the target secret: set target.secret_file or %s", m.token.source, config.SecretEnv)
		}
	case "file":
		var err error
		if d.tokens, err = readTokens(m.token.file); err != nil {
			return nil, fmt.Errorf("target.jsonws.token.file: %w", err)
		}
	}
	if (m.password || m.token.source == "hmac") && len(o.Secret) == 0 {
		return nil, fmt.Errorf("target.jsonws: {{.Password}} is derived from the target secret: set target.secret_file or %s", config.SecretEnv)
	}
	var err error
	if d.dir, err = openDirectory(o.DataDir); err != nil {
		return nil, err
	}
	d.conn = wsconn.NewSettings(wsconn.Settings{
		URL: o.URL, Header: o.Header, Subprotocol: m.subprotocol, MaxFrame: m.maxFrame,
		DialTimeout: o.DialTimeout, WriteTimeout: o.WriteTimeout, Heartbeat: o.Heartbeat,
		CloseGrace: time.Second, TextOnly: true,
	})
	return d, nil
}

// Validate compiles the mapping and returns its problems, naming each key
// within the section.
func (c Config) Validate() []*config.ValidationError {
	if c.Empty() {
		return nil
	}
	_, errs := compile(c)
	return errs
}

func joinProblems(errs []*config.ValidationError) error {
	out := make([]error, len(errs))
	for i, e := range errs {
		e.Key = "target.jsonws." + e.Key
		out[i] = e
	}
	return errors.Join(out...)
}

// readTokens reads a file of "USER TOKEN" lines.
func readTokens(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, tok, ok := strings.Cut(line, " ")
		if !ok || strings.TrimSpace(tok) == "" {
			// The line is not quoted: it holds a token.
			return nil, fmt.Errorf("line %d: want USER TOKEN", i+1)
		}
		out[user] = strings.TrimSpace(tok)
	}
	return out, nil
}

func (m *mapping) usesPassword() bool {
	uses := false
	m.eachTemplate(func(t *template) {
		if t.uses(varPassword) {
			uses = true
		}
	})
	return uses
}

// eachTemplate calls fn for every template of the mapping.
func (m *mapping) eachTemplate(fn func(*template)) {
	var steps func([]*step)
	steps = func(list []*step) {
		for _, s := range list {
			if s == nil {
				continue
			}
			if s.send != nil {
				fn(s.send)
			}
			if s.resume != nil {
				fn(s.resume)
			}
			steps(s.otherwise)
		}
	}
	steps(m.login)
	steps([]*step{m.subDirect, m.subGroup, m.create, m.join})
	for _, t := range []*template{m.sendDirect, m.sendGroup, m.fetch, m.ping, m.newest.send, m.directConv, m.groupConv} {
		if t != nil {
			fn(t)
		}
	}
	for _, a := range m.answers {
		if a.send != nil {
			fn(a.send)
		}
	}
	for _, c := range m.token.claims {
		if c.tmpl != nil {
			fn(c.tmpl)
		}
	}
}

// MirrorsOwn implements probe.Mirror, as the mapping says.
func (d *Driver) MirrorsOwn() bool { return d.m.mirrorsOwn }

// FramesUnmatched implements probe.FrameCounter: frames that no rule of the
// mapping matched.
func (d *Driver) FramesUnmatched() uint64 { return d.unmatched.Load() }

// ServerGaps implements probe.FrameCounter: jumps in the server's own
// sequence numbers within a session, with the seqs they skipped.
func (d *Driver) ServerGaps() (gaps, missed uint64) { return d.gaps.Load(), d.missed.Load() }

// password derives user's password from the secret: stable across
// restarts, different per user, and not the secret. It is the secret the
// driver started with, whatever Rekey did: the users were registered with
// it.
func (d *Driver) password(user string) string {
	h := hmac.New(sha256.New, d.opts.Secret)
	h.Write([]byte("imcanary jsonws password\x00"))
	h.Write([]byte(user))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// token returns user's .Token.
func (d *Driver) token(user string, e *env) (string, error) {
	switch d.m.token.source {
	case "hmac":
		h := hmac.New(sha256.New, d.key.Bytes())
		h.Write([]byte(user))
		return hex.EncodeToString(h.Sum(nil)), nil
	case "file":
		t, ok := d.tokens[user]
		if !ok {
			return "", fmt.Errorf("target.jsonws.token.file has no token for user %s", user)
		}
		return t, nil
	case "jwt":
		now := time.Now()
		claims := jwt.MapClaims{"iat": now.Unix(), "exp": now.Add(d.m.token.ttl).Unix()}
		for k, c := range d.m.token.claims {
			if c.tmpl == nil {
				claims[k] = c.v
				continue
			}
			b, err := c.tmpl.render(nil, e)
			if err != nil {
				return "", fmt.Errorf("token.claims.%s: %w", k, err)
			}
			claims[k] = string(b)
		}
		t := jwt.NewWithClaims(jwt.GetSigningMethod(d.m.token.algorithm), claims)
		s, err := t.SignedString(d.key.Bytes())
		if err != nil {
			return "", fmt.Errorf("sign token: %w", err)
		}
		return s, nil
	}
	return "", nil
}

// env returns the rendering environment of a session of user on device.
func (d *Driver) env(user string, device int) (*env, error) {
	e := &env{user: user, device: device, attr: d.dir.attr}
	if d.m.names.replace != nil || d.m.names.max > 0 {
		e.name = d.serverName
	}
	if d.m.password {
		e.password = d.password(user)
	}
	tok, err := d.token(user, e)
	if err != nil {
		return nil, err
	}
	e.token = tok
	return e, nil
}

// Provision implements probe.Driver: it notes each user's conversations,
// logs in each user whose attributes other users' templates need (a
// server-assigned user id) and does not know yet, and creates the groups
// not created before, by their first member, then joins the others. What
// it learns is kept in data_dir: the same plan again changes nothing.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	peers := map[string][]string{}
	for _, p := range plan.Direct {
		if !slices.Contains(peers[p.From], p.To) {
			peers[p.From] = append(peers[p.From], p.To)
		}
		if !slices.Contains(peers[p.To], p.From) {
			peers[p.To] = append(peers[p.To], p.From)
		}
	}
	groups := map[string][]string{}
	for _, g := range plan.Groups {
		for _, u := range g.Members {
			groups[u] = append(groups[u], g.Name)
		}
	}
	d.peers.Replace(plan.Users, peers)
	d.groups.Replace(plan.Users, groups)

	need := d.m.sharedAttrs()
	var users []string
	for _, u := range plan.Users {
		if !d.dir.has(false, u, need) {
			users = append(users, u)
		}
	}
	err := parallel(ctx, users, func(u string) error {
		s, err := d.open(ctx, u, 0, probe.Link{}, false, nil)
		if err != nil {
			return fmt.Errorf("provision user %s: %w", u, err)
		}
		s.conn.Abort()
		return nil
	})
	if err != nil {
		return err
	}
	if d.m.create != nil {
		var todo []probe.Group
		for _, g := range plan.Groups {
			if len(g.Members) > 0 && (len(d.m.groupAttrs) == 0 || !d.dir.has(true, g.Name, slices.Collect(maps.Keys(d.m.groupAttrs)))) {
				todo = append(todo, g)
			}
		}
		err = parallel(ctx, todo, func(g probe.Group) error { return d.provisionGroup(ctx, g) })
		if err != nil {
			return err
		}
	}
	return d.dir.save(need)
}

// provisionGroup creates g by its first member and joins the others.
func (d *Driver) provisionGroup(ctx context.Context, g probe.Group) error {
	s, err := d.open(ctx, g.Members[0], 0, probe.Link{}, false, nil)
	if err != nil {
		return fmt.Errorf("provision group %s: %w", g.Name, err)
	}
	e := *s.env
	e.group, e.members, e.capGroup = g.Name, g.Members, g.Name
	err = s.runSteps([]*step{d.m.create}, []*env{&e}, 1, d.conn.DialTimeout)
	s.conn.Abort()
	if err != nil {
		return fmt.Errorf("provision group %s: %w", g.Name, err)
	}
	if d.m.join == nil {
		return nil
	}
	for _, u := range g.Members[1:] {
		s, err := d.open(ctx, u, 0, probe.Link{}, false, nil)
		if err != nil {
			return fmt.Errorf("provision group %s: join %s: %w", g.Name, u, err)
		}
		e := *s.env
		e.group = g.Name
		err = s.runSteps([]*step{d.m.join}, []*env{&e}, 1, d.conn.DialTimeout)
		s.conn.Abort()
		if err != nil {
			return fmt.Errorf("provision group %s: join %s: %w", g.Name, u, err)
		}
	}
	return nil
}

// parallel runs fn for each item, a few at a time, and returns the first
// error.
func parallel[T any](ctx context.Context, items []T, fn func(T) error) error {
	const width = 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  atomic.Int64
	)
	for range min(width, len(items)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(items) || ctx.Err() != nil {
					return
				}
				if err := fn(items[i]); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// sharedAttrs are the user attributes that templates read of other users
// (.To.x, .Peer.x): what provisioning must learn before anyone connects.
func (m *mapping) sharedAttrs() []string {
	set := map[string]bool{}
	m.eachTemplate(func(t *template) {
		for _, p := range t.parts {
			if p.act == nil {
				continue
			}
			for _, a := range p.act.args {
				if a.attr != "" && (a.v == varTo || a.v == varPeer) {
					set[a.attr] = true
				}
			}
		}
	})
	return slices.Sorted(maps.Keys(set))
}

// Connect implements probe.Driver: it logs user in as device dev, runs the
// subscribe steps of the user's conversations, and returns once each is
// confirmed.
func (d *Driver) Connect(ctx context.Context, user string, dev probe.Device) (probe.Session, error) {
	s, err := d.open(ctx, user, dev.Index, dev.Link, true, dev.Catchup)
	if err != nil {
		return nil, err
	}
	if s.cu != nil {
		if s.convs, err = d.convsOf(s); err != nil {
			s.conn.Abort()
			return nil, fmt.Errorf("catch-up: %w", err)
		}
		// Where the device stands is asked at once: what it missed
		// while away is fetched before the first sync is due.
		if err := s.Sync(); err != nil {
			s.conn.Abort()
			return nil, fmt.Errorf("catch-up: %w", err)
		}
	}
	return s, nil
}

// directory is what provisioning learnt of the server: attributes of users
// and groups (the ids the server gave them), kept in data_dir.
type directory struct {
	path string
	mu   sync.RWMutex
	// users and groups map a name to its attributes.
	Users  map[string]map[string]string `json:"users"`
	Groups map[string]map[string]string `json:"groups"`
}

// directoryFile is the directory's file under data_dir.
const directoryFile = "jsonws-directory.json"

func openDirectory(dataDir string) (*directory, error) {
	d := &directory{Users: map[string]map[string]string{}, Groups: map[string]map[string]string{}}
	if dataDir == "" {
		return d, nil
	}
	d.path = filepath.Join(dataDir, directoryFile)
	b, err := os.ReadFile(d.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return d, nil
	case err != nil:
		return nil, fmt.Errorf("jsonws directory: %w", err)
	}
	if err := json.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("jsonws directory %s: %w (delete it to provision again)", d.path, err)
	}
	if d.Users == nil {
		d.Users = map[string]map[string]string{}
	}
	if d.Groups == nil {
		d.Groups = map[string]map[string]string{}
	}
	return d, nil
}

func (d *directory) table(group bool) map[string]map[string]string {
	if group {
		return d.Groups
	}
	return d.Users
}

// attr returns an attribute of a user or group.
func (d *directory) attr(group bool, who, name string) (string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	v, ok := d.table(group)[who][name]
	return v, ok
}

// has reports whether who has every attribute of names.
func (d *directory) has(group bool, who string, names []string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, n := range names {
		if _, ok := d.table(group)[who][n]; !ok {
			return false
		}
	}
	return true
}

// set keeps an attribute of a user or group.
func (d *directory) set(group bool, who, name, v string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.table(group)
	if t[who] == nil {
		t[who] = map[string]string{}
	}
	t[who][name] = v
}

// save writes the directory to its file, atomically: every group
// attribute, and of the users' only those named in users, what other
// users' templates read of them (a server-assigned id). What else a step
// captured of a user (a session token) stays in memory.
func (d *directory) save(users []string) error {
	if d.path == "" {
		return nil
	}
	d.mu.RLock()
	kept := directory{Users: map[string]map[string]string{}, Groups: d.Groups}
	for u, attrs := range d.Users {
		for _, n := range users {
			if v, ok := attrs[n]; ok {
				if kept.Users[u] == nil {
					kept.Users[u] = map[string]string{}
				}
				kept.Users[u][n] = v
			}
		}
	}
	b, err := json.MarshalIndent(&kept, "", " ")
	d.mu.RUnlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
		return fmt.Errorf("jsonws directory: %w", err)
	}
	tmp := d.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("jsonws directory: %w", err)
	}
	return os.Rename(tmp, d.path)
}

// convsOf returns the names of the conversations of s's user, as the
// server names them (catch_up.direct_conv, group_conv).
func (d *Driver) convsOf(s *session) ([]string, error) {
	var out []string
	add := func(t *template, e *env) error {
		b, err := t.render(nil, e)
		if err != nil {
			return err
		}
		out = append(out, string(b))
		return nil
	}
	if t := d.m.directConv; t != nil {
		for _, p := range d.peers.Of(s.user) {
			e := *s.env
			e.peer = p
			if err := add(t, &e); err != nil {
				return nil, fmt.Errorf("catch_up.direct_conv: %w", err)
			}
		}
	}
	s.nDirect = len(out)
	if t := d.m.groupConv; t != nil {
		for _, g := range d.groups.Of(s.user) {
			e := *s.env
			e.group = g
			if err := add(t, &e); err != nil {
				return nil, fmt.Errorf("catch_up.group_conv: %w", err)
			}
		}
	}
	return out, nil
}

// serverName returns user's name as the server knows it, made once.
func (d *Driver) serverName(user string) string {
	if v, ok := d.names.Load(user); ok {
		return v.(string)
	}
	n := d.m.names.apply(user)
	d.names.Store(user, n)
	return n
}
