#!/usr/bin/env bash
# Builds, starts and stops a Tinode v0.25.3 (tinode/chat) on loopback, with
# a private PostgreSQL 15 cluster of its own, for imcanary's jsonws mapping
# configs/tinode.yaml.
#
#   .ci/tinode.sh build                   # binaries and templates into the cache (skipped if there)
#   .ci/tinode.sh start DIR PORT [PGPORT] # cluster, config and logs under DIR; prints the URL
#   .ci/tinode.sh stop DIR
#
# Tinode is GPL-3.0: it runs here as a separate server and none of its code
# is imported. `go install github.com/tinode/chat/...@v0.25.3` is refused
# (the proxy answers 403 on the module's version list, which go install
# reads for deprecation notices), so the build goes through a throwaway
# wrapper module that requires the exact version, which the proxy serves.
# A cold build takes about 90 s and 1.2 GB on two cores; a warm one is a
# file check.
#
# PostgreSQL comes from Debian (apt-get install postgresql-15); nothing is
# installed here. The cluster listens on 127.0.0.1:PGPORT, by default
# PORT+39372 (16060 gives 55432), with its socket in DIR/postgres and
# durability off (fsync, synchronous_commit): a test database that a crash
# may lose. PostgreSQL refuses to run as root, so as root the cluster runs
# as user postgres, and DIR and its parents are made searchable (o+x) for
# it where they are not.
#
# Set IMCANARYTEST_TINODE_MAX_SUBSCRIBERS to change the largest group
# (1024 members by default; Tinode's own default is 128).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

version=v0.25.3
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
root=$cache/tinode-$version
# The API key every client sends; it is valid for the default
# api_key_salt, which the config below keeps (Tinode's own loadtest uses
# the same key). It identifies a client application, it grants nothing.
apikey=AQEAAAABAAD_rAp4DJh05a1HAwFT3A6K
apikey_salt='T713/rYYgW7g4m3vG6zGRh7+FM1t0T8j13koXScOAj4='

usage() {
  echo "usage: $0 build | start DIR PORT [PGPORT] | stop DIR" >&2
  exit 2
}

built() {
  [ -x "$root/bin/server" ] && [ -x "$root/bin/tinode-db" ] && [ -d "$root/templ" ]
}

build() {
  built && return 0
  export PATH="$PATH:/usr/local/go/bin"
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d)
  # Tinode's go.mod has no replace directives, so the wrapper needs none.
  cat >"$tmp/go.mod" <<EOF
module imcanary.invalid/tinode-wrapper

go 1.26.0

require github.com/tinode/chat $version
EOF
  if ! (cd "$tmp" &&
    GOFLAGS=-mod=mod go mod download all &&
    GOFLAGS="-mod=mod -buildvcs=false" go build -tags postgres -o "$tmp/out/bin/" \
      github.com/tinode/chat/server github.com/tinode/chat/tinode-db); then
    rm -rf "$tmp"
    return 1
  fi
  # The server loads its e-mail and SMS templates from ./templ, relative to
  # its working directory. The module cache is read-only: the copy is made
  # writable so that it can be removed again.
  local src
  src=$(cd "$tmp" && go env GOMODCACHE)/github.com/tinode/chat@$version/server/templ
  cp -R "$src" "$tmp/out/templ"
  chmod -R u+w "$tmp/out"
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

# A random base64 key of N bytes, kept in DIR/NAME so that a restart on
# the same DIR finds its users (uid_key) and tokens (token key) valid.
key() {
  local dir=$1 name=$2 bytes=$3
  if [ ! -s "$dir/$name" ]; then
    (umask 077 && head -c "$bytes" /dev/urandom | base64 -w0 >"$dir/$name")
  fi
  cat "$dir/$name"
}

start() {
  local dir port pgport
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  port=$2
  pgport=${3:-$((port + 39372))}
  if [ "$pgport" -gt 65535 ]; then
    echo "PostgreSQL port $pgport is out of range: give PGPORT" >&2
    exit 2
  fi
  [ -x "$pgbin/initdb" ] || { echo "PostgreSQL 15 is not installed (apt-get install postgresql-15)" >&2; exit 1; }
  built || build
  if [ -f "$dir/tinode.pid" ] && kill -0 "$(cat "$dir/tinode.pid")" 2>/dev/null; then
    echo "tinode already running in $dir (pid $(cat "$dir/tinode.pid"))" >&2
    exit 1
  fi
  local p
  for p in "$port" "$pgport"; do
    # Something else on the port would answer the readiness checks below.
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "port $p is in use" >&2
      exit 1
    fi
  done

  local pgdir=$dir/postgres
  pg_start "$pgdir" "-c listen_addresses=127.0.0.1 -p $pgport -k $pgdir -c max_connections=200" || exit 1

  local uid_key token_key maxsub=${IMCANARYTEST_TINODE_MAX_SUBSCRIBERS:-1024}
  uid_key=$(key "$dir" uid_key 16)
  token_key=$(key "$dir" token_key 32)
  local store
  # Trust authentication: the password is never checked, but the adapter
  # wants one. 50 connections, as Tinode's sample config has.
  store=$(cat <<EOF
{
    "uid_key": "$uid_key",
    "max_results": 1024,
    "use_adapter": "postgres",
    "adapters": {
      "postgres": {
        "user": "postgres", "passwd": "postgres",
        "host": "127.0.0.1", "port": "$pgport", "dbname": "tinode",
        "ssl_mode": "disable",
        "max_open_conns": 50, "max_idle_conns": 50,
        "conn_max_lifetime": 60, "sql_timeout": 10
      }
    }
  }
EOF
  )
  (umask 077 && printf '{"store_config": %s}\n' "$store" >"$dir/db.conf")
  # Creates the database and its schema; on a DIR that has them, checks
  # the schema version and changes nothing.
  if ! "$root/bin/tinode-db" -config="$dir/db.conf" >"$dir/tinode-db.log" 2>&1; then
    echo "tinode-db failed:" >&2
    cat "$dir/tinode-db.log" >&2
    stop "$dir"
    exit 1
  fi

  # Our own config, not Tinode's sample: loopback only, no gRPC (its
  # default port would be taken), no static files, no media uploads, no
  # push, no cluster. No credential validation: the sample requires e-mail
  # at the auth level, and {acc} then fails with 422 until a code sent by
  # mail is confirmed; with "required" empty the validator is skipped
  # altogether. The account GC would remove unvalidated accounts.
  # max_subscriber_count is the largest group (the sample's 128 is smaller
  # than the groups imcanary's layouts ask for). Logins are bcrypt at
  # Go's default cost, which no setting changes: about 60 ms of CPU each.
  (umask 077 && cat >"$dir/tinode.conf" <<EOF
{
  "listen": "127.0.0.1:$port",
  "api_path": "/",
  "grpc_listen": "",
  "static_mount": "/",
  "api_key_salt": "$apikey_salt",
  "max_message_size": 262144,
  "max_subscriber_count": $maxsub,
  "max_tag_count": 16,
  "permanent_accounts": false,
  "expvar": "",
  "server_status": "",
  "use_x_forwarded_for": false,
  "p2p_delete_enabled": true,
  "auth_config": {
    "logical_names": [],
    "basic": {"add_to_tags": true, "min_login_length": 4, "min_password_length": 6},
    "token": {"expire_in": 1209600, "serial_num": 1, "key": "$token_key"}
  },
  "store_config": $store,
  "acc_validation": {
    "email": {"add_to_tags": true, "required": []}
  },
  "acc_gc_config": {"enabled": false},
  "push": [],
  "webrtc": {"enabled": false}
}
EOF
  )
  ln -sfn "$root/templ" "$dir/templ"
  # setsid: the server outlives this script in a session of its own, and
  # stop signals exactly the pid recorded here. It runs from DIR, where
  # ./templ is. Its log is private: Tinode logs every message it reads,
  # {login} secrets (base64 of login:password) included.
  (cd "$dir" && umask 077 && exec setsid "$root/bin/server" -config="$dir/tinode.conf" -static_data="" \
    >"$dir/tinode.log" 2>&1 </dev/null) &
  local pid=$!
  echo "$pid" >"$dir/tinode.pid"
  # Ready when the WebSocket endpoint completes an upgrade: the listener
  # opens only once the store is up.
  local http="http://127.0.0.1:$port/v0/channels?apikey=$apikey"
  # curl holds the upgraded connection until --max-time and then fails
  # (28), hence the "|| true" under pipefail.
  local deadline=$((SECONDS + 20))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if { curl -sS -i -N --max-time 0.5 -o - \
      -H "Connection: Upgrade" -H "Upgrade: websocket" -H "Sec-WebSocket-Version: 13" \
      -H "Sec-WebSocket-Key: aW1jYW5hcnktdGlub2RlIQ==" "$http" 2>/dev/null || true; } |
      head -n 1 | grep -q " 101"; then
      echo "ws://127.0.0.1:$port/v0/channels?apikey=$apikey"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "tinode exited at start:" >&2
      cat "$dir/tinode.log" >&2
      stop "$dir"
      exit 1
    fi
    sleep 0.1
  done
  echo "tinode did not answer $http within 20s:" >&2
  cat "$dir/tinode.log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  # Tinode shuts down its topics and sessions on SIGTERM; past a bound,
  # it is killed.
  stop_pidfile "$dir/tinode.pid" 100
  pg_stop "$dir/postgres/data"
}

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start) [ $# -ge 3 ] && [ $# -le 4 ] || usage; start "$2" "$3" "${4:-}" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
