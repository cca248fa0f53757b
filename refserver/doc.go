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
//	{"type":"history","id":"7","conv":"g:g1","after":12,"limit":100}
//	{"type":"seqs","id":"8"}
//
// Server to client:
//
//	{"type":"login_ok","id":"1"}
//	{"type":"ok","id":"2"}
//	{"type":"ack","id":"3","msg_id":"42","conv":"d:u1:u2","seq":7}
//	{"type":"msg","from":"u1","to":"u2","conv":"d:u1:u2","msg_id":"42","seq":7,"body":"…"}
//	{"type":"msg","from":"u1","group":"g1","conv":"g:g1","msg_id":"43","seq":9,"body":"…"}
//	{"type":"pong","id":"5"}
//	{"type":"msg","id":"7","from":"u1","group":"g1","conv":"g:g1","msg_id":"43","seq":13,"body":"…"}
//	{"type":"ok","id":"7","conv":"g:g1","last":14,"first":3,"more":false}
//	{"type":"seqs","id":"8","convs":{"d:u1:u2":7,"g:g1":14}}
//	{"type":"error","id":"3","code":"not_member","message":"…"}
//	{"type":"error","id":"1","code":"device_limit","message":"…"}
//
// Login must be the first frame. A token is the lowercase hex HMAC-SHA256 of
// the user name keyed with the server's secret; a server started without a
// secret accepts any non-empty token (and says so in its log). Users exist
// once they log in; groups are created or replaced by a "group" frame
// (idempotent: the same members again is a no-op).
//
// A user may be logged in on several devices at once: up to MaxDevices
// sessions (default 5; imcanary refserver --max-devices). A login beyond
// them is handled by the DevicePolicy (--device-policy): "oldest", the
// default, closes the user's oldest session with CloseConflict and the
// reason "device limit N reached", and the login succeeds; "refuse"
// answers the login with an error of code "device_limit" carrying the
// login's id, then closes the new connection with CloseConflict and the
// same reason, and the user's sessions stay as they were. MaxDevices 1
// with "oldest" is a server where a second login replaces the first.
//
// A send carries exactly one of "to" and "group", and its body is a JSON
// string, relayed byte for byte. Sending to a group one is not a member of
// (or that does not exist) is answered with an error of code "not_member";
// the connection stays open. A recipient need not exist: a message to a
// user who never logged in waits in that user's offline queue. Past the
// server's fixed limits on conversations (2^20) and groups (2^16), a send
// or group frame is answered with an error of code "limit". A direct
// conversation belongs to the first pair of users to write to it: user
// names with colons can give two pairs the same id ("d:a:b:c" is a:b with
// c and a with b:c), and a send of the other pair is answered with an
// error of code "conflict".
//
// The ack is sent once the message is accepted: it carries a server message
// id and the message's sequence number within its conversation ("d:a:b" with
// the two users sorted, or "g:NAME"), contiguous from 1. A group message is
// delivered to every current member except the sender; membership is read
// when the message is sent, so a member removed by a "group" frame gets
// none of the group's later messages. A delivery to a user goes to every
// open session of the user, and a message is also delivered to the
// sender's other open sessions ("self-sync", as OpenIM, Centrifugo and
// XMPP carbons do): the same msg frame, whose "from" is the sender itself.
// The sending session gets only the ack, except for a message to oneself,
// which is one delivery to every session of the user, the sending one
// included.
//
// Deliveries to a user who has no open session are kept in a bounded
// per-user offline queue and delivered, in order, at the user's next login,
// to that session alone; beyond the bound (OfflineQueue, default 1000) the
// oldest are dropped and counted. All offline queues together are also
// capped in bytes (256 MiB), since recipients need not exist; a delivery
// past that cap is dropped and counted the same way. A session that is
// being closed is not open: a delivery that finds none of the user's
// sessions open goes to the offline queue, as if the user were already
// offline. A self-sync delivery never goes to the offline queue: the
// sender's next session finds it in history. A delivery held back by the
// reorder fault (see Faults) for a session that closes goes to the user's
// sessions that logged in since it was held (the others got their own
// copy), or, if the user has none open, to the offline queue.
//
// # History
//
// The server keeps the newest messages of each conversation, HistoryLimit
// of them (default 1000; --history, where 0 keeps none), and the kept
// messages of all conversations together within HistoryBytes (default 64
// MiB; --history-bytes). Past either bound the oldest go first: past the
// byte cap, the oldest of all conversations. A message counts its msg
// frame plus 384 bytes of bookkeeping, and 16 bytes plus the name of each
// recipient the drop fault hid it from. What is kept of a conversation is
// always a contiguous run of seqs ending at its newest.
//
// A "history" frame asks for the kept messages of "conv" with a seq above
// "after" (default 0), at most "limit" of them (default and at most 500,
// MaxHistoryPage; a larger limit is taken as 500). The answer is zero or
// more msg frames of that conversation, ascending by seq, each the frame
// that was pushed with the request's "id" added, so that a client tells
// them from pushes; then an "ok" with the request's id and conv, where
// "last" is the conversation's newest seq, "first" the oldest seq still
// kept (last+1 if none is: seqs below first fell out of history), and
// "more" is true if a message the user may see follows the page. The page
// is also cut to the room left in the connection's send queue, less one
// for the ok, so that an answer does not by itself overflow it; a client
// pages on with "after" set to the last seq it got. The answer goes
// through the send queue like pushes, so a reader too slow for it is a
// slow consumer, and it is queued in the same order as pushes: a message
// of the conversation with a seq above "last" is pushed after the ok.
//
// Only a member of the conversation may ask: for "g:NAME" a current member
// of the group, for a direct conversation one of its two users. Anyone
// else, and any other conv, is answered with an error of code
// "not_member"; the connection stays open. A direct conversation of the
// user without a message yet (a "d:a:b" with the user as a or b, a <= b)
// is answered with an ok with last 0 and first 1. History is not filtered
// by when a member joined the group.
//
// A "seqs" frame asks for the newest seq of every conversation of the
// user: the direct conversations the user has a message in (the first
// 65536 of them) and the groups the user is currently a member of (0 for
// a group without a message). The answer lists them in "convs", sorted by
// name. It is at most 64 KiB: a list cut to fit is followed by
// "more":true.
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
// An idle connection holds no goroutine: an epoll poller reads every
// connection (see poll.go), and a connection has a goroutine only while it
// has frames to write. About 3 KiB of heap a connection, against 33 KiB
// with a reader and a writer goroutine each (Options.NoReactor;
// BenchmarkServerMemory).
//
// # Bounds
//
// Memory stays bounded whatever the clients do; past each bound the server
// drops, cuts or refuses as described above:
//
//   - per connection: the send queue (SendQueue frames, default 256) and
//     the frame being written; a read buffer of at most MaxFrame (default 64 KiB), one delivery held
//     for reorder;
//   - per user: MaxDevices sessions (default 5), the offline queue
//     (OfflineQueue deliveries, default 1000), 65536 direct conversations
//     listed for seqs;
//   - in all: the offline queues 256 MiB; history HistoryLimit messages per
//     conversation (default 1000) and HistoryBytes together (default 64
//     MiB), hidden recipients included; 2^20 conversations and 2^16
//     groups, each group's members as many as one frame names, and an
//     index of them per member for seqs; the delay line 2^20 entries;
//   - per answer: a history page 500 messages and the send queue's room, a
//     seqs answer 64 KiB.
//
// # Close codes
//
//	1001 going away      the server is shutting down
//	1008 policy          a frame the server cannot parse or does not allow
//	4001 unauthorized    bad login
//	4008 slow consumer   the send queue overflowed
//	4009 conflict        a login past the user's device limit (see MaxDevices)
//	4010 idle            nothing received within the idle timeout
//
// 1008 covers malformed JSON (a field of the wrong type included, such as a
// negative or fractional "after" or a fractional "limit"), a missing or
// unknown "type", a
// first frame other than login, a second login on the same connection, a
// send or group frame missing what it needs, a history frame without "conv"
// or with a negative "limit", binary frames, and frames larger than the
// read limit (64 KiB by default). The last is 1008 rather than the 1009 a
// WebSocket library sends by itself, so that every refused frame is one code
// with a reason naming the problem. 4001 covers a missing user as well as a
// bad or empty token. A close sent by the peer is echoed, not answered with
// a code of the server's own.
//
// # Faults
//
// Faults apply to deliveries, never to acks or other replies, history
// answers included. They are drawn independently per delivery, that is per
// message and recipient user: one draw covers all of the user's sessions,
// and a self-sync delivery to the sender's other sessions is a delivery
// like any other. Each is a probability, or a duration for delay and
// jitter:
//
//   - drop discards the delivery and hides the message from that
//     recipient's history answers (each kept message stores the few users
//     it is hidden from). A group message's other members are unaffected,
//     and the conversation's seq still counts it: a client sees the gap in
//     "last", and the history answer simply lacks it.
//   - drop-push discards the push alone: the message stays in history and
//     the recipient gets it from a history request, as from a server that
//     loses a push but not the message (Stats.DroppedPush).
//   - skip-device, for a delivery to two or more sessions, skips one of
//     them, chosen at random; history still has it (Stats.SkippedDevice).
//   - duplicate delivers twice: the same frame, with the same delay, to
//     the same sessions.
//   - delay and jitter hold the delivery for delay plus a uniform random
//     0..jitter.
//   - reorder holds the delivery back and sends it right after the
//     session's next delivery of the same stream, one sender's messages in
//     one conversation, or after reorderHold, 5 s, if none comes: long
//     enough that a sender at one message every few seconds still
//     overtakes it.
//
// Drop and drop-push are drawn first and end the delivery; the others
// combine. Delays are served by one delay line ordered by release time and
// then by arrival, so a fixed delay without jitter keeps order; the line
// holds at most 2^20 entries, past which a delivery goes out undelayed. A
// connection holds back at most one delivery for reorder: while it holds
// one, the next delivery drawn for reorder goes out normally (and releases
// the held one after it if it is of the same stream). Faults apply at the
// moment of delivery, and which sessions a delivery goes to is settled
// then, after its delay: a delivery bound for a user with no open session
// is dropped (and hidden), push-dropped, duplicated or delayed on its way
// into the offline queue, but not reordered there, and the queue's backlog
// is not skipped or dropped again at login.
//
// The stall fault reproduces a server that stops delivering to a session
// without closing it, as Tinode silently detaches a slow session from its
// topics: every delivery to a stalled user's sessions is discarded, while
// the connections stay open, their WebSocket and protocol pings and their
// history and seqs frames are answered, and their own sends are acked and
// delivered to others, so that nothing on the connection tells the client.
// It is set per user rather than drawn per delivery, and holds for all of
// the user's sessions, current and later, until it is turned off (imcanary
// refserver --stall USER[,USER…] from the start, Server.Stall at run
// time). Like the other faults it applies at the moment of delivery, after
// drop, duplicate and delay: a delivery delayed into a stall is discarded
// when it comes due. Deliveries to a stalled user who is offline go to the
// offline queue as usual, and that backlog is discarded at login while the
// stall holds. Turning the stall off resumes delivery with the next
// message; nothing discarded is replayed, but history still has it.
// Stats.Stalled counts the discarded deliveries, one per session.
package refserver
