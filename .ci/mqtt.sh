#!/usr/bin/env bash
# Builds, starts and stops the two MQTT brokers the mqtt adapter is tested
# against, each with a WebSocket listener on loopback: mosquitto (Debian's
# package) and mochi-mqtt (built from source).
#
#   .ci/mqtt.sh build                                # mochi into the cache (skipped if there); checks mosquitto
#   .ci/mqtt.sh start-mosquitto DIR PORT [MAX_QUEUED] # config, pid and log under DIR; prints the URL
#   .ci/mqtt.sh start-mochi DIR PORT                 # pid and log under DIR; prints the URL
#   .ci/mqtt.sh stop DIR                             # either kind
#
# mosquitto is not built here: .ci/run installs Debian's package (2.0.11 on
# bookworm). Its postinst may start a system service on 1883; our instances
# listen only on the ports given, so they neither need nor disturb it.
# mochi-mqtt is built with go install of a pinned version (its own go.mod
# decides every dependency) into the cache that also keeps Centrifugo.
#
# Both brokers take anonymous clients: they listen on loopback only, for
# tests. Only the URL goes to stdout, so that $(...) captures just that.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

version=v2.7.9
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
bindir=$cache/mochi-$version/bin
bin=$bindir/cmd

usage() {
  echo "usage: $0 build | start-mosquitto DIR PORT [MAX_QUEUED] | start-mochi DIR PORT | stop DIR" >&2
  exit 2
}

need_mosquitto() {
  command -v mosquitto >/dev/null ||
    { echo "mosquitto is not installed (apt-get install --no-install-recommends mosquitto)" >&2; exit 1; }
}

build() {
  need_mosquitto
  # go install's messages go to stderr, but make sure: start calls build
  # inside the $(...) that captures the URL.
  cached_go_install "github.com/mochi-mqtt/server/v2/cmd@$version" cmd "$bin" >&2
}

# wait_port DIR PORT NAME LOG... waits up to 15 s for the broker whose pid
# DIR/pid holds to accept TCP connections on PORT. The ports were free
# before it started, so whoever accepts is our broker. On failure it shows
# the tail of each LOG on stderr, stops the broker and exits non-zero.
wait_port() {
  local dir=$1 port=$2 name=$3
  shift 3
  local why="did not accept connections on port $port within 15 s"
  for _ in $(seq 1 150); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      why="exited at start"
      break
    fi
    sleep 0.1
  done
  echo "$name $why:" >&2
  local log
  for log in "$@"; do
    if [ -s "$log" ]; then
      echo "--- $log" >&2
      tail -n 40 "$log" >&2
    fi
  done
  stop "$dir"
  exit 1
}

start_mosquitto() {
  local dir port=$2 queued=${3:-1000}
  need_mosquitto
  # Absolute: the config names the log file by its path.
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  if ! [[ $queued =~ ^[0-9]+$ ]]; then
    echo "MAX_QUEUED must be a number, not $queued" >&2
    exit 2
  fi
  not_running "$dir/pid" "a broker"
  check_ports "$port"
  check_ports "$((port + 1))"
  # Started as root, mosquitto switches to the user "mosquitto" before it
  # opens its log file, which it then cannot create in a 0700 directory
  # such as mktemp -d makes (.ci/run's): "user root" keeps it root. As
  # any other user the setting has no effect, so it is written only for
  # root.
  local user=""
  if [ "$(id -u)" -eq 0 ]; then
    user="user root"
  fi
  # per_listener_settings false: allow_anonymous and the limits apply to
  # every listener. persistence false: nothing is kept between runs.
  # max_queued_messages bounds what a slow or offline QoS 1/2 session may
  # have queued; past it mosquitto drops (the slow-consumer tests use a
  # small one). mosquitto 2.0.11 refuses to start with only websockets
  # listeners ("Unable to start any listening sockets", it counts only the
  # plain ones), hence the plain MQTT listener on PORT+1, which the tests
  # do not use. socket_domain ipv4: 127.0.0.1 only, no ::1.
  cat >"$dir/m.conf" <<EOF
$user
per_listener_settings false
allow_anonymous true
max_queued_messages $queued
max_inflight_messages 20
persistence false
listener $((port + 1)) 127.0.0.1
listener $port 127.0.0.1
socket_domain ipv4
protocol websockets
log_dest file $dir/mosquitto.log
EOF
  rm -f "$dir/mosquitto.log"
  # setsid: the broker outlives this script, in a session of its own, and
  # stop kills exactly the pid recorded here. Without -d it stays in the
  # foreground, so $! is its pid. Its stderr (DIR/out) holds what it says
  # before the log file is open, such as a config error.
  setsid mosquitto -c "$dir/m.conf" >"$dir/out" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  wait_port "$dir" "$port" mosquitto "$dir/out" "$dir/mosquitto.log"
  echo "ws://127.0.0.1:$port/mqtt"
}

start_mochi() {
  local dir port=$2
  [ -x "$bin" ] || build
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  not_running "$dir/pid" "a broker"
  # The command always opens a plain MQTT listener and an HTTP info
  # dashboard too (defaults :1883 and :8080, on every address): both on
  # loopback, on the next two ports, so that they collide with nothing.
  check_ports "$port"
  check_ports "$((port + 1))" "$((port + 2))"
  setsid "$bin" -ws "127.0.0.1:$port" -tcp "127.0.0.1:$((port + 1))" -info "127.0.0.1:$((port + 2))" \
    >"$dir/log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  wait_port "$dir" "$port" mochi-mqtt "$dir/log"
  # mochi's WebSocket listener answers on any path.
  echo "ws://127.0.0.1:$port/"
}

# Both brokers close their clients and exit on SIGTERM; past a bound, they
# are killed.
stop() { stop_pidfile "$1/pid"; }

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start-mosquitto) [ $# -ge 3 ] && [ $# -le 4 ] || usage; start_mosquitto "$2" "$3" "${4:-}" ;;
start-mochi) [ $# -eq 3 ] || usage; start_mochi "$2" "$3" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
