package engine

import (
	"sync"
	"time"

	"github.com/imcanary/imcanary/probe"
)

// Reach is what one prober knows of whether the target takes logins right
// now, from the outcome of every connect, login and provisioning attempt of
// the populations that share it (the background population, the canary, a
// soak run). It is safe for concurrent use; its methods are on the connect
// path, never the delivery path.
//
// The target turns unreachable once reachFailures attempts in a row have
// failed, or at the first failure while none has ever succeeded (a daemon
// started against a closed port says so at once); it is reachable again at
// the first success. One user whose logins fail among many that succeed
// does not flap it: its failures are interleaved with the others'
// successes only while they reconnect, and otherwise three in a row are
// what a target that takes nobody looks like.
type Reach struct {
	onChange func(reachable bool)
	now      func() time.Time

	mu  sync.Mutex
	st  ReachState
	won bool // an attempt has ever succeeded
}

// reachFailures is how many failed attempts in a row make the target
// unreachable once it has been reached.
const reachFailures = 3

// ReachState is a snapshot of Reach.
type ReachState struct {
	// Known is false until the first attempt has ended.
	Known bool
	// Reachable is the verdict; Since is when it last changed.
	Reachable bool
	Since     time.Time
	// Streak counts the failed attempts since the last success.
	Streak int
	// Reason is the last failure's, one of metrics.ConnectFailReasons,
	// and Err its error; LastFailure is when it happened. They are kept
	// after the target is reachable again, for the status page.
	Reason      string
	Err         string
	LastFailure time.Time
}

// NewReach returns a Reach that calls onChange (may be nil) whenever the
// verdict changes, the first one included, with its lock held: a gauge set
// there exists only once something is known, rather than reading 0
// (unreachable) before the first attempt has ended.
func NewReach(onChange func(reachable bool)) *Reach {
	return &Reach{onChange: onChange, now: time.Now}
}

// Succeeded records an attempt that logged in (or provisioned).
func (r *Reach) Succeeded() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.won = true
	r.st.Streak = 0
	r.set(true)
}

// Failed records a failed attempt, with its reason (FailureReason) and
// error.
func (r *Reach) Failed(reason string, err error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st.Streak++
	r.st.Reason, r.st.LastFailure = reason, r.now()
	r.st.Err = ""
	if err != nil {
		r.st.Err = err.Error()
	}
	if !r.won || r.st.Streak >= reachFailures {
		r.set(false)
	}
}

// set moves to reachable, stamping Since on a change. r.mu is held.
func (r *Reach) set(reachable bool) {
	if r.st.Known && r.st.Reachable == reachable {
		return
	}
	r.st.Known, r.st.Reachable, r.st.Since = true, reachable, r.now()
	if r.onChange != nil {
		r.onChange(reachable)
	}
}

// State returns the current state; the zero ReachState for a nil Reach.
func (r *Reach) State() ReachState {
	if r == nil {
		return ReachState{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

// Cause says the state's last failure in words, for the log and the status
// page: "connection refused", "the WebSocket upgrade was answered HTTP 404
// Not Found", "login refused: unauthorized: …".
func (s ReachState) Cause() string { return probe.DescribeFailure(s.Reason, s.Err) }
