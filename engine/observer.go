package engine

import (
	"time"

	"github.com/imcanary/imcanary/probe"
)

// Outcome is what the ledger made of one received probe message.
type Outcome uint8

// Outcomes of a received message.
const (
	// Delivered is a first delivery (on time or late).
	Delivered Outcome = iota
	// Duplicate is a message the receiver already had.
	Duplicate
	// Ignored is anything not counted as a delivery: malformed, stale,
	// after being written off, too old to judge, a fetched copy of what
	// the device had, the echo of its own send.
	Ignored
	// Recovered is a message the device lacked and fetched by catch-up:
	// not pushed, not lost.
	Recovered
	// LatePush is the push of a message the device had already
	// recovered: the server pushed it after all, slower than the
	// catch-up grace. Its latency is the push's.
	LatePush
)

// Observer sees the individual events of one population, for the code that
// needs more than counters: a canary round checks its own messages, a soak
// run keeps exact latency percentiles and its top errors. The background
// population has none, and its hot paths pay one nil check.
//
// Methods run on the population's goroutines (read loops, senders, the
// sweeper), some with a user's lock held: they must be quick and must not
// call back into the population.
type Observer interface {
	// Login reports one connect-and-login attempt and how long it took.
	Login(user int, took time.Duration, err error)
	// Disconnect reports a session that ended, with its reason.
	Disconnect(user int, reason string, err error)
	// Ack reports the server's acceptance of the message sent with ref.
	Ack(ref uint64, group bool, latency time.Duration)
	// Unacked reports a message written off without an ack: reason is one
	// of the metrics.Send* values, code the server's refusal code if any.
	Unacked(ref uint64, reason, code string)
	// Received reports a probe message received by user. h and its
	// slices are valid only during the call. latency is measured from the
	// message's intended send time.
	Received(user int, h *probe.Header, latency time.Duration, o Outcome)
}

// Sent identifies one message sent by SendNow.
type Sent struct {
	Ref    uint64
	Sender string
	Stream string
	Seq    uint64
	Group  bool
	Fanout int
	// Recipients are the indices of the users the message is for.
	Recipients []int
	Intended   time.Time
}
