#!/usr/bin/env bash
# Builds, starts and stops a Toxiproxy server on loopback for the network
# fault tests of probe/reference (TestNetworkFaults).
#
#   .ci/toxiproxy.sh build           # install the binary into the cache (skipped if there)
#   .ci/toxiproxy.sh start DIR PORT  # logs under DIR; prints the API's URL
#   .ci/toxiproxy.sh stop DIR
#
# Built from source with go install of a pinned version (about 25 seconds
# on two cores) into the cache that also keeps Centrifugo. v2.5.0 is the
# newest version the module proxy lists under github.com/Shopify/toxiproxy/v2.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

version=v2.5.0
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
bindir=$cache/toxiproxy-$version/bin
bin=$bindir/toxiproxy-server

usage() {
  echo "usage: $0 build | start DIR PORT | stop DIR" >&2
  exit 2
}

build() {
  cached_go_install "github.com/Shopify/toxiproxy/v2/cmd/server@$version" server "$bin"
}

start() {
  local dir=$1 port=$2
  [ -x "$bin" ] || build
  mkdir -p "$dir"
  # Loopback only: its API can open proxies to anywhere.
  "$bin" -host 127.0.0.1 -port "$port" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/version" >/dev/null 2>&1; then
      echo "http://127.0.0.1:$port"
      return 0
    fi
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "toxiproxy exited:" >&2
      cat "$dir/log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "toxiproxy did not answer on port $port within 10 s" >&2
  exit 1
}

stop() { stop_pidfile "$1/pid"; }

case "${1:-}" in
  build) build ;;
  start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
  stop) [ $# -eq 2 ] || usage; stop "$2" ;;
  *) usage ;;
esac
