# Shared by the .ci scripts that build a server from source. Sourced, not run.

# cached_go_install PKG@VERSION NAME DEST installs the Go command PKG at
# VERSION (its binary is called NAME) as DEST, unless DEST is there already.
# It is built outside any module, so that the pinned version's own go.mod
# decides every dependency, into a temporary GOBIN, so that a broken build
# leaves no half-written binary where the check would trust it; the result
# is copied next to DEST and renamed into place, atomically.
cached_go_install() {
  local pkg=$1 name=$2 dest=$3
  if [ -x "$dest" ]; then
    return 0
  fi
  export PATH="$PATH:/usr/local/go/bin"
  mkdir -p "$(dirname "$dest")"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && GOFLAGS=-buildvcs=false GOBIN="$tmp/bin" go install "$pkg") || { rm -rf "$tmp"; return 1; }
  cp "$tmp/bin/$name" "$dest.new"
  mv "$dest.new" "$dest"
  rm -rf "$tmp"
}

# stop_pidfile FILE [TENTHS] stops the process whose pid FILE holds: a
# SIGTERM, up to TENTHS tenths of a second (default 50) for it to exit,
# then SIGKILL; FILE is removed. Nothing happens without FILE.
stop_pidfile() {
  local file=$1 tenths=${2:-50}
  [ -f "$file" ] || return 0
  local pid
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 "$tenths"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$file"
}

# check_ports P... fails if a port is out of range or something already
# listens on it on loopback: that something would answer a readiness check
# in place of the server being started. Check a PORT alone before doing
# arithmetic on it (PORT+1), so that the arithmetic is on a number.
check_ports() {
  local p
  for p in "$@"; do
    if ! [[ $p =~ ^[0-9]+$ ]] || [ "$p" -lt 1 ] || [ "$p" -gt 65535 ]; then
      echo "$p is not a port (1-65535)" >&2
      exit 2
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "port $p is in use" >&2
      exit 1
    fi
  done
}

# not_running PIDFILE NAME fails if the process PIDFILE names is alive: a
# second start on the same directory would share its files.
not_running() {
  local file=$1 name=$2
  if [ -f "$file" ] && kill -0 "$(cat "$file")" 2>/dev/null; then
    echo "$name is already running in $(dirname "$file") (pid $(cat "$file"))" >&2
    exit 1
  fi
}

# PostgreSQL 15 from Debian, for the servers that keep their data in a
# cluster of their own (Mattermost, Tinode, FerretDB under OpenIM).
pgbin=/usr/lib/postgresql/15/bin

# pg CMD... runs a PostgreSQL program as a user it accepts.
pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# pg_start PGDIR OPTIONS makes a cluster in PGDIR/data (once) and starts
# it with the server options OPTIONS ("-c name=value ..."), its log in
# PGDIR/postgres.log, durability off (fsync, synchronous_commit, full page
# writes: a test server's data is thrown away). On failure it prints why
# and returns 1.
pg_start() {
  local pgdir=$1 opts=$2
  [ -x "$pgbin/initdb" ] || { echo "PostgreSQL 15 is not installed (apt-get install postgresql-15)" >&2; return 1; }
  mkdir -p "$pgdir"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$pgdir"
    # mktemp -d makes 0700 directories: the postgres user must be able to
    # reach its own directory through them.
    local d
    d=$(dirname "$pgdir")
    while [ "$d" != / ]; do
      runuser -u postgres -- test -x "$d" || chmod o+x "$d"
      d=$(dirname "$d")
    done
  fi
  if [ ! -f "$pgdir/data/PG_VERSION" ]; then
    pg "$pgbin/initdb" -D "$pgdir/data" -U postgres --auth=trust -E UTF8 --no-locale --no-sync \
      >"$pgdir/initdb.log" 2>&1 || { cat "$pgdir/initdb.log" >&2; return 1; }
  fi
  if ! pg "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgres.log" -w -t 30 \
    -o "$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start >/dev/null; then
    echo "postgres did not start:" >&2
    cat "$pgdir/postgres.log" >&2 || true
    return 1
  fi
}

# pg_stop DATA stops the cluster whose data directory is DATA, if it runs.
pg_stop() {
  local data=$1 pm
  [ -f "$data/postmaster.pid" ] || return 0
  pm=$(head -n 1 "$data/postmaster.pid")
  pg "$pgbin/pg_ctl" -D "$data" -m fast -w -t 20 stop >/dev/null 2>&1 || true
  # The postmaster takes its backends with it; if it is still there, it
  # is killed.
  if [ -n "$pm" ] && kill -0 "$pm" 2>/dev/null; then
    kill -9 "$pm" 2>/dev/null || true
  fi
}
