// Package openim is the probe driver for OpenIM (open-im-server v3.8): users,
// tokens and groups through its REST API, messages through its message
// gateway's WebSocket, every payload encoded with OpenIM's own protobuf
// types (github.com/openimsdk/protocol at the version v3.8.3 requires).
//
// A device is a connection on one OpenIM platform (Config.Platforms):
// OpenIM's default login policy lets a user be online on several platforms
// at once and kicks an older connection on the same one (2002), which a
// session reports as conflict. A send (1003) is acked by the reply with
// its msgIncr; the server then numbers the message in its conversation
// (si_A_B for a direct chat, the two ids sorted; sg_GROUP for a group),
// contiguously from 1, and pushes it (2001) to every connection of its
// recipients, the sender's own included. That seq is the server's own
// account of completeness: a device that sees one skipped fetches the range
// (1002, pull by seq ranges), and at login and every sync asks the newest
// seq of each of its conversations (1001), as OpenIM's SDK does.
package openim

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
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
	_ probe.Mirror       = (*Driver)(nil)
	_ probe.FrameCounter = (*Driver)(nil)
	_ probe.Rekeyer      = (*Driver)(nil)
)

// Options configures the driver.
type Options struct {
	// URL is the message gateway's WebSocket, ws://HOST:10001.
	URL string
	// Header goes with every WebSocket upgrade and REST call: imcanary's
	// User-Agent and the configured target.headers. Not modified.
	Header http.Header
	// Secret is the API secret (share.yml secret), which gets the admin
	// token. It is never logged.
	Secret []byte
	// Heartbeat is each session's keepalive interval, a text ping. At
	// most maxHeartbeat: the gateway drops a connection that sends
	// nothing for 30 s.
	Heartbeat time.Duration
	// DialTimeout bounds the dial, the upgrade and the login together.
	DialTimeout time.Duration
	// WriteTimeout bounds one write.
	WriteTimeout time.Duration
	// Logger receives debug logs; nil discards.
	Logger *slog.Logger
}

// maxHeartbeat is the longest keepalive interval OpenIM allows a client
// on a platform other than Web: its read deadline is 30 s (pongWait,
// internal/msggateway/constant.go), reset by any frame.
const maxHeartbeat = 25 * time.Second

// MaxClientFrame is the largest frame the gateway reads (maxMessageSize in
// internal/msggateway/constant.go); it closes the connection on a larger
// one, so a send that would make one is refused before it is written.
const MaxClientFrame = 51200

// Driver connects users to an OpenIM server.
type Driver struct {
	opts Options
	cfg  Config
	log  *slog.Logger
	ws   *wsconn.Settings
	pool *longpoll.Pool
	key  *probe.Key
	// nonce makes this process's clientMsgIDs and operationIDs its own.
	nonce string

	// tmu guards the tokens: the admin's and each (user, platform)'s.
	tmu      sync.Mutex
	admin    string
	adminExp time.Time
	tokens   map[tokenKey]userTok

	// mu guards state, bases and early.
	mu    sync.Mutex
	state map[devKey]*devState
	// bases holds, per conversation, the seq below which this process
	// owes nothing: what it was when a session of the process first
	// learnt of the conversation. A device with no place in it yet
	// starts there, so that one logging in late fetches what the
	// process's other users sent it meanwhile, as OpenIM's SDK on a
	// fresh install syncs its conversations.
	bases map[string]uint64
	// early counts, per conversation with no base yet, the messages the
	// process sent into it: the base, once a device learns of the
	// conversation, starts that many seqs further down. A message sent
	// to a user before its device's first login is otherwise below the
	// newest seq that login sees, taken for history, and never fetched.
	early map[string]uint64

	msgIDs                             atomic.Uint64
	unmatched, gaps, missed, recovered atomic.Uint64
	kicked, oversize, newest           atomic.Uint64
	warnedOversize                     atomic.Bool
}

// devKey names one device of one user.
type devKey struct {
	user  string
	index int
}

// devState is what one device's sessions leave the next: the highest seq
// it saw in each conversation, for the count of the server's own gaps. Its
// catch-up place is its probe.Catchup's.
type devState struct {
	mu   sync.Mutex
	seqs map[string]uint64
	// placed holds the conversations the device's Catchup has a place
	// in (see base).
	placed map[string]bool
	// atLogin holds the conversations the device's first GetNewestSeq
	// answer named, nil until it came: one the device learns of later
	// began after its first login, and all of it is owed from seq 1.
	atLogin map[string]bool
}

// maxConvs bounds the conversations a device tracks for the gap count: a
// server that invents conversations gets no count for the rest.
const maxConvs = 4096

// New returns a driver for the gateway at o.URL and the API at c.APIURL;
// a zero field of c but APIURL is its default's.
func New(c Config, o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("openim: no gateway url (target.url, ws://HOST:10001)")
	}
	if u, err := url.Parse(o.URL); err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		return nil, fmt.Errorf("openim: gateway url %q: must be ws:// or wss://", probe.RedactURL(o.URL))
	}
	if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openim: api url %q: must be http:// or https://", probe.RedactURL(c.APIURL))
	}
	c.APIURL = strings.TrimRight(c.APIURL, "/")
	if len(o.Secret) == 0 {
		return nil, errors.New("openim: no API secret")
	}
	def := DefaultConfig()
	c.AdminUserID = cmp.Or(c.AdminUserID, def.AdminUserID)
	if len(c.Platforms) == 0 {
		c.Platforms = def.Platforms
	}
	c.MaxFrame = cmp.Or(c.MaxFrame, def.MaxFrame)
	c.MaxConnections = cmp.Or(c.MaxConnections, def.MaxConnections)
	if o.Heartbeat <= 0 {
		o.Heartbeat = 20 * time.Second
	}
	if o.Heartbeat > maxHeartbeat {
		return nil, fmt.Errorf("openim: heartbeat %v: OpenIM's gateway drops a connection that sends nothing for 30 s; set target.heartbeat to %v or less", o.Heartbeat, maxHeartbeat)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var n [6]byte
	_, _ = rand.Read(n[:])
	return &Driver{
		opts:  o,
		cfg:   c,
		log:   log,
		key:   probe.NewKey(o.Secret),
		nonce: hex.EncodeToString(n[:]),
		ws: wsconn.NewSettings(wsconn.Settings{
			URL: o.URL, Header: o.Header, MaxFrame: int64(c.MaxFrame),
			DialTimeout: o.DialTimeout, WriteTimeout: o.WriteTimeout, Heartbeat: o.Heartbeat,
			CloseGrace: time.Second, Binary: true,
		}),
		pool:   longpoll.NewPool(longpoll.Settings{Header: o.Header, MaxConns: c.MaxConnections, MaxBody: maxAnswer, DialTimeout: o.DialTimeout}),
		tokens: map[tokenKey]userTok{},
		state:  map[devKey]*devState{},
		bases:  map[string]uint64{},
		early:  map[string]uint64{},
	}, nil
}

// Rekey implements probe.Rekeyer: the admin token is got again with the
// new secret at the next call that needs it; user tokens got already stay
// valid, as OpenIM keeps them whatever its secret.
func (d *Driver) Rekey(secret []byte) {
	d.key.Set(secret)
	d.dropAdmin()
}

// MirrorsOwn implements probe.Mirror: OpenIM pushes a message to every
// connection of its sender too (sender sync, on by default), so what one
// device sends reaches the user's others.
func (d *Driver) MirrorsOwn() bool { return true }

// FramesUnmatched implements probe.FrameCounter: frames of a kind the
// session does not read (a reply to nothing it asked, a push of no
// message it can place).
func (d *Driver) FramesUnmatched() uint64 { return d.unmatched.Load() }

// ServerGaps implements probe.FrameCounter: jumps in a conversation's seq
// seen by a device, and the seqs they skipped.
func (d *Driver) ServerGaps() (gaps, missed uint64) { return d.gaps.Load(), d.missed.Load() }

// Stats are the driver's counts of what OpenIM did, for tests and logs.
type Stats struct {
	// Recovered counts messages got by a pull (1002).
	Recovered uint64
	// Kicked counts sessions OpenIM kicked (2002).
	Kicked uint64
	// Oversize counts sends refused before writing: their frame would
	// pass the gateway's 51,200 bytes.
	Oversize uint64
	// Newest counts GetNewestSeq (1001) answers read.
	Newest uint64
}

// Stats returns the driver's counts so far.
func (d *Driver) Stats() Stats {
	return Stats{Recovered: d.recovered.Load(), Kicked: d.kicked.Load(), Oversize: d.oversize.Load(), Newest: d.newest.Load()}
}

// Platform returns the platform id of device index i, or an error when
// there are more devices than platforms configured.
func (d *Driver) Platform(i int) (int32, error) {
	if i < 0 || i >= len(d.cfg.Platforms) {
		return 0, fmt.Errorf("openim: device %d: only %d platforms configured (target.openim.platforms), one per device", i, len(d.cfg.Platforms))
	}
	return int32(d.cfg.Platforms[i]), nil
}

// Connect implements probe.Driver: it gets the user's token for the
// device's platform and logs in to the gateway. A token the gateway
// refuses (expired, or kicked by a login elsewhere) is got again once.
func (d *Driver) Connect(ctx context.Context, userID string, dev probe.Device) (probe.Session, error) {
	platform, err := d.Platform(dev.Index)
	if err != nil {
		return nil, err
	}
	k := devKey{userID, dev.Index}
	d.mu.Lock()
	st := d.state[k]
	if st == nil {
		st = &devState{seqs: map[string]uint64{}, placed: map[string]bool{}}
		d.state[k] = st
	}
	d.mu.Unlock()
	for try := 0; ; try++ {
		tok, err := d.userToken(ctx, userID, platform, try > 0)
		if err != nil {
			return nil, err
		}
		s, err := d.connect(ctx, userID, platform, tok, st, dev)
		if err == nil {
			return s, nil
		}
		if le, ok := errors.AsType[*loginError](err); ok && isTokenError(le.Code) {
			d.dropToken(userID, platform)
			if try == 0 {
				continue
			}
			return nil, probe.Unauthorized(err)
		}
		return nil, err
	}
}

// base returns conv's base (see Driver.bases), lowered to at if at is
// lower: the lowest place any device of the process had when it first
// learnt of conv. Devices learn of a new conversation at once, from
// pushes raced between them; the lowest is the one nearest its start.
// The first base is at less the messages the process sent into conv until
// then (Driver.early).
func (d *Driver) base(conv string, at uint64) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.bases[conv]
	switch {
	case !ok && len(d.bases) >= maxBases:
		return at
	case !ok:
		n := d.early[conv]
		delete(d.early, conv)
		b = at - min(at, n)
		d.bases[conv] = b
	case at < b:
		b = at
		d.bases[conv] = b
	}
	return b
}

// sent notes a message the process sent into conv: one more to fetch from
// below where a device first learns of the conversation, if none has yet
// (see Driver.early).
func (d *Driver) sent(conv string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.bases[conv]; ok {
		return
	}
	if _, ok := d.early[conv]; ok || len(d.early) < maxBases {
		d.early[conv]++
	}
}

// maxBases bounds Driver.bases: a plan's conversations, with room.
const maxBases = 1 << 20

// clientMsgID returns a clientMsgID unique to this process.
func (d *Driver) clientMsgID() string {
	return "imc-" + d.nonce + "-" + fmt.Sprint(d.msgIDs.Add(1))
}

// gatewayURL is the login URL of user on platform: the parameters
// ws_server.go reads. sdkType=js makes the envelope JSON; isMsgResp=true
// makes the first frame say whether the login was accepted.
func (d *Driver) gatewayURL(userID string, platform int32, token string) string {
	q := url.Values{}
	q.Set("sendID", userID)
	q.Set("token", token)
	q.Set("platformID", fmt.Sprint(platform))
	q.Set("operationID", d.operationID())
	q.Set("sdkType", "js")
	q.Set("isMsgResp", "true")
	q.Set("isBackground", "false")
	sep := "?"
	if strings.Contains(d.opts.URL, "?") {
		sep = "&"
	}
	return d.opts.URL + sep + q.Encode()
}
