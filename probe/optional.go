package probe

import (
	"context"
	"time"
)

// The optional interfaces: what a Driver, a Session or a Handler may
// implement beyond Driver and Session, each asked for with a type
// assertion by the part of the engine that needs it. An adapter
// implements those its protocol has; the engine does without the rest.
//
//	interface     on        asked for by                        when
//	Syncer        Session   the population's catch-up sweep     target.catch_up on
//	Mirror        Driver    the population (who owes what)      devices > 1
//	Regrouper     Driver    the population's membership churn   behaviours with churn
//	SendFailer    Handler   drivers whose sends are requests    a request without an answer
//	Aborter       Session   reconnect-storm drills              soak storms
//	Rekeyer       Driver    the reload (protocols.Target)       target secret rotated
//	RekeyChecker  Driver    the reload (protocols.Target)       a mapping that may refuse
//	FrameCounter  Driver    the daemon's metrics                always, if implemented
//	Retrier       Driver    the daemon's metrics                always, if implemented
//	IdleCloser    Driver    protocols.Target.Close              drivers with an HTTP pool
//	Watcher       Session   the population's device loop        population.reactor on
//	Holder        Session   a slow reader's delivery handler    a watched slow reader

// Syncer is a Session that can ask its server what its device has missed.
// Once per catch-up interval the population calls Sync on every online
// session that something may be missing from (see Population.owes), so
// that a gap at the end of a conversation, with no later push to reveal
// it, is still found and fetched before lost_after, and an open gap is
// fetched once due even when no other frame comes. Sync writes
// its request and returns; the answers come through Serve.
type Syncer interface {
	Sync() error
}

// Mirror is implemented by a Driver whose server delivers what a user sends
// from one session to the user's other online sessions too, as XMPP message
// carbons (XEP-0280) and servers that deliver to every session of a user
// do: a population of several devices per user then owes each message to
// the sender's other devices.
type Mirror interface {
	MirrorsOwn() bool
}

// Regrouper is a Driver that can change a group's members while the
// population runs: a population with membership churn needs one.
type Regrouper interface {
	// SetMembers makes g.Members the group's members on the server and
	// returns once the server confirmed it.
	SetMembers(ctx context.Context, g Group) error
}

// SendFailer is implemented by a Handler that counts a send that failed
// after Send had returned: a protocol whose sends are requests of their own
// (an HTTP PUT) learns only then that the request never got an answer. A
// driver calls OnSendFailed where a WebSocket write would have failed, and
// falls back to OnReject for a Handler without it.
type SendFailer interface {
	OnSendFailed(ref uint64, err error)
}

// Aborter is a Session that can end without a clean close: its connection
// dropped as a lost link or a load balancer restart drops it, with no
// close frame. A reconnect-storm drill (Population.Drop) needs it.
type Aborter interface {
	Abort()
}

// Rekeyer is a Driver that takes a new target secret while it runs, for a
// reload after the secret file was rotated: the logins and token refreshes
// after Rekey sign with the new secret, and sessions logged in already stay
// as they are. A driver that derives its users' passwords from the secret
// does not implement it: a new secret would lock out the users it
// registered with the old one; one that does for some configurations only
// says which by RekeyChecker.
type Rekeyer interface {
	Rekey(secret []byte)
}

// RekeyChecker is a Rekeyer whose configuration decides whether it can
// take a new secret: a mapped protocol signs with it in some mappings and
// derives passwords from it in others. RekeyRefusal returns why it cannot
// ("" when it can), which the reload's refusal gives the operator.
type RekeyChecker interface {
	Rekeyer
	RekeyRefusal() string
}

// FrameCounter is implemented by a Driver that can tell what its sessions
// read but could not use, and what the server's own numbering showed: the
// daemon exports both (imcanary_frames_ignored_total{reason="unmatched"},
// imcanary_server_sequence_gaps_total), so that a mapping that misses a
// frame kind, or a server that skips its own sequence, is visible.
type FrameCounter interface {
	// FramesUnmatched counts the frames no rule of the protocol matched.
	FramesUnmatched() uint64
	// ServerGaps counts jumps in a conversation's server sequence seen
	// by a device, and the seqs they skipped.
	ServerGaps() (gaps, missed uint64)
}

// Retrier is implemented by a Driver that sends again what got no answer,
// under a key the server makes idempotent (Matrix's transaction id): the
// daemon exports the count (imcanary_send_retries_total), so that a link
// that loses answers shows as retries instead of hiding behind sends that
// succeeded the second time.
type Retrier interface {
	// Retries counts the sends tried again.
	Retries() uint64
}

// IdleCloser is implemented by a Driver whose connections outlive its
// sessions (a pool of HTTP connections that requests share): closing the
// target closes the idle ones, instead of leaving them to the pool's idle
// timeout. Those in use close with their sessions.
type IdleCloser interface {
	CloseIdleConnections()
}

// Watcher is a Session that can be read without a goroutine of its own, in
// Serve's place: Watch returns at once and runs h's methods on a worker of
// the link's Poller as frames come (never two at once, each after the one
// before); done is called once, with what Serve would have returned, when
// the session has ended and its connection is closed, on any goroutine.
// Watch reports false, having done nothing, if the session must be served
// instead (no Poller, a transport that cannot be): the caller then calls
// Serve.
type Watcher interface {
	Watch(h Handler, done func(error)) bool
}

// Holder is a Watcher whose reading its Handler can stop for a while from
// a delivery it is handling, as a slow reader does: Hold reports true if
// the session is watched and reading stops for d once the frame is
// handled (the frames behind wait in the socket buffers, then on the
// server), with no goroutine asleep. It reports false for a session read
// by Serve, whose handler stops its reading by taking its time.
type Holder interface {
	Hold(d time.Duration) bool
}
