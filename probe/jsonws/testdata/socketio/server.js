// A small Socket.IO 4 chat server for imcanary's jsonws tests, on loopback
// only. Started by .ci/socketio.sh; configs/socketio.yaml maps it.
//
//   node server.js PORT            (or SOCKETIO_PORT=PORT node server.js)
//
// Environment:
//   SOCKETIO_SECRET      if set, auth.token must be hex HMAC-SHA256(secret, user)
//   SOCKETIO_DROP        probability 0..1 of not delivering a message to one
//                        recipient socket: its seq is still assigned and it is
//                        kept in history, so the recipient sees a gap
//   SOCKETIO_MAX_BUFFER  packets engine.io may queue for one socket before it
//                        is closed as a slow consumer (default 1000)
//
// Client events, each with an ack:
//   join    {group}              → {ok:true}
//   leave   {group}              → {ok:true}
//   send    {to|group, body}     → {ok:true, seq, conv, id}
//   history {conv, after, limit} → "message" events with history:true, then
//                                  {ok:true, last, count}
//   seqs    {}                   → {ok:true, convs:{conv: newest seq}}
// A refusal is {ok:false, code:"bad_request"|"not_member", message}.
// Server event "message": {id, from, conv, seq, body, group?, history?}.
// GET /stats returns the counters below as JSON: delivered counts messages
// handed to a socket (a slow consumer's queue may still drop them), dropped
// those SOCKETIO_DROP withheld, replayed those sent by history.
// POST /kill?user=U drops every connection of U without a close frame.
'use strict';
const http = require('http');
const crypto = require('crypto');
const { Server } = require('socket.io');

const port = Number(process.argv[2] || process.env.SOCKETIO_PORT);
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  console.error('usage: node server.js PORT');
  process.exit(2);
}
const secret = process.env.SOCKETIO_SECRET || '';
const dropP = Number(process.env.SOCKETIO_DROP || 0);
const maxBuffer = Number(process.env.SOCKETIO_MAX_BUFFER || 1000);
const PER_CONV = 10000; // messages kept per conversation
const TOTAL = 1000000; // messages kept in all
const MAX_PAGE = 500; // most messages one history call returns

const stats = { connections: 0, connectionsTotal: 0, refused: 0, sent: 0,
  delivered: 0, dropped: 0, replayed: 0, slowClosed: 0, stored: 0, killed: 0 };

// A conversation is "d:<a>:<b>" (users sorted) or "g:<group>". seqs holds its
// newest seq, never forgotten so that a seq never goes back; history its
// latest messages, in a Map ordered from the least recently active.
const seqs = new Map();
const history = new Map();
// Membership is the user's, not a socket's: a join or leave on one device
// holds for all of them, and a device that connects later is in the rooms of
// its user's groups at once.
const members = new Map(); // group → Set of users
const groupsOf = new Map(); // user → Set of groups
let lastId = 0;

function store(msg) {
  const list = history.get(msg.conv) || [];
  history.delete(msg.conv);
  history.set(msg.conv, list); // now the most recently active
  list.push(msg);
  stats.stored++;
  if (list.length > PER_CONV) { list.shift(); stats.stored--; }
  while (stats.stored > TOTAL) { // the global bound drops whole conversations
    const [conv, old] = history.entries().next().value;
    history.delete(conv);
    stats.stored -= old.length;
  }
}

function inConv(user, conv) {
  if (conv.startsWith('g:')) return members.get(conv.slice(2))?.has(user) === true;
  const [d, a, b] = conv.split(':');
  return d === 'd' && (a === user || b === user);
}

const refuse = (code, message) => ({ ok: false, code, message });

const httpServer = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/stats') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ ...stats, conversations: seqs.size }));
    return;
  }
  // A receiver killed mid-run: every socket of the user loses its TCP
  // connection at once, without a close frame, as when its network goes.
  if (req.method === 'POST' && req.url.startsWith('/kill?')) {
    const user = new URL(req.url, 'http://localhost').searchParams.get('user');
    let killed = 0;
    for (const socket of nsp.sockets.values()) {
      if (socket.data.user !== user) continue;
      socket.conn.transport.socket.terminate();
      killed++;
    }
    stats.killed += killed;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ killed }));
    return;
  }
  res.writeHead(404).end();
});

const io = new Server(httpServer, {
  pingInterval: 25000, pingTimeout: 20000, maxHttpBufferSize: 1e6,
  transports: ['websocket'], serveClient: false,
});
const nsp = io.of('/');

// The user comes from the CONNECT packet's auth payload, 40{"user":…}. A
// refusal reaches the client as 44{"message":"no user"|"unauthorized"}.
io.use((socket, next) => {
  const { user, token } = socket.handshake.auth || {};
  if (typeof user !== 'string' || user === '' || user.includes(':')) {
    stats.refused++;
    return next(new Error('no user'));
  }
  if (secret) {
    const want = Buffer.from(crypto.createHmac('sha256', secret).update(user).digest('hex'));
    const got = Buffer.from(typeof token === 'string' ? token : '');
    if (got.length !== want.length || !crypto.timingSafeEqual(got, want)) {
      stats.refused++;
      return next(new Error('unauthorized'));
    }
  }
  socket.data.user = user;
  next();
});

// deliver emits msg to every socket in the rooms but one, each dropped with
// probability SOCKETIO_DROP.
function deliver(rooms, exceptId, msg) {
  const ids = new Set();
  for (const r of rooms) for (const id of nsp.adapter.rooms.get(r) || []) ids.add(id);
  ids.delete(exceptId);
  for (const id of ids) {
    if (dropP > 0 && Math.random() < dropP) { stats.dropped++; continue; }
    nsp.sockets.get(id)?.emit('message', msg);
    stats.delivered++;
  }
}

io.on('connection', (socket) => {
  const user = socket.data.user;
  stats.connections++;
  stats.connectionsTotal++;
  socket.join('user:' + user); // every device of the user
  for (const g of groupsOf.get(user) || []) socket.join('room:' + g);
  socket.on('disconnect', () => { stats.connections--; });

  // on registers a handler whose result is the ack (if the client asked for one).
  const on = (name, fn) => socket.on(name, (...args) => {
    const ack = typeof args[args.length - 1] === 'function' ? args.pop() : () => {};
    const p = args[0] ?? {};
    ack(typeof p === 'object' ? fn(p) : refuse('bad_request', 'the payload is not an object'));
  });
  const isName = (v) => typeof v === 'string' && v !== '' && !v.includes(':');

  on('join', ({ group }) => {
    if (!isName(group)) return refuse('bad_request', 'join needs "group"');
    if (!members.has(group)) members.set(group, new Set());
    if (!groupsOf.has(user)) groupsOf.set(user, new Set());
    members.get(group).add(user);
    groupsOf.get(user).add(group);
    nsp.in('user:' + user).socketsJoin('room:' + group);
    return { ok: true };
  });

  on('leave', ({ group }) => {
    if (!isName(group)) return refuse('bad_request', 'leave needs "group"');
    members.get(group)?.delete(user);
    groupsOf.get(user)?.delete(group);
    nsp.in('user:' + user).socketsLeave('room:' + group);
    return { ok: true };
  });

  on('send', ({ to, group, body }) => {
    if (body === undefined) return refuse('bad_request', 'send needs "body"');
    let conv, rooms;
    if (group !== undefined) {
      if (!isName(group)) return refuse('bad_request', 'bad "group"');
      if (!members.get(group)?.has(user)) return refuse('not_member', 'not a member of ' + group);
      conv = 'g:' + group;
      rooms = ['room:' + group]; // the sender's other devices in the room too
    } else if (isName(to)) {
      conv = 'd:' + [user, to].sort().join(':');
      rooms = ['user:' + to, 'user:' + user]; // the sender's other devices mirror it
    } else {
      return refuse('bad_request', 'send needs "to" or "group"');
    }
    const seq = (seqs.get(conv) || 0) + 1;
    seqs.set(conv, seq);
    const msg = { id: ++lastId, from: user, conv, seq, body };
    if (group !== undefined) msg.group = group;
    store(msg);
    stats.sent++;
    deliver(rooms, socket.id, msg);
    return { ok: true, seq, conv, id: msg.id };
  });

  on('history', ({ conv, after, limit }) => {
    if (typeof conv !== 'string') return refuse('bad_request', 'history needs "conv"');
    if (!inConv(user, conv)) return refuse('not_member', 'not in ' + conv);
    const from = Math.floor(Number(after) || 0);
    const max = Math.min(Math.max(Math.floor(Number(limit)) || MAX_PAGE, 1), MAX_PAGE);
    const list = history.get(conv) || [];
    // The seqs of a conversation's list are consecutive.
    let i = list.length ? Math.max(0, from + 1 - list[0].seq) : 0;
    let count = 0;
    for (; i < list.length && count < max; i++, count++) {
      socket.emit('message', { ...list[i], history: true });
    }
    stats.replayed += count;
    return { ok: true, last: seqs.get(conv) || 0, count };
  });

  on('seqs', () => {
    const convs = {};
    for (const [conv, seq] of seqs) if (inConv(user, conv)) convs[conv] = seq;
    return { ok: true, convs };
  });
});

// Slow consumers. engine.io queues packets in conn.writeBuffer while its
// websocket transport waits for ws to finish the previous write, which it
// cannot while the client does not read; nothing bounds that queue. A socket
// past the limit gets a WebSocket close 4008 (after what is already in ws's
// and the kernel's buffers; ws destroys the TCP connection if the client does
// not answer the close within 30 s), and engine.io drops its queue at once.
setInterval(() => {
  for (const socket of nsp.sockets.values()) {
    const queued = socket.conn.writeBuffer.length;
    if (queued <= maxBuffer) continue;
    stats.slowClosed++;
    console.log(`slow consumer: user ${socket.data.user} sid ${socket.id}: ${queued} packets queued; closing with 4008`);
    socket.conn.transport.socket.close(4008, 'slow consumer');
    socket.conn.close(true); // discard the queue; socket.io sees "forced close"
  }
}, 1000);

process.on('SIGTERM', () => { console.log('stopping'); process.exit(0); });
httpServer.listen(port, '127.0.0.1', () => console.log(`socket.io test server on 127.0.0.1:${port}`));
