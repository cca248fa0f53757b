#!/usr/bin/env bash
# Builds, starts and stops the Socket.IO 4 test server of probe/jsonws
# (probe/jsonws/testdata/socketio/server.js) on loopback.
#
#   .ci/socketio.sh build            # npm ci of its dependencies into the cache (skipped if there)
#   .ci/socketio.sh start DIR PORT   # secret, pid and log under DIR; prints the URL
#   .ci/socketio.sh stop DIR
#
# It needs Node.js >= 18 and npm as /usr/bin/node and /usr/bin/npm (Debian
# bookworm's nodejs 18.20 and npm packages will do). The dependencies
# (socket.io 4.8.4, pinned with every transitive package by package-lock.json)
# are installed from the npm registry into the cache, in a directory named
# after the lock file's hash, so a changed lock file builds afresh and a
# cached one needs no network. The repository never gets a node_modules: the
# server finds them through NODE_PATH.
#
# The HMAC secret of the tokens (auth.token = hex HMAC-SHA256(secret, user))
# comes from IMCANARYTEST_SOCKETIO_SECRET (set but empty: no token check), or
# is generated and written to DIR/secret; it is never printed. The server also
# reads SOCKETIO_DROP and SOCKETIO_MAX_BUFFER from the environment (see
# server.js).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

src=$(cd "$(dirname "$0")/../probe/jsonws/testdata/socketio" && pwd)
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
node=/usr/bin/node
npm=/usr/bin/npm
hash=$(sha256sum "$src/package-lock.json" | cut -c1-16)
moddir=$cache/socketio-$hash

usage() {
  echo "usage: $0 build | start DIR PORT | stop DIR" >&2
  exit 2
}

# build runs npm ci in a temporary directory next to the final one and
# renames it into place, so that a broken install leaves nothing the check
# would trust.
build() {
  if [ -f "$moddir/node_modules/socket.io/package.json" ]; then
    return 0
  fi
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.socketio-XXXXXX")
  cp "$src/package.json" "$src/package-lock.json" "$tmp/"
  # --ignore-scripts: none of these packages needs an install script.
  (cd "$tmp" && "$npm" ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >&2) ||
    { rm -rf "$tmp"; return 1; }
  if ! mv -T "$tmp" "$moddir" 2>/dev/null; then
    rm -rf "$tmp" # another build got there first
    [ -f "$moddir/node_modules/socket.io/package.json" ]
  fi
}

start() {
  local dir=$1 port=$2
  build
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "socket.io server already running in $dir (pid $(cat "$dir/pid"))" >&2
    exit 1
  fi
  local secret
  if [ -n "${IMCANARYTEST_SOCKETIO_SECRET+set}" ]; then
    secret=$IMCANARYTEST_SOCKETIO_SECRET
  else
    if [ ! -s "$dir/secret" ]; then
      (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret")
    fi
    secret=$(cat "$dir/secret")
  fi
  # setsid: the server outlives this script, in a session of its own, and
  # stop kills exactly the pid recorded here. The secret goes through the
  # environment, not the command line.
  SOCKETIO_SECRET=$secret NODE_PATH=$moddir/node_modules \
    setsid "$node" "$src/server.js" "$port" >"$dir/log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  # Ready when Engine.IO answers its handshake URL. The server offers only
  # the websocket transport, so a polling request is refused with HTTP 400
  # and {"code":0,"message":"Transport unknown"}: that answer is engine.io's.
  local url="http://127.0.0.1:$port/socket.io/?EIO=4&transport=polling"
  for _ in $(seq 1 100); do
    if curl -sS "$url" 2>/dev/null | grep -q '"Transport unknown"'; then
      echo "ws://127.0.0.1:$port/socket.io/?EIO=4&transport=websocket"
      return 0
    fi
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "socket.io server exited at start:" >&2
      cat "$dir/log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "socket.io server did not answer $url within 10s:" >&2
  cat "$dir/log" >&2
  stop "$dir"
  exit 1
}

stop() { stop_pidfile "$1/pid"; }

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
