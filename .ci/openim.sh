#!/usr/bin/env bash
# Builds, starts and stops a real OpenIM v3.8.3 (openimsdk/open-im-server)
# on loopback, with everything it needs, for imcanary's integration tests.
#
#   .ci/openim.sh build               # services and openim-deps into the cache (skipped if there)
#   .ci/openim.sh start DIR BASEPORT  # config, data, logs and pids under DIR; prints "API_URL WS_URL SECRET_FILE FERRETDB_SOCKET"
#   .ci/openim.sh stop DIR
#
# OpenIM is Apache-2.0; it runs here as separate servers and none of its
# code is imported. `go install …/cmd/...@v3.8.3` is refused (the proxy
# answers 403 on the module's version list, which go install reads for
# deprecation notices), so the build goes through a throwaway wrapper
# module that requires the exact version, which the proxy serves.
# open-im-server's go.mod has no replace directives, so the wrapper needs
# none and the binaries hold exactly the versions of its go.sum. A cold
# build (empty module and build caches) took 7.7 min on two cores shared
# with other jobs, 0.52 GB in the cache (plus 1.9 GB of modules); with the
# build cache warm it links in under 2 min, and a built cache is a file
# check. Start takes about 2 s, and the stack holds about 0.5 GB idle.
#
# Ten of its twelve services run (see "services" below); crontask (a daily
# purge of old messages and files) and rpc-third (object storage, client
# log upload) are reached by nothing a test does.
#
# Backing services, all on 127.0.0.1 in the BASEPORT block:
#   - Redis (Debian redis-server), a password from a random secret, no
#     persistence; etcd (Debian etcd-server) as the service registry.
#   - openim-deps (.ci/openim/deps, a module of our own): franz-go's kfake
#     as the Kafka broker, in memory, and FerretDB v1 embedded as the
#     MongoDB, on a PostgreSQL 15 cluster of its own (Debian's, listening
#     only on a Unix socket in DIR/data/postgres, durability off) with a
#     fresh database each start. FerretDB listens on a Unix socket too
#     (DIR/data/mongo.sock, printed last, for mongofix's tests) behind
#     mongofix (.ci/openim/mongofix), which rewrites the commands OpenIM
#     sends that FerretDB v1 cannot run (findAndModify with a projection,
#     with which OpenIM allocates every message's seq, update and
#     aggregation pipelines; see its rewrites), so messages are stored,
#     numbered and pushed. DIR/data/debug.sock serves openim-deps' Go
#     profiles, and its log ends with what each MongoDB command cost.
#
# Ports, BASEPORT+:
#   1 WebSocket gateway   2 HTTP API       3 Redis        4 etcd client
#   5 etcd peer           6 Kafka          7 MongoDB (FerretDB)
#   8 MinIO, 9 webhooks   (named in the config, never listened on)
#   10 msggateway rpc  11 push  12 auth  13 conversation  14 friend
#   15 group  16 msg  17 third (not started)  18 user
#   20-30 Prometheus (turned off: its listeners bind every address)
# The gateway's WebSocket listener is the one exception to loopback-only:
# msggateway's ws_server.go listens on ":PORT", whatever listenIP says.
#
# Every state is fresh on each start (FerretDB, etcd, Redis), and so is
# the API secret, written to DIR/secret (mode 0600) and never printed.
# Only the one line goes to stdout, so that $(...) captures just that.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

version=v3.8.3
module=github.com/openimsdk/open-im-server/v3
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
root=$cache/openim-$version
depsrc=$(cd "$(dirname "$0")/openim/deps" && pwd)

# The services started, in start order, as "binary:package path". The RPC
# services come first so that the gateway and the API find them
# registered; the API starts last and answering is what ready means.
#   rpc-user: users, registration, online status (the gateway sets it)
#   rpc-auth: tokens; the gateway parses and, on a kick, invalidates them
#   rpc-friend: the blacklist check on every single-chat send
#   rpc-group, rpc-conversation: the receive options checked on a send,
#     and /group/create_group
#   rpc-msg: SendMsg (the ack), GetMaxSeq (1001), PullMessageBySeqs (1002)
#   push: the pusher of msgtransfer's output to the gateway (2001), and
#     the gateway's 2003 logout
#   msgtransfer: Kafka to Redis/Mongo with seq allocation, to push
#   msggateway: the WebSocket; api: the HTTP API
services=(
  openim-rpc-user:openim-rpc/openim-rpc-user
  openim-rpc-auth:openim-rpc/openim-rpc-auth
  openim-rpc-friend:openim-rpc/openim-rpc-friend
  openim-rpc-group:openim-rpc/openim-rpc-group
  openim-rpc-conversation:openim-rpc/openim-rpc-conversation
  openim-rpc-msg:openim-rpc/openim-rpc-msg
  openim-push:openim-push
  openim-msgtransfer:openim-msgtransfer
  openim-msggateway:openim-msggateway
  openim-api:openim-api
)
# The names they register in etcd (share.yml rpcRegisterName); start
# waits for every one of them.
registered="user auth friend group conversation msg push messageGateway"

# ferretdb_pg DIR starts FerretDB's PostgreSQL in DIR, on a Unix socket
# there and no TCP port, with a fresh database ferretdb: OpenIM's startup
# makes its indexes again, and its tests count on a server without their
# old data.
ferretdb_pg() {
  local pgdir=$1
  pg_start "$pgdir" "-c listen_addresses= -k $pgdir" || return 1
  pg "$pgbin/psql" -X -q -h "$pgdir" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS ferretdb" -c "CREATE DATABASE ferretdb" >/dev/null
}

usage() {
  echo "usage: $0 build | start DIR BASEPORT | stop DIR" >&2
  exit 2
}

# The deps binary is named by a hash of its source, so that a change to
# .ci/openim/deps builds a new one instead of reusing a stale cache.
depsbin() {
  local h
  h=$(cd "$depsrc/.." && find deps mongofix -name '*.go' ! -name '*_test.go' | LC_ALL=C sort |
    xargs cat deps/go.mod deps/go.sum mongofix/go.mod mongofix/go.sum | sha256sum | cut -c1-16)
  echo "$root/deps-$h/openim-deps"
}

built() {
  local s
  for s in "${services[@]}"; do
    [ -x "$root/bin/${s%%:*}" ] || return 1
  done
  [ -x "$(depsbin)" ]
}

# install_dir SRC DEST renames the finished directory SRC to DEST: a
# directory rename is atomic, so DEST holds either nothing or a complete
# build. A concurrent build that got there first wins.
install_dir() {
  local src=$1 dest=$2 stage=$2.new.$$
  rm -rf "$stage"
  mv "$src" "$stage"
  if ! mv -T "$stage" "$dest" 2>/dev/null; then
    rm -rf "$stage"
    [ -d "$dest" ] || { echo "could not install into $dest" >&2; return 1; }
  fi
}

build() {
  built && return 0
  export PATH="$PATH:/usr/local/go/bin"
  mkdir -p "$cache"
  local tmp s pkgs=()
  tmp=$(mktemp -d)
  # go build's messages go to stderr, but make sure: start calls build
  # inside the $(...) that captures its line.
  if [ ! -d "$root/bin" ]; then
    cat >"$tmp/go.mod" <<EOF
module imcanary.invalid/openim-wrapper

go 1.22.7

require $module $version
EOF
    for s in "${services[@]}"; do
      pkgs+=("$module/cmd/${s#*:}")
    done
    if ! (cd "$tmp" &&
      GOFLAGS=-mod=mod go mod download all &&
      GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -o "$tmp/out/bin/" "${pkgs[@]}") >&2; then
      rm -rf "$tmp"
      return 1
    fi
    install_dir "$tmp/out" "$root" || { rm -rf "$tmp"; return 1; }
  fi
  # Our own module, built from its committed go.sum (-mod=readonly: a
  # go.sum that does not cover it fails instead of being rewritten).
  local deps
  deps=$(depsbin)
  if [ ! -x "$deps" ]; then
    if ! (cd "$depsrc" && GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$tmp/deps/openim-deps" .) >&2; then
      rm -rf "$tmp"
      return 1
    fi
    install_dir "$tmp/deps" "$(dirname "$deps")" || { rm -rf "$tmp"; return 1; }
    # Builds of older sources are of no further use: one is 41 MB.
    find "$root" -maxdepth 1 -name 'deps-*' ! -path "$(dirname "$deps")" -exec rm -rf {} +
  fi
  rm -rf "$tmp"
}

# secret prints 32 random bytes as hex: safe in YAML, JSON and redis.conf
# without quoting.
secret() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# patch_config DIR BASE LOGDIR rewrites the copied config in place: every
# address and port into the block, loopback everywhere, Prometheus off,
# the secrets in. The secrets come from the environment (OIM_SECRET,
# OIM_REDIS_PASSWORD) through awk's ENVIRON, never a command line.
patch_config() {
  local c=$1 b=$2
  local lo=127.0.0.1
  # Files no service reads: Prometheus', Alertmanager's and Grafana's.
  rm -rf "$c/prometheus.yml" "$c/alertmanager.yml" "$c/instance-down-rules.yml" \
    "$c/email.tmpl" "$c/grafana-template" "$c"/README*.md

  # sed_in FILE EXPR... edits FILE and fails unless it changed.
  sed_in() {
    local f=$c/$1
    shift
    cp "$f" "$f.orig"
    sed -i "$@" "$f"
    if cmp -s "$f" "$f.orig"; then
      echo "patch of $f changed nothing: the file is not as expected" >&2
      return 1
    fi
    rm -f "$f.orig"
  }
  # One RPC service's file: its listen and register address, its single
  # port (the lists have several, one per instance; -i 0 takes the first),
  # Prometheus off.
  rpc_in() {
    sed_in "$1" -e "s/^\( *\)registerIP:.*/\1registerIP: $lo/" \
      -e "s/^\( *\)listenIP:.*/\1listenIP: $lo/" \
      -e "/^rpc:/,/^[a-zA-Z]/s/^  ports:.*/  ports: [ $((b + $2)) ]/" \
      -e "/^prometheus:/,/^[a-zA-Z]/s/^  enable:.*/  enable: false/" \
      -e "/^prometheus:/,/^[a-zA-Z]/s/^  ports:.*/  ports: [ $((b + $3)) ]/"
  }

  sed_in discovery.yml -e "s/^  address:.*/  address: [ $lo:$((b + 4)) ]/" || return 1
  sed_in redis.yml -e "s/^address:.*/address: [ $lo:$((b + 3)) ]/" || return 1
  sed_in kafka.yml -e "s/^address:.*/address: [ $lo:$((b + 6)) ]/" || return 1
  # FerretDB has no users here: no credentials, and the URI wins over
  # address and the rest.
  sed_in mongodb.yml -e "s|^uri:.*|uri: mongodb://$lo:$((b + 7))/openim_v3|" \
    -e "s/^address:.*/address: [ $lo:$((b + 7)) ]/" \
    -e "s/^username:.*/username: ''/" -e "s/^password:.*/password: ''/" -e "s/^authSource:.*/authSource: ''/" || return 1
  sed_in minio.yml -e "s/^internalAddress:.*/internalAddress: $lo:$((b + 8))/" \
    -e "s|^externalAddress:.*|externalAddress: http://$lo:$((b + 8))|" || return 1
  sed_in webhooks.yml -e "s|^url:.*|url: http://$lo:$((b + 9))/callbackExample|" || return 1
  # Logs under DIR, at level 3 (warnings and errors). From 4 (info) up
  # (6, debug with SQL, is the shipped value) OpenIM logs every RPC's
  # request and response: the secret of get_admin_token, and tokens.
  sed_in log.yml -e "s|^storageLocation:.*|storageLocation: $3/|" -e "s/^remainLogLevel:.*/remainLogLevel: 3/" \
    -e "s/^isStdout:.*/isStdout: false/" || return 1

  sed_in openim-api.yml -e "s/^  listenIP:.*/  listenIP: $lo/" \
    -e "/^api:/,/^[a-zA-Z]/s/^  ports:.*/  ports: [ $((b + 2)) ]/" \
    -e "/^prometheus:/,/^[a-zA-Z]/s/^  enable:.*/  enable: false/" \
    -e "/^prometheus:/,/^[a-zA-Z]/s/^  ports:.*/  ports: [ $((b + 20)) ]/" \
    -e "s|^  grafanaURL:.*|  grafanaURL: http://$lo:$((b + 20))/|" || return 1
  rpc_in openim-msggateway.yml 10 21 || return 1
  sed_in openim-msggateway.yml -e "/^longConnSvr:/,/^[a-zA-Z]/s/^  ports:.*/  ports: [ $((b + 1)) ]/" || return 1
  sed_in openim-msgtransfer.yml -e "s/^  enable:.*/  enable: false/" -e "s/^  ports:.*/  ports: [ $((b + 22)) ]/" || return 1
  rpc_in openim-push.yml 11 23 || return 1
  rpc_in openim-rpc-auth.yml 12 24 || return 1
  rpc_in openim-rpc-conversation.yml 13 25 || return 1
  rpc_in openim-rpc-friend.yml 14 26 || return 1
  rpc_in openim-rpc-group.yml 15 27 || return 1
  rpc_in openim-rpc-msg.yml 16 28 || return 1
  rpc_in openim-rpc-third.yml 17 29 || return 1
  rpc_in openim-rpc-user.yml 18 30 || return 1
  # rpc-third is not started; were it, "cos" needs no MinIO at start.
  sed_in openim-rpc-third.yml -e "s/^  enable: minio$/  enable: cos/" || return 1

  # The secrets, on the exact lines the shipped files have.
  set_line() {
    local f=$c/$1
    awk -v key="$2" -v var="$3" '
      $0 ~ "^" key ":" { print key ": " ENVIRON[var]; n++; next }
      { print }
      END { exit (n == 1 ? 0 : 1) }
    ' "$f" >"$f.new" || { rm -f "$f.new"; echo "$f has no single $2 line" >&2; return 1; }
    mv "$f.new" "$f"
  }
  set_line share.yml secret OIM_SECRET || return 1
  set_line redis.yml password OIM_REDIS_PASSWORD || return 1
}

# check_config DIR BASE fails unless the patched config is as intended:
# each host:port and each port list in it is in the block, no service
# listens on or registers a non-loopback address, Prometheus is off, and
# the multi-login policy is 1 (a new login on the same platform kicks the
# old one). Nothing of what it reads is printed: share.yml and redis.yml
# hold secrets.
check_config() {
  local c=$1 b=$2
  awk -v lo="$b" -v hi="$((b + 99))" '
    function port(p, where) {
      if (p + 0 < lo || p + 0 > hi) { print FILENAME ": " where " port " p " is outside " lo "-" hi; bad = 1 }
    }
    FNR == 1 { top = "" }
    /^[a-zA-Z]/ { top = $1 }
    /^ *#/ { next }
    {
      line = $0
      while (match(line, /(localhost|[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+):[0-9]+/)) {
        hp = substr(line, RSTART, RLENGTH)
        if (hp !~ /^127\.0\.0\.1:/) { print FILENAME ": address " hp " is not 127.0.0.1"; bad = 1 }
        sub(/.*:/, "", hp); port(hp, "address")
        line = substr(line, RSTART + RLENGTH)
      }
    }
    /^ *ports: *\[/ {
      l = $0; sub(/.*\[/, "", l); sub(/\].*/, "", l)
      n = split(l, ps, /[ ,]+/)
      for (i = 1; i <= n; i++) if (ps[i] != "") port(ps[i], top)
    }
    /^ *(listenIP|registerIP):/ && $2 != "127.0.0.1" { print FILENAME ": " $1 " is \"" $2 "\", not 127.0.0.1"; bad = 1 }
    top == "prometheus:" && /^  enable:/ && $2 != "false" { print FILENAME ": prometheus is enabled"; bad = 1 }
    FILENAME ~ /share\.yml$/ && top == "multiLogin:" && /^  policy:/ { policy = $2 }
    END {
      if (policy != "1") { print "share.yml: multiLogin.policy is \"" policy "\", not 1"; bad = 1 }
      exit bad
    }
  ' "$c"/*.yml >&2
}

# etcd_registered PORT prints the service names registered in etcd under
# openim/, through etcd's JSON gateway (a range over the prefix; "openim0"
# is the key just past every "openim/..." key). Keys are
# openim/NAME/HOST:PORT.
etcd_registered() {
  curl -fsS --max-time 2 -X POST "http://127.0.0.1:$1/v3/kv/range" \
    -d "{\"key\":\"$(printf openim/ | base64)\",\"range_end\":\"$(printf openim0 | base64)\",\"keys_only\":true}" 2>/dev/null |
    grep -o '"key":"[^"]*"' | cut -d'"' -f4 | while read -r k; do printf '%s' "$k" | base64 -d | cut -d/ -f2; echo; done || true
}

# run_bg NAME CMD... starts CMD from DIR in a session of its own (setsid:
# it outlives this script, and stop signals exactly the pid recorded),
# its output in DIR/logs/NAME.out, its pid in DIR/pids/NAME.pid. The
# IMENV_ variables are dropped: OpenIM's config loader lets them
# override any key of the files.
run_bg() {
  local name=$1
  shift
  local unset=() v
  for v in $(compgen -e | grep '^IMENV_' || true); do
    unset+=(-u "$v")
  done
  (cd "$dir" && umask 077 && exec setsid env "${unset[@]}" -u OIM_SECRET -u OIM_REDIS_PASSWORD "$@" \
    >"$dir/logs/$name.out" 2>&1 </dev/null) &
  echo $! >"$dir/pids/$name.pid"
}

# redact copies stdin to stdout with the secrets and anything that looks
# like a JWT (OpenIM's tokens) blanked out: OpenIM's own logs may hold
# them (a failed get_admin_token logs its request), and what fail prints
# ends up in a CI log.
redact() {
  awk '
    BEGIN { s = ENVIRON["OIM_SECRET"]; r = ENVIRON["OIM_REDIS_PASSWORD"] }
    {
      if (s != "") gsub(s, "[secret]")
      if (r != "") gsub(r, "[secret]")
      gsub(/eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+/, "[token]")
      print
    }
  '
}

# fail WHY prints WHY and the tails of the logs to stderr, stops what was
# started and exits non-zero. OpenIM's services write their log to
# DIR/logs/openim-service-log.DATE (all of them, one file) and what they
# print, startup errors included, to DIR/logs/NAME.out.
fail() {
  echo "openim: $1" >&2
  local f
  for f in "$dir"/logs/*; do
    [ -s "$f" ] || continue
    echo "--- $f" >&2
    tail -n 20 "$f" | redact >&2
  done
  stop "$dir"
  exit 1
}

# check_listeners PORT... fails unless every TCP listener of the started
# processes is on 127.0.0.1 and on one of PORT...; the gateway's WebSocket
# port ($ws) may be on every address (see the top). A default port left
# somewhere in the config, or a listener no setting controls, shows here.
check_listeners() {
  command -v ss >/dev/null || return 0
  local pids
  pids=$(cat "$dir"/pids/*.pid | tr '\n' ' ')
  ss -Hltnp | awk -v pids="$pids" -v ports="$*" -v ws="$ws" '
    BEGIN {
      n = split(pids, p, " "); for (i = 1; i <= n; i++) ours[p[i]] = 1
      n = split(ports, q, " "); for (i = 1; i <= n; i++) ok[q[i]] = 1
    }
    {
      mine = 0; rest = $0
      while (match(rest, /pid=[0-9]+/)) {
        if (substr(rest, RSTART + 4, RLENGTH - 4) in ours) mine = 1
        rest = substr(rest, RSTART + RLENGTH)
      }
      if (!mine) next
      addr = $4; port = addr; sub(/.*:/, "", port); host = substr(addr, 1, length(addr) - length(port) - 1)
      if (!(port in ok)) { print "unexpected listener " addr ": " $NF; bad = 1 }
      else if (host != "127.0.0.1" && port != ws) { print "listener " addr " is not on 127.0.0.1: " $NF; bad = 1 }
    }
    END { exit bad }
  ' >&2
}

# alive NAME fails if the process started as NAME has exited.
alive() { kill -0 "$(cat "$dir/pids/$1.pid")" 2>/dev/null; }

# wait_port NAME PORT SECONDS waits for a listener on PORT while NAME runs.
wait_port() {
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then
      return 0
    fi
    alive "$1" || fail "$1 exited at start"
    sleep 0.1
  done
  fail "$1 did not listen on $2 within $3 s"
}

start() {
  local base=$2
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  check_ports "$base"
  if [ "$((base + 30))" -gt 65535 ]; then
    echo "BASEPORT $base: the block BASEPORT..BASEPORT+30 is out of range" >&2
    exit 2
  fi
  command -v redis-server >/dev/null || { echo "redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }
  command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; exit 1; }
  built || build
  local f
  for f in "$dir"/pids/*.pid; do
    [ -f "$f" ] && not_running "$f" "$(basename "$f" .pid)"
  done
  local ws=$((base + 1)) api=$((base + 2)) redis=$((base + 3)) etcdc=$((base + 4)) etcdp=$((base + 5))
  local kafka=$((base + 6)) mongo=$((base + 7))
  local listened=("$ws" "$api" "$redis" "$etcdc" "$etcdp" "$kafka" "$mongo")
  local p
  for p in 10 11 12 13 14 15 16 18; do
    listened+=($((base + p)))
  done
  check_ports "${listened[@]}"

  local t0=$SECONDS
  export PATH="$PATH:/usr/local/go/bin"
  # A fresh state every start; logs of the previous run go with it.
  rm -rf "$dir/config" "$dir/data" "$dir/logs" "$dir/pids" "$dir/secret"
  (umask 077 && mkdir -p "$dir/config" "$dir/data/redis" "$dir/data/etcd" "$dir/logs" "$dir/pids")

  # OpenIM's shipped config, from the module source (the build put it in
  # the module cache; this fetches it again if the cache was cleaned).
  local src
  src=$(cd "$dir" && GOFLAGS='' go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$src/config" ] || { echo "no config/ in the module source ($src)" >&2; exit 1; }
  cp -R "$src/config/." "$dir/config/"
  chmod -R u+w,go-rwx "$dir/config"

  OIM_SECRET=$(secret)
  OIM_REDIS_PASSWORD=$(secret)
  export OIM_SECRET OIM_REDIS_PASSWORD
  (umask 077 && printf '%s\n' "$OIM_SECRET" >"$dir/secret")
  (umask 077 && patch_config "$dir/config" "$base" "$dir/logs") || { rm -rf "$dir/config"; exit 1; }
  check_config "$dir/config" "$base" || { echo "$dir/config is not as intended (see above)" >&2; exit 1; }

  # Redis: loopback, no persistence, the password in its private file.
  (umask 077 && cat >"$dir/data/redis.conf" <<EOF
bind 127.0.0.1
port $redis
protected-mode yes
daemonize no
save ""
appendonly no
dir $dir/data/redis
requirepass $OIM_REDIS_PASSWORD
EOF
  )
  run_bg redis redis-server "$dir/data/redis.conf"
  run_bg etcd etcd --name s1 --data-dir "$dir/data/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcdc" --advertise-client-urls "http://127.0.0.1:$etcdc" \
    --listen-peer-urls "http://127.0.0.1:$etcdp" --initial-advertise-peer-urls "http://127.0.0.1:$etcdp" \
    --initial-cluster "s1=http://127.0.0.1:$etcdp" --log-level warn --logger zap
  ferretdb_pg "$dir/data/postgres" || fail "PostgreSQL for FerretDB did not start"
  local pgurl="postgres://postgres@/ferretdb?host=$dir/data/postgres&sslmode=disable"
  run_bg deps "$(depsbin)" -kafka-port "$kafka" -mongo-port "$mongo" -ferretdb-socket "$dir/data/mongo.sock" \
    -debug-socket "$dir/data/debug.sock" -postgresql-url "$pgurl"
  wait_port redis "$redis" 20
  wait_port etcd "$etcdc" 20
  wait_port deps "$kafka" 20
  wait_port deps "$mongo" 20

  local s name
  for s in "${services[@]}"; do
    name=${s%%:*}
    run_bg "$name" "$root/bin/$name" -i 0 -c "$dir/config/"
  done

  # Ready when every RPC service is registered, the API hands out an
  # admin token for the secret, and the gateway answers HTTP (any status:
  # a request without the login parameters is refused, but answered).
  local deadline=$((SECONDS + 120)) why="did not get ready within 120 s" missing ok_api=0 ok_ws=0
  while [ "$SECONDS" -lt "$deadline" ]; do
    for s in "${services[@]}" redis etcd deps; do
      alive "${s%%:*}" || fail "${s%%:*} exited at start"
    done
    local have
    have=$(etcd_registered "$etcdc" | sort -u | tr '\n' ' ') || true
    missing=""
    for name in $registered; do
      [[ " $have " == *" $name "* ]] || missing+=" $name"
    done
    if [ -z "$missing" ]; then
      # printf is a builtin: the secret is in no process's arguments.
      if [ "$ok_api" = 0 ] && printf '{"secret":"%s","userID":"imAdmin"}' "$OIM_SECRET" |
        curl -sS --max-time 3 -H 'Content-Type: application/json' -H "operationID: imcanary-ready-$$" \
          --data-binary @- "http://127.0.0.1:$api/auth/get_admin_token" 2>/dev/null | grep -q '"errCode":0'; then
        ok_api=1
      fi
      if [ "$ok_ws" = 0 ] && [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$ws/" 2>/dev/null)" != 000 ]; then
        ok_ws=1
      fi
      if [ "$ok_api" = 1 ] && [ "$ok_ws" = 1 ]; then
        check_listeners "${listened[@]}" || fail "a listener is not where the config puts it (see above)"
        unset OIM_SECRET OIM_REDIS_PASSWORD
        echo "openim: ready in $((SECONDS - t0)) s" >&2
        echo "http://127.0.0.1:$api ws://127.0.0.1:$ws $dir/secret $dir/data/mongo.sock"
        return 0
      fi
    fi
    sleep 0.3
  done
  [ -n "$missing" ] && why="$why; not registered in etcd:$missing"
  [ "$ok_api" = 0 ] && why="$why; the API gave no admin token"
  [ "$ok_ws" = 0 ] && why="$why; the gateway did not answer"
  fail "$why"
}

stop() {
  local dir=$1
  [ -d "$dir/pids" ] || return 0
  # The OpenIM services first, together: each stops its servers on SIGTERM
  # (the RPC servers drain for up to 10 s) and is killed after 15 s. Then
  # what they used.
  # Waits name the stopping jobs: when start fails, the servers are
  # this shell's children too, and a bare wait would wait for them.
  local s jobs=()
  for s in "${services[@]}"; do
    stop_pidfile "$dir/pids/${s%%:*}.pid" 150 &
    jobs+=($!)
  done
  wait "${jobs[@]}"
  jobs=()
  for s in deps etcd redis; do
    stop_pidfile "$dir/pids/$s.pid" 100 &
    jobs+=($!)
  done
  wait "${jobs[@]}"
  # FerretDB's PostgreSQL, last: FerretDB has let go of it.
  pg_stop "$dir/data/postgres/data"
}

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
