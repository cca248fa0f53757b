#!/usr/bin/env bash
# Builds, starts and stops a Mattermost v6.7.2 (mattermost-server, team
# edition) on loopback, with a private PostgreSQL 15 cluster of its own, for
# imcanary's integration tests: REST to send, WebSocket to receive.
#
#   .ci/mattermost.sh build                   # binary and assets into the cache (skipped if there)
#   .ci/mattermost.sh start DIR PORT [PGPORT] # cluster, config, files and logs under DIR; prints the URL
#   .ci/mattermost.sh stop DIR
#
# Mattermost's source is AGPL-3.0 (model/, i18n/ and templates/ are
# Apache-2.0): it runs here as a separate server and none of its code is
# imported. `go install …@v6.7.2` is refused (the proxy answers 403 on the
# module's version list, which go install reads for deprecation notices),
# so the build goes through a throwaway wrapper module that requires the
# exact version, which the proxy serves. Go 1.26 links it only with
# -checklinkname=0 (golang.org/x/net/internal/socket reaches for
# syscall.recvmsg). Mattermost's own replace and exclude lines are copied
# into the wrapper, and the binary then holds exactly the versions of
# Mattermost's vendor/modules.txt. A cold build (downloads included) took
# 3 min and 1 GB on two busy cores; a warm one is a file check.
#
# PostgreSQL comes from Debian (apt-get install postgresql-15); nothing is
# installed here. The cluster listens on 127.0.0.1:PGPORT, by default
# PORT+37400 (18065 gives 55465; tinode.sh's default is 55432), with its
# socket in DIR/postgres and durability off (fsync, synchronous_commit): a
# test database that a crash may lose. PostgreSQL refuses to run as root,
# so as root the cluster runs as user postgres, and DIR and its parents are
# made searchable (o+x) for it where they are not.
#
# The server keeps its settings in DIR/config/config.json, which it fills
# with its defaults (and its generated salts) on the first start; every
# setting that matters here comes from the environment, which overrides
# the file on each start and is never written into it. A restart on the
# same DIR keeps users, teams, channels, posts and sessions (tokens).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

version=v6.7.2
module=github.com/mattermost/mattermost-server/v6
cache=${IMCANARY_CACHE:-/var/cache/imcanary}
root=$cache/mattermost-$version
pgoffset=37400
# The directories the server finds relative to its working directory
# (fileutils.FindDir): translations (loaded at start, before the store),
# e-mail and error-page templates, and the font of generated avatars.
assets="i18n templates fonts"

usage() {
  echo "usage: $0 build | start DIR PORT [PGPORT] | stop DIR" >&2
  exit 2
}

built() {
  [ -x "$root/bin/mattermost" ] && [ -d "$root/i18n" ] && [ -d "$root/templates" ] && [ -d "$root/fonts" ]
}

build() {
  built && return 0
  export PATH="$PATH:/usr/local/go/bin"
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d)
  # Go ignores replace and exclude directives in a dependency's go.mod:
  # these are Mattermost's own (go.mod:136-147), so that the wrapper
  # resolves the same versions as Mattermost's build.
  cat >"$tmp/go.mod" <<EOF
module imcanary.invalid/mattermost-wrapper

go 1.16

require $module $version

replace github.com/Masterminds/squirrel v1.5.2 => github.com/lieut-data/squirrel v1.5.4

exclude (
	github.com/RoaringBitmap/roaring v0.7.0
	github.com/RoaringBitmap/roaring v0.7.1
	github.com/willf/bitset v1.2.0
)
EOF
  if ! (cd "$tmp" &&
    GOFLAGS="-mod=mod -buildvcs=false" go build -ldflags=-checklinkname=0 -o "$tmp/out/bin/mattermost" \
      "$module/cmd/mattermost"); then
    rm -rf "$tmp"
    return 1
  fi
  # The module cache is read-only: the copy is made writable so that it
  # can be removed again.
  local src a
  src=$(cd "$tmp" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$module")
  for a in $assets; do
    cp -R "$src/$a" "$tmp/out/$a"
  done
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

start() {
  local dir port pgport
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  port=$2
  check_ports "$port"
  pgport=${3:-$((port + pgoffset))}
  if [ "$pgport" -gt 65535 ]; then
    echo "PostgreSQL port $pgport (PORT+$pgoffset) is out of range: give PGPORT" >&2
    exit 2
  fi
  [ -x "$pgbin/initdb" ] || { echo "PostgreSQL 15 is not installed (apt-get install postgresql-15)" >&2; exit 1; }
  built || build
  not_running "$dir/mattermost.pid" mattermost
  check_ports "$port" "$pgport"

  local pgdir=$dir/postgres
  # Mattermost opens up to MaxOpenConns (100, below) connections, plus a
  # few for its migrations and jobs.
  pg_start "$pgdir" "-c listen_addresses=127.0.0.1 -p $pgport -k $pgdir -c max_connections=150" || exit 1
  # Trust authentication: the password is never checked.
  local psql=("$pgbin/psql" -X -q -h 127.0.0.1 -p "$pgport" -U postgres -d postgres -v ON_ERROR_STOP=1)
  if [ "$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'mattermost'")" != 1 ]; then
    if ! "${psql[@]}" -c "CREATE DATABASE mattermost" >/dev/null; then
      echo "could not create the database" >&2
      stop "$dir"
      exit 1
    fi
  fi

  # Written once, empty: the server fills in its defaults and generated
  # salts and writes the file back, so it must be writable, and it is kept
  # for a restart.
  mkdir -p "$dir/config" "$dir/data" "$dir/logs"
  if [ ! -s "$dir/config/config.json" ]; then
    (umask 077 && echo '{}' >"$dir/config/config.json")
  fi
  local a
  for a in $assets; do
    ln -sfn "$root/$a" "$dir/$a"
  done

  # Loopback only, and nothing that opens another port or a socket (metrics
  # on :8067, cluster gossip on :8074, local mode's socket), nothing that
  # reaches the internet (telemetry, security-fix alerts, notices, the
  # plugin marketplace, link previews of URLs in posts, push and e-mail
  # notifications), and no static web app: without the client/ directory it
  # would serve the working directory itself. An open server, so that any
  # client can sign up (the first user becomes system admin); no rate limit;
  # no plugins. The team limits are lifted: MaxUsersPerTeam is 50 by
  # default. Passwords need only 5 characters (the least Mattermost
  # allows); by default they need 10, with a lower- and an upper-case
  # letter, a digit and a symbol. Console logging at INFO goes to DIR/mattermost.log; the file
  # log is DIR/logs/mattermost.log.
  local url=http://127.0.0.1:$port
  local mmenv=(
    "MM_SQLSETTINGS_DRIVERNAME=postgres"
    "MM_SQLSETTINGS_DATASOURCE=postgres://postgres:postgres@127.0.0.1:$pgport/mattermost?sslmode=disable&connect_timeout=10"
    "MM_SQLSETTINGS_MAXOPENCONNS=100"
    "MM_SQLSETTINGS_MAXIDLECONNS=50"
    "MM_SERVICESETTINGS_LISTENADDRESS=127.0.0.1:$port"
    "MM_SERVICESETTINGS_SITEURL=$url"
    "MM_SERVICESETTINGS_WEBSERVERMODE=disabled"
    "MM_SERVICESETTINGS_ENABLELOCALMODE=false"
    "MM_SERVICESETTINGS_LOCALMODESOCKETLOCATION=$dir/mattermost_local.socket"
    "MM_SERVICESETTINGS_ENABLESECURITYFIXALERT=false"
    "MM_SERVICESETTINGS_ENABLELINKPREVIEWS=false"
    "MM_SERVICESETTINGS_ENABLEPERMALINKPREVIEWS=false"
    "MM_SERVICESETTINGS_ENABLEGIFPICKER=false"
    "MM_SERVICESETTINGS_ENABLEUSERACCESSTOKENS=true"
    "MM_SERVICESETTINGS_ENABLEONBOARDINGFLOW=false"
    "MM_SERVICESETTINGS_ENABLETUTORIAL=false"
    "MM_TEAMSETTINGS_ENABLEOPENSERVER=true"
    "MM_TEAMSETTINGS_ENABLEUSERCREATION=true"
    "MM_TEAMSETTINGS_MAXUSERSPERTEAM=100000"
    "MM_TEAMSETTINGS_MAXCHANNELSPERTEAM=100000"
    "MM_PASSWORDSETTINGS_MINIMUMLENGTH=5"
    "MM_PASSWORDSETTINGS_LOWERCASE=false"
    "MM_PASSWORDSETTINGS_NUMBER=false"
    "MM_PASSWORDSETTINGS_UPPERCASE=false"
    "MM_PASSWORDSETTINGS_SYMBOL=false"
    "MM_RATELIMITSETTINGS_ENABLE=false"
    "MM_PLUGINSETTINGS_ENABLE=false"
    "MM_PLUGINSETTINGS_ENABLEUPLOADS=false"
    "MM_PLUGINSETTINGS_ENABLEMARKETPLACE=false"
    "MM_PLUGINSETTINGS_ENABLEREMOTEMARKETPLACE=false"
    "MM_PLUGINSETTINGS_AUTOMATICPREPACKAGEDPLUGINS=false"
    "MM_PLUGINSETTINGS_DIRECTORY=$dir/plugins"
    "MM_PLUGINSETTINGS_CLIENTDIRECTORY=$dir/client/plugins"
    "MM_METRICSSETTINGS_ENABLE=false"
    "MM_METRICSSETTINGS_LISTENADDRESS=127.0.0.1:0"
    "MM_CLUSTERSETTINGS_ENABLE=false"
    "MM_EXPERIMENTALSETTINGS_ENABLEREMOTECLUSTERSERVICE=false"
    "MM_EXPERIMENTALSETTINGS_ENABLESHAREDCHANNELS=false"
    "MM_LOGSETTINGS_ENABLEDIAGNOSTICS=false"
    "MM_LOGSETTINGS_ENABLESENTRY=false"
    "MM_LOGSETTINGS_CONSOLELEVEL=INFO"
    "MM_LOGSETTINGS_ENABLECOLOR=false"
    "MM_LOGSETTINGS_FILELOCATION=$dir/logs/"
    "MM_NOTIFICATIONLOGSETTINGS_ENABLECONSOLE=false"
    "MM_NOTIFICATIONLOGSETTINGS_FILELOCATION=$dir/logs/"
    "MM_ANNOUNCEMENTSETTINGS_ADMINNOTICESENABLED=false"
    "MM_ANNOUNCEMENTSETTINGS_USERNOTICESENABLED=false"
    "MM_EMAILSETTINGS_SENDEMAILNOTIFICATIONS=false"
    "MM_EMAILSETTINGS_REQUIREEMAILVERIFICATION=false"
    "MM_EMAILSETTINGS_SENDPUSHNOTIFICATIONS=false"
    "MM_EMAILSETTINGS_ENABLEEMAILBATCHING=false"
    "MM_EMAILSETTINGS_ENABLEINACTIVITYEMAIL=false"
    "MM_EMAILSETTINGS_ENABLEPREVIEWMODEBANNER=false"
    "MM_FILESETTINGS_DRIVERNAME=local"
    "MM_FILESETTINGS_DIRECTORY=$dir/data/"
    "MM_ELASTICSEARCHSETTINGS_ENABLEINDEXING=false"
    "MM_BLEVESETTINGS_ENABLEINDEXING=false"
  )
  # setsid: the server outlives this script in a session of its own, and
  # stop signals exactly the pid recorded here. It runs from DIR, where
  # the assets are. Its log is private.
  (cd "$dir" && umask 077 && exec env "${mmenv[@]}" setsid "$root/bin/mattermost" server \
    --config "$dir/config/config.json" >"$dir/mattermost.log" 2>&1 </dev/null) &
  local pid=$!
  echo "$pid" >"$dir/mattermost.pid"
  # Ready when the ping answers 200 with status OK: the listener opens
  # only after the store is up and its migrations have run (the first
  # start runs them all, which takes a while on a busy machine).
  local deadline=$((SECONDS + 180))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if curl -fsS --max-time 2 "$url/api/v4/system/ping" 2>/dev/null | grep -q '"status":"OK"'; then
      echo "$url"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "mattermost exited at start:" >&2
      tail -n 50 "$dir/mattermost.log" >&2
      stop "$dir"
      exit 1
    fi
    sleep 0.2
  done
  echo "mattermost did not answer $url/api/v4/system/ping within 180s:" >&2
  tail -n 50 "$dir/mattermost.log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  # Mattermost closes its hubs, jobs and database pool on SIGTERM; past a
  # bound, it is killed.
  stop_pidfile "$dir/mattermost.pid" 300
  pg_stop "$dir/postgres/data"
}

case ${1:-} in
build) [ $# -eq 1 ] || usage; build ;;
start)
  if [ $# -lt 3 ] || [ $# -gt 4 ]; then usage; fi
  start "$2" "$3" "${4:-}"
  ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
