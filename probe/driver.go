// Package probe is the contract between imcanary's engine and its IM
// protocol adapters: the interfaces every adapter implements (Driver and
// Session, the Adapter its registry entry is, the optional interfaces of
// optional.go), what they exchange (Message, Delivery, Ack, Disconnect),
// the body every probe message carries, a device's catch-up position, and
// the classes of connect failures. The engine that drives adapters
// through it is package engine.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/imcanary/imcanary/internal/netpoll"
	"github.com/imcanary/imcanary/metrics"
)

// Driver is one IM protocol. Adapters live in sub-packages (probe/reference,
// …); the daemon picks one by name. A Driver is shared by every session of a
// population, so its methods must be safe for concurrent use.
type Driver interface {
	// Provision creates the users and groups of plan on the server. It must
	// be idempotent: the same plan again, after a restart of imcanary or of
	// the server, succeeds and changes nothing that is already right.
	Provision(ctx context.Context, plan Plan) error
	// Connect dials the server over dev.Link and logs user in as device
	// dev. The returned session is logged in but not yet reading: the
	// caller runs Serve.
	Connect(ctx context.Context, user string, dev Device) (Session, error)
}

// Session is one logged-in connection of one user.
//
// Serve is called once, by the goroutine that owns the session; Send, Ping
// and Close may be called from other goroutines, concurrently with Serve and
// with each other.
type Session interface {
	// Serve reads from the server until the session ends, calling h on the
	// calling goroutine for every ack, rejection and delivery, and returns
	// why the session ended. The error is always a *Disconnect.
	Serve(h Handler) error
	// Send writes m to the server. It returns once the message is written,
	// not when it is acknowledged: the ack comes later through h.OnAck with
	// m.Ref, so that sending never waits on the server (open loop).
	Send(m *Message) error
	// Ping sends a keepalive.
	Ping() error
	// Close ends the session with a clean protocol close; Serve then returns
	// a Disconnect with reason shutdown. Close is idempotent.
	Close() error
}

// Handler receives what a session reads. Its methods run on the Serve
// goroutine and must not retain the byte slices they are given: they alias
// the session's read buffer. The one exception is a protocol whose ack is
// the write itself (MQTT at QoS 0), or whose sends are requests of their
// own beside the session's reads (Matrix's HTTP sends): its OnAck and
// OnReject run on another goroutine, the one that called Send or the one
// that made the request, which a Handler must allow.
type Handler interface {
	// OnAck reports that the server accepted the message sent with ref.
	OnAck(ref uint64, a Ack)
	// OnReject reports that the server refused the message sent with ref.
	OnReject(ref uint64, reason string)
	// OnDelivery reports a message delivered to this session's user.
	OnDelivery(d *Delivery)
}

// Plan is what a population needs on the server.
type Plan struct {
	Users  []string
	Groups []Group
	// Direct lists who sends direct messages to whom. Protocols whose
	// recipients must subscribe to a conversation (Centrifugo's
	// user-limited channels) need it; others may ignore it.
	Direct []Pair
}

// Pair is one direction of a direct conversation.
type Pair struct {
	From, To string
}

// Group is a chat group and its members.
type Group struct {
	Name    string
	Members []string
}

// Message is one probe message to send: either direct (To) or to a group.
type Message struct {
	// Ref is the caller's reference for this message, echoed by OnAck.
	Ref   uint64
	To    string
	Group string
	// Body is the probe body (see AppendBody); adapters carry it verbatim.
	Body []byte
}

// Ack is the server's acceptance of a message. ServerID aliases the read
// buffer and is valid only during the OnAck call.
type Ack struct {
	ServerID []byte
	// Seq is the server's sequence number of the message within its
	// conversation, or 0 if the protocol assigns none.
	Seq uint64
}

// Delivery is a message received by a session. Its slices alias the read
// buffer and are valid only during the OnDelivery call.
type Delivery struct {
	From []byte
	// Group is true for a group message.
	Group bool
	Body  []byte
	// ServerSeq is the server's per-conversation sequence, or 0.
	ServerSeq uint64
	// Recovered is true for a message the session fetched by catch-up
	// (history, archive, recovery) rather than had pushed to it.
	Recovered bool
	// At is when the bytes that completed the frame were read off the
	// socket (Unix ns), or 0 if the adapter does not know. The time from At
	// to the ledger's record is the prober's own receive lag.
	At int64
}

// Disconnect says why a session ended. Reason is one of the
// metrics.Reason* values; Code is the WebSocket close code the server sent,
// if any.
type Disconnect struct {
	Reason string
	Code   int
	Text   string
	Err    error
}

func (d *Disconnect) Error() string {
	switch {
	case d.Code != 0 && d.Err != nil:
		return fmt.Sprintf("%s: close %d %q: %v", d.Reason, d.Code, d.Text, d.Err)
	case d.Code != 0:
		return fmt.Sprintf("%s: close %d %q", d.Reason, d.Code, d.Text)
	case d.Err != nil:
		return fmt.Sprintf("%s: %v", d.Reason, d.Err)
	}
	return d.Reason
}

func (d *Disconnect) Unwrap() error { return d.Err }

// ReasonOf returns the disconnect reason carried by err, or error if err is
// not a *Disconnect: an adapter that forgets to classify must not be able to
// hide a slow-consumer close as something milder.
func ReasonOf(err error) string {
	var d *Disconnect
	if errors.As(err, &d) && d.Reason != "" {
		return d.Reason
	}
	return metrics.ReasonError
}

// Device is one of a user's devices, as Connect is given it: a user with
// several (population.devices) holds a session on each at once, as a person
// with a phone and a laptop does.
type Device struct {
	// Index numbers the device among its user's, from 0. Protocols that
	// name a session (an XMPP resource) name it after the index, so that
	// a device that logs in again is the same device to the server.
	Index int
	// Link is how the device's connection is dialled.
	Link Link
	// Catchup is the device's place in each of its conversations, kept
	// across its sessions as a real client's local store is; nil when
	// catch-up is off (target.catch_up). A driver whose server keeps
	// history fetches through it what the device missed: at login, on a
	// gap in a conversation's sequence, and when the population asks
	// (Syncer).
	Catchup *Catchup
}

// Link says how a session's connection is dialled. The population chooses
// it per user; adapters pass it to their connection layer as it is.
type Link struct {
	// Slow dials as a slow link does: small segments and a small receive
	// window. A reader that stops then backs up into the server's own
	// queue within seconds, as on a mobile link, instead of into
	// megabytes of loopback socket buffers, and the server's slow-consumer
	// close frame can still get through to it (a slow-reader drill).
	Slow bool
	// Source is the local address the connection comes from, or the zero
	// Addr (not IsValid) for the kernel's choice. One local address holds
	// only as many connections to one server port as there are ephemeral
	// ports; a population spread over several holds that many times more.
	Source netip.Addr
	// Connect, if set, is where the connection layer records the
	// connect's phases and its TLS handshake: the population's series.
	// Provisioning connects leave it nil; they are no session's.
	Connect *metrics.ConnectSet
	// Poller, if set, is where a session that can be read without a
	// goroutine of its own is watched (Watcher): a plain-TCP WebSocket.
	// The population sets it when its reactor is on.
	Poller *netpoll.Poller
}
