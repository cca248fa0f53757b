// Package mqtt is the probe driver for MQTT 3.1.1 and 5 over WebSocket
// (subprotocol "mqtt", binary frames), the transport of many in-house chat
// systems, tested against mosquitto and mochi-mqtt.
//
// Topics: a direct message from A to B is published to PREFIX/dm/B/A, and
// each user subscribes to PREFIX/dm/USER/+; a group message to
// PREFIX/g/GROUP, which every member subscribes to. MQTT has no users or
// groups to create, so provisioning only remembers who subscribes to what.
//
// With qos 1 each publish is acknowledged by the broker's PUBACK: "accepted
// by the broker". The subscriber's PUBACK goes out once the delivery is
// recorded, so a reader that stops reading holds the broker's in-flight
// window open and its messages queue at the broker, as a real client's do.
// With qos 0 nothing is acknowledged; a message counts as accepted once
// written to the socket, so ack latency then measures imcanary's own write
// and says nothing of the broker.
//
// MQTT numbers nothing per topic (packet ids are per session and reused):
// imcanary's own sequence in the body is the only truth. Catch-up is the
// persistent session: with target.catch_up on, each device connects with
// clean_session=0 under a client id of its own, and what the broker queued
// for it while it was away arrives after the CONNACK that says the session
// was present; those messages, and the broker's resends (DUP), count as
// recovered. With catch-up off the session is clean, and what was sent
// while a device was away is lost to it. MQTT 5 sessions carry a session
// expiry (without one a session ends with its connection), subscribe to
// their groups with No Local (a session is not sent its own publishes), and
// a PUBACK with a reason code of 0x80 or more is a rejection.
package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/wsconn"
)

var (
	_ probe.Driver       = (*Driver)(nil)
	_ probe.FrameCounter = (*Driver)(nil)
)

// Options are what the driver needs of the target beside its section.
type Options struct {
	// URL is the broker's WebSocket endpoint, ws://127.0.0.1:9001/mqtt.
	URL    string
	Header http.Header
	// Password goes in CONNECT when set (the target secret); never
	// logged.
	Password []byte
	// Heartbeat is the PINGREQ interval; CONNECT's keep alive is twice
	// it, so that the broker never drops a session that pings on time.
	Heartbeat time.Duration
	// DialTimeout bounds dial, CONNECT and SUBSCRIBE together. Default 10s.
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Driver connects users to an MQTT broker.
type Driver struct {
	cfg  Config
	opts Options
	log  *slog.Logger
	conn *wsconn.Settings
	qos  byte
	c    codec
	// dmPrefix and gPrefix are "PREFIX/dm/" and "PREFIX/g/".
	dmPrefix, gPrefix string
	keepalive         uint16
	// topics maps a user to the topic filters it subscribes to.
	topics probe.Memberships[string]
	// password goes in each CONNECT: opts.Password, until Rekey replaces
	// it.
	password *probe.Key

	unmatched atomic.Uint64
}

// New returns a driver for the broker at o.URL.
func New(c Config, o Options) (*Driver, error) {
	if o.URL == "" {
		return nil, errors.New("mqtt: no url")
	}
	if errs := c.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("mqtt: %s: %w", errs[0].Key, errs[0].Err)
	}
	if err := passwordFits(c, len(o.Password) > 0); err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = wsconn.DefaultHeartbeat
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var cd codec = codec311{}
	if c.Version == "5" {
		cd = codec5{}
	}
	ka := min((2*o.Heartbeat+time.Second-1)/time.Second, 65535)
	return &Driver{
		cfg: c, opts: o, log: log, qos: byte(c.QoS), c: cd,
		dmPrefix: c.TopicPrefix + "/dm/", gPrefix: c.TopicPrefix + "/g/",
		keepalive: uint16(ka), password: probe.NewKey(o.Password),
		conn: wsconn.NewSettings(wsconn.Settings{
			URL: o.URL, Header: o.Header, Subprotocol: "mqtt", Binary: true,
			// A WebSocket frame holds one packet or several; a packet
			// may also span frames (split), so a frame is bounded by
			// the largest packet.
			MaxFrame:    int64(c.MaxPacket),
			DialTimeout: o.DialTimeout, Heartbeat: o.Heartbeat,
			CloseGrace: time.Second, Farewell: disconnect,
		}),
	}, nil
}

// Provision remembers which topics each user of plan subscribes to: its
// own direct inbox and its groups'. A broker has nothing to create.
func (d *Driver) Provision(_ context.Context, plan probe.Plan) error {
	of := make(map[string][]string, len(plan.Users))
	for _, u := range plan.Users {
		if err := topicLevels(u); err != nil || strings.Contains(u, "/") {
			if err == nil {
				err = errors.New("must not contain '/'")
			}
			return fmt.Errorf("mqtt: user %q: %w", u, err)
		}
		of[u] = append(of[u], d.dmPrefix+u+"/+")
	}
	for _, g := range plan.Groups {
		if err := topicLevels(g.Name); err != nil {
			return fmt.Errorf("mqtt: group %q: %w", g.Name, err)
		}
		for _, m := range g.Members {
			of[m] = append(of[m], d.gPrefix+g.Name)
		}
	}
	d.topics.Replace(plan.Users, of)
	return nil
}

// clientID names a device to the broker: its persistent session is found
// by it, and two devices of one user must not take each other's over.
func (d *Driver) clientID(user string, dev int) string {
	return d.cfg.ClientIDPrefix + user + "-" + strconv.Itoa(dev)
}

// noLocal says which of topics are groups': an MQTT 5 session asks not to
// be sent its own publishes there (3.1.1 ignores it, and the ledger
// counts them ignored as own).
func (d *Driver) noLocal(topics []string) []bool {
	nl := make([]bool, len(topics))
	for i, t := range topics {
		nl[i] = strings.HasPrefix(t, d.gPrefix)
	}
	return nl
}

// FramesUnmatched counts publishes on topics outside the scheme, and
// acknowledgements of packet ids no session had in flight.
func (d *Driver) FramesUnmatched() uint64 { return d.unmatched.Load() }

// ServerGaps is always zero: MQTT numbers nothing per topic.
func (d *Driver) ServerGaps() (gaps, missed uint64) { return 0, 0 }
