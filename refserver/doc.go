// Package refserver is imcanary's reference IM server: a small but
// complete instant-messaging server over WebSocket with fault injection, so
// that imcanary runs out of the box and its detectors can be proven against
// faults of a known size.
//
// # Wire protocol
//
// The endpoint is /ws. Every WebSocket text frame carries exactly one JSON
// object with a "type" field. Client frames carry an "id" chosen by the
// client; the server echoes it in the reply so the client can correlate.
//
// Client to server:
//
//	{"type":"login","id":"1","user":"u1","token":"T"}
//	{"type":"group","id":"2","group":"g1","members":["u1","u2","u3"]}
//	{"type":"send","id":"3","to":"u2","body":"…"}     direct message
//	{"type":"send","id":"4","group":"g1","body":"…"}  group message
//	{"type":"ping","id":"5"}
//
// Server to client:
//
//	{"type":"login_ok","id":"1"}
//	{"type":"ok","id":"2"}
//	{"type":"ack","id":"3","msg_id":"42","conv":"d:u1:u2","seq":7}
//	{"type":"msg","from":"u1","to":"u2","conv":"d:u1:u2","msg_id":"42","seq":7,"body":"…"}
//	{"type":"msg","from":"u1","group":"g1","conv":"g:g1","msg_id":"43","seq":9,"body":"…"}
//	{"type":"pong","id":"5"}
//	{"type":"error","id":"3","code":"not_member","message":"…"}
//
// Login must be the first frame. A token is the lowercase hex HMAC-SHA256 of
// the user name keyed with the server's secret; a server started without a
// secret accepts any non-empty token (and says so in its log). Users exist
// once they log in; groups are created or replaced by a "group" frame
// (idempotent: the same members again is a no-op). A second login of the same
// user replaces the first session, which is closed with CloseConflict.
//
// A send carries exactly one of "to" and "group", and its body is a JSON
// string, relayed byte for byte. Sending to a group one is not a member of
// (or that does not exist) is answered with an error of code "not_member";
// the connection stays open. A recipient need not exist: a message to a
// user who never logged in waits in that user's offline queue. Past the
// server's fixed limits on conversations and groups, a send or group frame
// is answered with an error of code "limit".
//
// The ack is sent once the message is accepted: it carries a server message
// id and the message's sequence number within its conversation ("d:a:b" with
// the two users sorted, or "g:NAME"), contiguous from 1. A group message is
// delivered to every member except the sender. Deliveries to a user who is
// offline are kept in a bounded per-user offline queue and delivered, in
// order, at the user's next login; beyond the bound the oldest are dropped
// and counted. All offline queues together are also capped in bytes (256 MiB),
// since recipients need not exist; a delivery past that cap is dropped and
// counted the same way. A delivery to a session that is being closed goes to
// the offline queue, as if the user were already offline.
//
// Each connection has a bounded send queue. A reader too slow to drain it is
// disconnected with CloseSlowConsumer, never buffered without limit.
// WebSocket pings are answered with pongs; a connection silent for longer than
// the idle timeout is closed.
//
// Every close is bounded by one second: the server finishes the frame it is
// writing, sends the close frame, and waits for the peer's echo until the
// second is up, then closes the socket. Frames still in the send queue are
// discarded.
//
// # Close codes
//
//	1001 going away      the server is shutting down
//	1008 policy          a frame the server cannot parse or does not allow
//	4001 unauthorized    bad login
//	4008 slow consumer   the send queue overflowed
//	4009 conflict        the same user logged in elsewhere
//	4010 idle            nothing received within the idle timeout
//
// 1008 covers malformed JSON, a missing or unknown "type", a first frame
// other than login, a second login on the same connection, a send or group
// frame missing what it needs, binary frames, and frames larger than the
// read limit (64 KiB by default). The last is 1008 rather than the 1009 a
// WebSocket library sends by itself, so that every refused frame is one code
// with a reason naming the problem. 4001 covers a missing user as well as a
// bad or empty token. A close sent by the peer is echoed, not answered with
// a code of the server's own.
//
// # Faults
//
// Faults apply to deliveries, never to acks, and are drawn independently per
// delivery: drop (silently discard), duplicate (deliver twice), delay and
// jitter (hold for delay plus a uniform random 0..jitter), and reorder (hold
// the delivery back and send it right after the recipient's next delivery of
// the same stream, one sender's messages in one conversation, or after
// reorderHold, 5 s, if none comes: long enough that a sender at one message
// every few seconds still overtakes it). A duplicate is the same frame twice,
// with the same delay. Delays are served by one delay line ordered by
// release time and then by arrival, so a fixed delay without jitter keeps
// order. A connection holds back at most one delivery for reorder: while it
// holds one, the next delivery drawn for reorder goes out normally (and
// releases the held one after it if it is of the same stream). Faults apply
// at the moment of delivery, so a delivery bound for an offline user is
// dropped, duplicated or delayed on its way into the offline queue, but not
// reordered there.
//
// The stall fault reproduces a server that stops delivering to a session
// without closing it, as Tinode silently detaches a slow session from its
// topics: every delivery to a stalled user's session is discarded, while
// the connection stays open, its WebSocket and protocol pings are
// answered, and its own sends are acked and delivered to others, so that
// nothing on the connection tells the client. It is set per user rather
// than drawn per delivery, and holds for the user's current session and
// every later one until it is turned off (imcanary target --stall
// USER[,USER…] from the start, Server.Stall at run time). Like the other
// faults it applies at the moment of delivery, after drop, duplicate and
// delay: a delivery delayed into a stall is discarded when it comes due.
// Deliveries to a stalled user who is offline go to the offline queue as
// usual, and that backlog is discarded at login while the stall holds.
// Turning the stall off resumes delivery with the next message; nothing
// discarded is replayed. Stats.Stalled counts the discarded deliveries.
package refserver
