#!/usr/bin/env bash
# Builds, starts and stops a Matrix homeserver, Dendrite v0.13.8
# (matrix-org/dendrite), on loopback for imcanary's matrix tests.
#
#   .ci/matrix.sh build           # dendrite, generate-keys, generate-config into the cache (skipped if there)
#   .ci/matrix.sh start DIR PORT  # key, config, databases and logs under DIR; prints the URL
#   .ci/matrix.sh stop DIR
#
# Dendrite is Apache-2.0 (the element-hq fork is AGPL-3.0 and is not used).
# It is built with go install of the pinned version outside any module, so
# that its own go.mod decides every dependency. A cold build takes about
# 90 s and 0.85 GB on two cores; a warm one is a file check.
#
# It needs no database server: SQLite files, the embedded NATS JetStream
# (in-process, it opens no port) and the media store all live in DIR/data,
# its log in DIR/data/log/dendrite.log, and what it prints in DIR/out. A
# start on a DIR that has them keeps its users and rooms: the signing key
# is made once, the config is made again each time.
#
# start needs IMCANARYTEST_MATRIX_SECRET, the registration shared secret:
# users are made through POST /_synapse/admin/v1/register (HMAC-SHA1 over
# nonce, user, password and "notadmin"), open registration stays off. The
# secret goes only into DIR/dendrite.yaml, which is private (umask 077).
#
# The config is generate-config's, with federation off, the shared secret
# set and the client API's rate limiting off (on, it answers 429 past 5
# requests per device, or per unauthenticated connection, in 500 ms; only
# admin accounts are exempt).
# Everything else is Dendrite's default: the HTTP listener is the only
# socket it opens, and pprof (PPROFLISTEN) is kept out of its environment.
#
# Passwords are bcrypt at Dendrite's cost 10, as on a real server: with 8
# clients at a time on two cores, 600 registrations take about 40 s and
# 600 logins 21 s. Set IMCANARYTEST_MATRIX_BCRYPT_COST to change it for
# the users made from then on: at 4, the least, 600 take about 5 s.
#
# Only the URL goes to stdout, so that $(...) captures just that.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

version=v0.13.8
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
root=$cache/dendrite-$version
bindir=$root/bin
cmds=(dendrite generate-keys generate-config)

usage() {
  echo "usage: $0 build | start DIR PORT | stop DIR" >&2
  exit 2
}

built() {
  local c
  for c in "${cmds[@]}"; do
    [ -x "$bindir/$c" ] || return 1
  done
}

build() {
  built && return 0
  export PATH="$PATH:/usr/local/go/bin"
  mkdir -p "$cache"
  local tmp c pkgs=()
  tmp=$(mktemp -d)
  # One go install: the three commands of one module at one version share
  # a single build of its packages.
  for c in "${cmds[@]}"; do
    pkgs+=("github.com/matrix-org/dendrite/cmd/$c@$version")
  done
  # go install's messages go to stderr, but make sure: start calls build
  # inside the $(...) that captures the URL.
  if ! (cd "$tmp" && GOFLAGS=-buildvcs=false GOBIN="$tmp/out/bin" go install "${pkgs[@]}") >&2; then
    rm -rf "$tmp"
    return 1
  fi
  # Staged next to its final place and renamed there: a directory rename
  # is atomic, so the cache holds either nothing or a complete build. A
  # concurrent build that got there first wins.
  local stage=$root.new.$$
  rm -rf "$stage"
  mv "$tmp/out" "$stage"
  if ! mv -T "$stage" "$root" 2>/dev/null; then
    rm -rf "$stage"
    built || { rm -rf "$tmp"; echo "could not install into $root" >&2; return 1; }
  fi
  rm -rf "$tmp"
}

# set_secret replaces the empty registration_shared_secret of the config
# on stdin with $IMCANARYTEST_MATRIX_SECRET, as a single-quoted YAML
# string (in which only ' is special, written ''). awk takes the secret
# from its environment, so that it never appears in a command line.
set_secret() {
  awk '
    BEGIN { s = ENVIRON["IMCANARYTEST_MATRIX_SECRET"]; gsub(/\047/, "\047\047", s) }
    $0 == "  registration_shared_secret: \"\"" {
      print "  registration_shared_secret: \047" s "\047"; n++; next
    }
    { print }
    END { exit (n == 1 ? 0 : 1) }
  '
}

# check_config reads the config as Dendrite parsed it (generate-config
# -normalise, which prints it back) and fails unless the edits took:
# a typo in a key or an indent would otherwise leave a default silently.
# Nothing of what it reads is printed: that holds the secret.
check_config() {
  awk -v cost="$1" '
    /^[a-z_]+:/ { top = $1 }
    /^  [a-z_]+:/ { sub2 = $1 }
    top == "global:" && $0 == "  server_name: localhost" { name = 1 }
    top == "global:" && $0 == "  disable_federation: true" { fed = 1 }
    top == "client_api:" && /^  registration_shared_secret: ./ && $0 != "  registration_shared_secret: \"\"" { secret = 1 }
    top == "client_api:" && sub2 == "rate_limiting:" && $0 == "    enabled: false" { rate = 1 }
    top == "user_api:" && $0 == "  bcrypt_cost: " cost { bcrypt = 1 }
    END {
      if (!name) print "server_name is not localhost"
      if (!fed) print "federation is not disabled"
      if (!secret) print "registration_shared_secret is not set"
      if (!rate) print "rate limiting is not disabled"
      if (!bcrypt) print "bcrypt_cost is not " cost
      exit ((name && fed && secret && rate && bcrypt) ? 0 : 1)
    }
  ' >&2
}

start() {
  local dir port=$2 cost=${IMCANARYTEST_MATRIX_BCRYPT_COST:-10}
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  if ! [[ $cost =~ ^[0-9]+$ ]] || [ "$cost" -lt 4 ] || [ "$cost" -gt 31 ]; then
    echo "IMCANARYTEST_MATRIX_BCRYPT_COST must be a number from 4 to 31, not $cost" >&2
    exit 2
  fi
  if [ -z "${IMCANARYTEST_MATRIX_SECRET:-}" ]; then
    echo "IMCANARYTEST_MATRIX_SECRET is not set: it is the registration shared secret" >&2
    exit 2
  fi
  if [[ $IMCANARYTEST_MATRIX_SECRET == *$'\n'* ]]; then
    echo "IMCANARYTEST_MATRIX_SECRET must be a single line" >&2
    exit 2
  fi
  check_ports "$port"
  built || build
  not_running "$dir/pid" dendrite

  # The signing key is made once per DIR. The config, made again each
  # time, names it relative to Dendrite's working directory, which is
  # DIR; every other path in it is under DIR/data, absolute.
  (umask 077 && mkdir -p "$dir/data")
  if [ ! -s "$dir/matrix_key.pem" ]; then
    (umask 077 && "$bindir/generate-keys" -private-key "$dir/matrix_key.pem" >"$dir/generate-keys.log" 2>&1) ||
      { echo "generate-keys failed:" >&2; cat "$dir/generate-keys.log" >&2; exit 1; }
  fi
  # generate-config's own defaults, with four keys changed on the exact
  # lines it writes (rate limiting's "enabled" only within rate_limiting).
  if ! (umask 077 &&
    "$bindir/generate-config" -dir "$dir/data" -server localhost |
    sed -e 's/^  disable_federation: false$/  disable_federation: true/' \
      -e '/^  rate_limiting:$/,/^    enabled:/s/^    enabled: true$/    enabled: false/' \
      -e "s/^  bcrypt_cost: 10\$/  bcrypt_cost: $cost/" |
      set_secret >"$dir/dendrite.yaml.new"); then
    rm -f "$dir/dendrite.yaml.new"
    echo "generate-config failed, or its output has no empty registration_shared_secret" >&2
    exit 1
  fi
  mv "$dir/dendrite.yaml.new" "$dir/dendrite.yaml"
  if ! (cd "$dir" && "$bindir/generate-config" -normalise dendrite.yaml 2>/dev/null) | check_config "$cost"; then
    echo "$dir/dendrite.yaml is not as intended (see above)" >&2
    exit 1
  fi

  # setsid: the server outlives this script in a session of its own, and
  # stop signals exactly the pid recorded here. HTTP on loopback only; no
  # HTTPS (it would only start with a certificate, but its default is
  # every address). The secret and pprof's switch stay out of its
  # environment. umask 077: its databases hold password hashes and access
  # tokens.
  (cd "$dir" && umask 077 && exec setsid env -u IMCANARYTEST_MATRIX_SECRET -u PPROFLISTEN -u DENDRITE_TRACE_HTTP \
    "$bindir/dendrite" -config dendrite.yaml \
    -http-bind-address "127.0.0.1:$port" -https-bind-address "" \
    >"$dir/out" 2>&1 </dev/null) &
  local pid=$!
  echo "$pid" >"$dir/pid"

  # Ready when the client API answers: the listener opens only once the
  # databases and JetStream are up. The port was free before, so whoever
  # answers is our server.
  local url="http://127.0.0.1:$port" why="did not answer within 30 s"
  local deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url/_matrix/client/versions" 2>/dev/null)" = 200 ]; then
      echo "$url"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      why="exited at start"
      break
    fi
    sleep 0.1
  done
  echo "dendrite $why:" >&2
  local log
  for log in "$dir/out" "$dir/data/log/dendrite.log"; do
    if [ -s "$log" ]; then
      echo "--- $log" >&2
      tail -n 40 "$log" >&2
    fi
  done
  stop "$dir"
  exit 1
}

# Dendrite stops its components and JetStream on SIGTERM; past a bound,
# it is killed.
stop() { stop_pidfile "$1/pid" 100; }

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
