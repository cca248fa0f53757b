#!/usr/bin/env bash
# Starts and stops a Prosody 0.12 on loopback for the integration tests of
# probe/xmpp.
#
#   .ci/prosody.sh start DIR [HTTP_PORT [C2S_PORT]]  # config, data and logs under DIR; prints the URL
#   .ci/prosody.sh stop DIR
#
# Nothing is installed here: CI installs the Debian packages (prosody
# lua-unbound lua-sec) first. The Debian package may have started a system
# Prosody with the distribution's config (mod_limits throttles c2s to
# 10 kB/s there, which shows up as latency); it is stopped, and ours uses
# its own ports, pidfile and data, so the two never share anything.
#
# HTTP_PORT (default 5280) serves the WebSocket endpoint; C2S_PORT
# (default HTTP_PORT+2) is the plain c2s listener, which the tests do not
# use but Prosody always opens. Set IMCANARYTEST_PROSODY_SEND_TIMEOUT to
# make Prosody drop a reader that stops reading sooner than its 180 s, and
# IMCANARYTEST_PROSODY_ARCHIVE=1 to archive messages (XEP-0313), which
# catch-up reads. Archiving is off otherwise: with it, Prosody 0.12 takes
# about 20 times longer per message (p50 delivery 36 ms against 1.7 s for
# 500 users at 3 msg/s in TestProsodyPopulation, archives in memory or in
# files alike), which would make the load tests measure the archive.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [HTTP_PORT [C2S_PORT]] | stop DIR" >&2
  exit 2
}

start() {
  local dir port c2s
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  port=${2:-5280}
  c2s=${3:-$((port + 2))}
  command -v prosody >/dev/null || { echo "prosody is not installed (apt-get install prosody lua-unbound lua-sec)" >&2; exit 1; }
  if [ -f "$dir/prosody.pid" ] && kill -0 "$(cat "$dir/prosody.pid")" 2>/dev/null; then
    echo "prosody already running in $dir (pid $(cat "$dir/prosody.pid"))" >&2
    exit 1
  fi
  # The packaged service, if the postinst started one; never ours.
  prosodyctl stop >/dev/null 2>&1 || true
  # Something else on the port would answer the readiness check below.
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is in use" >&2
    exit 1
  fi
  mkdir -p "$dir/data" "$dir/certs"
  local archive_module="" archive_settings="" archive_muc=""
  if [ -n "${IMCANARYTEST_PROSODY_ARCHIVE:-}" ]; then
    archive_module='	"mam";'
    # mod_mam: archive every user's messages, keep them a week (Debian's
    # setting), pages of at most 50; the archives in memory, since a test
    # server's are thrown away.
    archive_settings='default_archive_policy = true
archive_expires_after = "1w"
max_archive_query_results = 50
storage = { archive = "memory"; muc_log = "memory" }'
    # Every room's messages archived, as mod_mam does a user's. A room
    # that vanishes takes its archive with it.
    archive_muc='	modules_enabled = { "muc_mam" }
	muc_log_by_default = true
	muc_log_expires_after = "1w"'
  fi
  local send_timeout=""
  if [ -n "${IMCANARYTEST_PROSODY_SEND_TIMEOUT:-}" ]; then
    send_timeout="network_settings = { send_timeout = ${IMCANARYTEST_PROSODY_SEND_TIMEOUT} }"
  fi
  # Our own config, not Debian's: loopback only, no s2s, no TLS (the
  # WebSocket is declared secure so that SASL PLAIN and in-band
  # registration are offered over plain ws://), no mod_limits, in-band
  # registration without throttling, and rooms that are created unlocked
  # on first join and vanish with their last occupant. Message carbons
  # (XEP-0280), which a user's several devices need, and, when asked for,
  # message archives (XEP-0313) for users and rooms.
  cat >"$dir/prosody.cfg.lua" <<EOF
-- Written by .ci/prosody.sh for imcanary's integration tests.
pidfile = "$dir/prosody.pid"
data_path = "$dir/data"
certificates = "$dir/certs"
run_as_root = true
log = {
	{ levels = { min = "info" }, to = "file", filename = "$dir/prosody.log" };
}

interfaces = { "127.0.0.1" }
local_interfaces = { "127.0.0.1" }
c2s_ports = { $c2s }
c2s_interfaces = { "127.0.0.1" }
s2s_ports = { }
http_ports = { $port }
http_interfaces = { "127.0.0.1" }
https_ports = { }
https_interfaces = { }
http_default_host = "localhost"
$send_timeout

modules_enabled = {
	"roster";
	"saslauth";
	"disco";
	"ping";
	"register";
	"smacks";
	"websocket";
	"carbons";
${archive_module}
}
modules_disabled = { "s2s"; "s2s_auth_certs" }

authentication = "internal_hashed"
default_storage = "internal"
allow_registration = true
min_seconds_between_registrations = 0
c2s_require_encryption = false
allow_unencrypted_plain_auth = true
consider_websocket_secure = true

${archive_settings}

VirtualHost "localhost"

Component "conference.localhost" "muc"
	muc_room_locking = false
	muc_room_default_persistent = false
	-- Past this many live rooms Prosody swaps rooms to disk and back
	-- (default 100; a population of 500 in groups of 5 has 100).
	muc_room_cache_size = 10000
${archive_muc}
EOF
  # setsid: the server outlives this script in a session of its own, and
  # stop signals exactly the pid recorded here (-F keeps it in the
  # foreground of that session, so \$! is Prosody itself).
  setsid prosody --config "$dir/prosody.cfg.lua" -F >"$dir/stdout.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/prosody.pid"
  local url="http://127.0.0.1:$port/xmpp-websocket"
  for _ in $(seq 1 100); do
    # mod_websocket answers a plain GET with a short HTML page.
    if curl -fsS "$url" 2>/dev/null | grep -q "Prosody WebSocket endpoint"; then
      echo "ws://127.0.0.1:$port/xmpp-websocket"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "prosody exited at start:" >&2
      cat "$dir/stdout.log" "$dir/prosody.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  echo "prosody did not answer $url within 10s:" >&2
  cat "$dir/stdout.log" "$dir/prosody.log" >&2 2>/dev/null || true
  stop "$dir"
  exit 1
}

stop() {
  local dir=$1
  [ -f "$dir/prosody.pid" ] || return 0
  local pid
  pid=$(cat "$dir/prosody.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    # Prosody closes every session (system-shutdown) and exits within its
    # shutdown deadline of 5 s; past a bound, it is killed.
    for _ in $(seq 1 80); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$dir/prosody.pid"
}

case ${1:-} in
start) [ $# -ge 2 ] && [ $# -le 4 ] || usage; start "$2" "${3:-}" "${4:-}" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
*) usage ;;
esac
