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
