#!/usr/bin/env bash
# Builds, starts and stops a Centrifugo v6 on loopback for the integration
# tests of probe/centrifugo.
#
#   .ci/centrifugo.sh build                 # install the binary into the cache (skipped if there)
#   .ci/centrifugo.sh start DIR PORT [QUEUE] # config, secret and logs under DIR; prints the URL
#   .ci/centrifugo.sh stop DIR
#   .ci/centrifugo.sh bin                   # prints the binary's path, for tests that start their own
#
# The binary is built from source with the Go toolchain (go install of a
# pinned version, through the module proxy) into a cache that outlives a CI
# run: a cold build takes about five minutes on two cores, a warm one is a
# file check. The HMAC secret comes from IMCANARYTEST_CENTRIFUGO_SECRET, or
# is generated and written to DIR/secret; it is never printed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

version=v6.9.1
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
bindir=$cache/centrifugo-$version/bin
bin=$bindir/centrifugo

usage() {
  echo "usage: $0 build | start DIR PORT [QUEUE_MAX_SIZE] | stop DIR | bin" >&2
  exit 2
}

build() {
  cached_go_install "github.com/centrifugal/centrifugo/v6@$version" centrifugo "$bin"
}

start() {
  local dir=$1 port=$2 queue=${3:-1048576}
  [ -x "$bin" ] || build
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "centrifugo already running in $dir (pid $(cat "$dir/pid"))" >&2
    exit 1
  fi
  local secret=${IMCANARYTEST_CENTRIFUGO_SECRET:-}
  if [ -z "$secret" ]; then
    if [ ! -s "$dir/secret" ]; then
      (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret")
    fi
    secret=$(cat "$dir/secret")
  fi
  # The secret goes into a JSON string: escape what JSON needs escaped.
  secret=$(printf '%s' "$secret" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
  # Our own config, not Centrifugo's defaults: loopback only, no usage
  # statistics sent anywhere, no HTTP API (the tests use only the client
  # protocol), and the two namespaces imcanary's driver uses. History makes
  # offsets and epochs (the server's own sequence) and catch-up possible:
  # allow_recovery lets a resubscribe recover what it missed, and
  # allow_history_for_subscriber lets a subscriber fetch a gap with the
  # history command; 1000 publications over 300 s outlast any reconnect
  # in the tests. The server pings every 5 s rather than 25 s so that a
  # test of seconds sees its application-level ping/pong too.
  (umask 077 && cat >"$dir/config.json" <<EOF
{
  "http_server": {"address": "127.0.0.1", "port": $port},
  "log": {"level": "warn"},
  "health": {"enabled": true},
  "usage_stats": {"disabled": true},
  "http_api": {"disabled": true},
  "client": {
    "token": {"hmac_secret_key": "$secret"},
    "queue_max_size": $queue,
    "ping_interval": "5s",
    "pong_timeout": "3s"
  },
  "channel": {
    "namespaces": [
      {
        "name": "chat",
        "allow_subscribe_for_client": true,
        "allow_publish_for_subscriber": true,
        "history_size": 1000,
        "history_ttl": "300s",
        "allow_positioning": true,
        "allow_recovery": true,
        "allow_history_for_subscriber": true
      },
      {
        "name": "dm",
        "allow_user_limited_channels": true,
        "allow_publish_for_subscriber": true,
        "history_size": 1000,
        "history_ttl": "300s",
        "allow_positioning": true,
        "allow_recovery": true,
        "allow_history_for_subscriber": true
      }
    ]
  }
}
EOF
  )
  # setsid: the server outlives this script, in a session of its own, and
  # stop kills exactly the pid recorded here.
  setsid "$bin" --config "$dir/config.json" >"$dir/log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  local url="http://127.0.0.1:$port/health"
  for _ in $(seq 1 100); do
    if curl -fsS -o /dev/null "$url" 2>/dev/null; then
      echo "ws://127.0.0.1:$port/connection/websocket"
      return 0
    fi
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "centrifugo exited at start:" >&2
      cat "$dir/log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "centrifugo did not answer $url within 10s:" >&2
  cat "$dir/log" >&2
  stop "$dir"
  exit 1
}

# Centrifugo shuts down gracefully within its shutdown timeout; past a
# bound, it is killed.
stop() { stop_pidfile "$1/pid"; }

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start) [ $# -ge 3 ] && [ $# -le 4 ] || usage; start "$2" "$3" "${4:-}" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
bin) [ $# -eq 1 ] || usage; echo "$bin" ;;
*) usage ;;
esac
