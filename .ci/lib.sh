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
