#!/usr/bin/env bash
# Starts a real RabbitMQ with the stream plugin for the tests, benchmarks and demo: the 4.3 line
# (Debian forky's rabbitmq-server) unless RABBITMQ_LINE=4.0 (Debian trixie's) asks for the older.
#
#   scripts/rabbitmq.sh up        one node: AMQP 127.0.0.1:5672, stream 127.0.0.1:5552, and over TLS
#                                 AMQP 5671, stream 5551 (certificates: `tls-dir` below)
#   scripts/rabbitmq.sh down      stop what `up` or `cluster` started, unmount the chroot
#   scripts/rabbitmq.sh status    what is running, and where
#   scripts/rabbitmq.sh cluster   three joined nodes on their own ports (see CLUSTER_* below)
#   scripts/rabbitmq.sh node-kill N | node-start N | node-stop N    one cluster node (1..3)
#   scripts/rabbitmq.sh reset     `down`, then delete the brokers' data (keeps the chroot)
#   scripts/rabbitmq.sh streams NODE ARGS…   rabbitmq-streams ARGS on node NODE (rabbit, node1..3),
#                                 e.g. `streams node2 list_stream_group_consumers --stream s --reference r`
#   scripts/rabbitmq.sh coordinator-to N   move the cluster's stream coordinator (its Raft leader)
#                                 to node N (1..3), wait until it is there, print the leader
#   scripts/rabbitmq.sh ctl ARGS…   rabbitmqctl ARGS on the single node (root), e.g. `ctl add_user u p`
#   scripts/rabbitmq.sh tls-dir   print the folder of the test CA and certificates (ca.pem,
#                                 server.pem, client.pem, client-key.pem: its passphrase is in
#                                 client-key.passphrase), made with openssl in the chroot
#
# If a broker already answers on the configured ports it is used as it is (unless it is this
# script's own node of the other line: that one is stopped first, so that a test run asks for a
# line and gets it). Otherwise, as root on Debian, a Debian root is made once per line with
# debootstrap in $STREAM_DEDUP_CACHE (outside the repository): forky for RABBITMQ_LINE=4.3 (the
# default; rabbitmq-server 4.3.x, Erlang 29), trixie for RABBITMQ_LINE=4.0 (4.0.x, Erlang 27);
# Debian's rabbitmq-server is installed in it, and the nodes run in that chroot. Each line keeps its
# own chroot, data and test certificates; one line runs at a time (they share the ports). Why not Debian 12's own package: it is 3.10.8, and rabbitmq-stream-js-client 1.0 sends
# ExchangeCommandVersions, which 3.10 does not know (the broker closes the connection and the
# client throws from its socket handler).
#
# Every listener is bound to 127.0.0.1; Erlang distribution and epmd too.
set -euo pipefail

CACHE=${STREAM_DEDUP_CACHE:-/var/cache/stream-dedup}
LINE=${RABBITMQ_LINE:-4.3}
# line_suite LINE: the Debian suite whose rabbitmq-server is of that line.
line_suite() {
  case "$1" in
    4.3) echo forky ;;
    4.0) echo trixie ;;
    *) return 1 ;;
  esac
}
LINES="4.3 4.0"
SUITE=$(line_suite "$LINE") || {
  printf 'rabbitmq.sh: error: RABBITMQ_LINE=%s: known lines are %s\n' "$LINE" "$LINES" >&2
  exit 2
}
ROOT="$CACHE/$SUITE"
MIRROR=${STREAM_DEDUP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST=127.0.0.1
AMQP_PORT=${RABBITMQ_AMQP_PORT:-5672}
STREAM_PORT=${RABBITMQ_STREAM_PORT:-5552}
AMQP_TLS_PORT=${RABBITMQ_AMQP_TLS_PORT:-5671}
STREAM_TLS_PORT=${RABBITMQ_STREAM_TLS_PORT:-5551}
# The test CA and certificates, inside the chroot (the nodes read them there).
TLS_IN_ROOT=/var/lib/stream-dedup-tls
DIST_PORT=${RABBITMQ_DIST_PORT:-25672}
# Cluster node i (1..3) listens on AMQP CLUSTER_AMQP_BASE+i, stream CLUSTER_STREAM_BASE+i,
# distribution CLUSTER_DIST_BASE+i.
CLUSTER_AMQP_BASE=${CLUSTER_AMQP_BASE:-5680}
CLUSTER_STREAM_BASE=${CLUSTER_STREAM_BASE:-5560}
CLUSTER_DIST_BASE=${CLUSTER_DIST_BASE:-25680}
READY_TIMEOUT=${STREAM_DEDUP_BROKER_TIMEOUT:-120}
# The single node's Erlang name: another name lets a second line run beside the first on other
# ports (the chroots share epmd, which refuses a second `rabbit@localhost`).
NODE=${STREAM_DEDUP_NODE:-rabbit}

log() { printf 'rabbitmq.sh: %s\n' "$*" >&2; }
die() {
  printf 'rabbitmq.sh: error: %s\n' "$*" >&2
  exit 1
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# True when the listener on $1 speaks AMQP 0-9-1: it answers our protocol header with a frame.
speaks_amqp() {
  local reply
  reply=$(timeout 5 bash -c "exec 3<>/dev/tcp/$HOST/$1; printf 'AMQP\x00\x00\x09\x01' >&3; head -c 1 <&3 | od -An -tx1" 2>/dev/null) || return 1
  [[ "$reply" == *01* ]]
}

need_root() {
  [ "$(id -u)" = 0 ] || die "no broker answers on 127.0.0.1:$AMQP_PORT/$STREAM_PORT and starting one needs root (it builds a Debian chroot).
  Run as root, or point the tests at any RabbitMQ >= 4.0 with the stream plugin:
  RABBITMQ_AMQP_PORT=... RABBITMQ_STREAM_PORT=... (see README, Operations)."
  command -v apt-get >/dev/null || die "this script installs RabbitMQ with Debian's apt; on another system start RabbitMQ >= 4.0 yourself (README, Operations)"
}

# --- the chroot ------------------------------------------------------------------------------
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

# Runs a RabbitMQ tool inside the chroot as the rabbitmq user, so that every tool and node shares
# one Erlang cookie in /var/lib/rabbitmq.
as_rabbit() {
  chroot --userspec=rabbitmq:rabbitmq "$ROOT" /usr/bin/env -i \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    ERL_EPMD_ADDRESS=127.0.0.1 "$@"
}

ensure_root() {
  if [ -f "$ROOT/.stream-dedup-ready" ]; then return; fi
  need_root
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
      die "could not install debootstrap with apt-get (no network to the package mirror?)"
  fi
  mkdir -p "$CACHE"
  local tmp="$ROOT.tmp"
  umount_root "$tmp"
  rm -rf "$tmp"
  log "creating a Debian $SUITE root in $ROOT for RabbitMQ $LINE (debootstrap, about 30 s)"
  # An older debootstrap has no script named after a newer suite; sid's builds every current one.
  local script=/usr/share/debootstrap/scripts/$SUITE
  [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
  debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" "$script" >"$CACHE/debootstrap.log" 2>&1 ||
    die "debootstrap failed (no network to $MIRROR?); see $CACHE/debootstrap.log"
  # No service may start during package installation; we start the nodes ourselves.
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod +x "$tmp/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
  log "installing Debian's rabbitmq-server in the chroot (about 10 s)"
  mount_root "$tmp"
  # Check-Valid-Until off: a testing suite's Release is valid for a week only, and a mirror that
  # lags behind it (one here served forky's 27 days past) would otherwise refuse every package.
  if ! chroot "$tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq --no-install-recommends rabbitmq-server openssl' \
    >"$CACHE/apt.log" 2>&1; then
    umount_root "$tmp"
    die "installing rabbitmq-server failed (no network to the package mirror?); see $CACHE/apt.log"
  fi
  umount_root "$tmp"
  local version
  version=$(chroot "$tmp" dpkg-query -W -f '${Version}' rabbitmq-server)
  case "$version" in
    "$LINE".*) ;;
    *) die "Debian $SUITE has rabbitmq-server $version, not of the $LINE line (RABBITMQ_LINE)" ;;
  esac
  touch "$tmp/.stream-dedup-ready"
  mv "$tmp" "$ROOT"
  log "rabbitmq-server $version installed"
}

mount_root() {
  local r=$1
  mountpoint -q "$r/proc" || mount -t proc proc "$r/proc"
  mountpoint -q "$r/dev" || mount --bind /dev "$r/dev"
}

umount_root() {
  local r=$1
  for m in "$r/dev" "$r/proc"; do
    if [ -d "$m" ] && mountpoint -q "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
  done
}

# --- nodes -----------------------------------------------------------------------------------
# make_tls: a CA, a server certificate for localhost and 127.0.0.1, and a client certificate whose
# key has a passphrase, made once with openssl inside the chroot.
make_tls() {
  local dir="$ROOT$TLS_IN_ROOT"
  if [ -f "$dir/.ready" ]; then return; fi
  if [ ! -x "$ROOT/usr/bin/openssl" ]; then
    log "installing openssl in the chroot"
    in_root sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl' >"$CACHE/apt-openssl.log" 2>&1 ||
      die "installing openssl in the chroot failed; see $CACHE/apt-openssl.log"
  fi
  log "making a test CA and certificates in $dir (openssl)"
  rm -rf "$dir" && mkdir -p "$dir"
  local t=$TLS_IN_ROOT
  in_root sh -ec "
    cd $t
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj '/CN=stream-dedup test CA' \
      -keyout ca-key.pem -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' -keyout server-key.pem -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl rand -hex 16 >client-key.passphrase
    openssl req -newkey rsa:2048 -subj '/CN=stream-dedup-client' -passout file:client-key.passphrase \
      -keyout client-key.pem -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
      -extfile client.ext -out client.pem 2>/dev/null
    rm -f server.csr client.csr server.ext client.ext ca.srl
  "
  in_root chown -R rabbitmq:rabbitmq "$t"
  chmod 0755 "$dir"
  chmod 0644 "$dir"/*.pem "$dir/client-key.passphrase"
  touch "$dir/.ready"
}

# write_node NAME AMQP STREAM [AMQP_TLS STREAM_TLS]: config, data and log folders for one node.
write_node() {
  local name=$1 amqp=$2 stream=$3 amqp_tls=${4:-} stream_tls=${5:-}
  local dir="$ROOT/var/lib/stream-dedup/$name"
  mkdir -p "$dir/mnesia" "$dir/log"
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$amqp
stream.listeners.tcp.1 = 127.0.0.1:$stream
# Publisher connections dial the host and port the broker advertises.
stream.advertised_host = localhost
stream.advertised_port = $stream
management.tcp.ip = 127.0.0.1
log.file.level = warning
log.console = false
EOF
  if [ -n "$amqp_tls" ]; then
    cat >>"$dir/rabbitmq.conf" <<EOF
listeners.ssl.1 = 127.0.0.1:$amqp_tls
stream.listeners.ssl.1 = 127.0.0.1:$stream_tls
stream.advertised_tls_port = $stream_tls
ssl_options.cacertfile = $TLS_IN_ROOT/ca.pem
ssl_options.certfile = $TLS_IN_ROOT/server.pem
ssl_options.keyfile = $TLS_IN_ROOT/server-key.pem
# A client certificate is checked when one is presented; logins stay user and password.
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
EOF
  fi
  echo '[rabbitmq_stream].' >"$dir/enabled_plugins"
  in_root chown -R rabbitmq:rabbitmq "/var/lib/stream-dedup"
}

node_running() { as_rabbit rabbitmqctl -q -n "$1@localhost" status >/dev/null 2>&1; }

# start_node NAME AMQP STREAM DIST [AMQP_TLS STREAM_TLS]
start_node() {
  local name=$1 amqp=$2 stream=$3 dist=$4 amqp_tls=${5:-} stream_tls=${6:-}
  if node_running "$name"; then
    log "node $name@localhost already running"
    return
  fi
  for p in "$amqp" "$stream" "$dist" $amqp_tls $stream_tls; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is taken by another process; free it or choose other ports (RABBITMQ_AMQP_PORT, RABBITMQ_STREAM_PORT, RABBITMQ_DIST_PORT, CLUSTER_*_BASE)"
    fi
  done
  write_node "$name" "$amqp" "$stream" "$amqp_tls" "$stream_tls"
  log "starting node $name@localhost (AMQP $amqp, stream $stream${amqp_tls:+, TLS: AMQP $amqp_tls, stream $stream_tls})"
  local dir="/var/lib/stream-dedup/$name"
  setsid chroot --userspec=rabbitmq:rabbitmq "$ROOT" /usr/bin/env -i \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_NODENAME="$name@localhost" RABBITMQ_DIST_PORT="$dist" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" \
    /usr/lib/rabbitmq/bin/rabbitmq-server \
    >"$ROOT/var/lib/stream-dedup/$name/log/console.log" 2>&1 </dev/null 9>&- &
  disown
}

# wait_node NAME STREAM [I…]: until the node has booted and its stream port accepts connections.
# Meanwhile any cluster node nodeI whose boot failed is started again (restart_node): nodes of an
# existing RabbitMQ 4.0 cluster started together can fail the Mnesia consistency check with
# {node_not_running, …} while a peer is still booting (seen once in CI, 2026-12-04); the same start
# once the peers are up succeeds. Every node given, not only NAME: a booting node may wait for the
# tables of a peer that failed. A restart gives the wait a new deadline. The caller waits again
# for every node restarted (restart_count), which may have been one it had already seen ready.
wait_node() {
  local name=$1 stream=$2 deadline=$((SECONDS + READY_TIMEOUT)) i
  shift 2
  until as_rabbit rabbitmqctl -q -n "$name@localhost" await_startup --timeout 5 >/dev/null 2>&1 && port_open "$stream"; do
    for i in "$@"; do
      if boot_failed "node$i"; then
        # shellcheck disable=SC2046
        restart_node "node$i" $(cluster_ports "$i") -- "$@"
        deadline=$((SECONDS + READY_TIMEOUT))
      fi
    done
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$ROOT/var/lib/stream-dedup/$name/log/console.log" >&2 || true
      die "node $name@localhost did not become ready within ${READY_TIMEOUT}s; log above, more in $ROOT/var/lib/stream-dedup/$name/log"
    fi
    sleep 1
  done
  log "node $name@localhost ready (stream 127.0.0.1:$stream)"
}

# boot_failed NAME: NAME's last boot failed (its console, truncated at each start, says the VM
# terminated) and this run of the script has started it again fewer than twice.
declare -A RESTARTS=()
boot_failed() {
  [ "${RESTARTS[$1]:-0}" -lt 2 ] && grep -q "Kernel pid terminated" "$ROOT/var/lib/stream-dedup/$1/log/console.log" 2>/dev/null
}

restart_count() {
  local n=0 k
  for k in "${!RESTARTS[@]}"; do n=$((n + RESTARTS[$k])); done
  echo "$n"
}

# restart_node NAME AMQP STREAM DIST -- I…: starts NAME again once its ports are free and every
# other cluster node nodeI has booted or is down (the race it lost was with a booting peer).
restart_node() {
  local name=$1 amqp=$2 stream=$3 dist=$4 i
  shift 5
  RESTARTS[$name]=$((${RESTARTS[$name]:-0} + 1))
  log "node $name@localhost failed to boot ($(grep -m1 '^error:' "$ROOT/var/lib/stream-dedup/$name/log/console.log" || echo 'see its console.log')); starting it again once its peers have booted"
  for i in "$@"; do
    [ "node$i" = "$name" ] && continue
    # Returns at once for a node that runs or is down; waits while one boots.
    as_rabbit rabbitmqctl -q -n "node$i@localhost" await_startup --timeout 60 >/dev/null 2>&1 || true
  done
  wait_ports_free "$amqp" "$stream" "$dist"
  start_node "$name" "$amqp" "$stream" "$dist"
}

# wait_ports_free PORT…: until no PORT is listening (a node that failed is still writing its
# crash dump), at most 60 s; start_node then refuses loudly any port still taken.
wait_ports_free() {
  local deadline=$((SECONDS + 60)) p busy
  while [ $SECONDS -lt $deadline ]; do
    busy=
    for p in "$@"; do port_open "$p" && busy=1; done
    [ -z "$busy" ] && return 0
    sleep 0.5
  done
}

stop_node() {
  local name=$1
  if node_running "$name"; then
    as_rabbit rabbitmqctl -q -n "$name@localhost" stop >/dev/null 2>&1 || kill_node "$name"
  fi
}

kill_node() {
  local pidfile="$ROOT/var/lib/stream-dedup/$1/pid" pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$pidfile"
}

# --- commands --------------------------------------------------------------------------------
# stop_other_lines PORT…: stop this script's nodes of another line that listen on one of PORT…
# (the lines share ports; a run that asks for a line must get that line, not silently the other
# one). Nodes of the other line on other ports, and a foreign broker, are left alone.
stop_other_lines() {
  [ "$(id -u)" = 0 ] || return 0
  local l other n p
  for l in $LINES; do
    [ "$l" = "$LINE" ] && continue
    other="$CACHE/$(line_suite "$l")"
    [ -d "$other/var/lib/stream-dedup" ] || continue
    for n in $(ROOT=$other known_nodes); do
      for p in "$@"; do
        if grep -qE "[:=] *127\.0\.0\.1:$p\$|_port = $p\$" "$other/var/lib/stream-dedup/$n/rabbitmq.conf" 2>/dev/null &&
          (ROOT=$other node_running "$n"); then
          log "stopping node $n@localhost of RabbitMQ $l: it holds port $p, which RabbitMQ $LINE needs"
          (ROOT=$other stop_node "$n")
          break
        fi
      done
    done
  done
}

with_lock() {
  mkdir -p "$CACHE" 2>/dev/null || true
  { exec 9>"$CACHE/.lock"; } 2>/dev/null || return 0
  flock -w 600 9 || die "another rabbitmq.sh holds $CACHE/.lock"
}

cmd_up() {
  stop_other_lines "$AMQP_PORT" "$STREAM_PORT"
  if port_open "$AMQP_PORT" && port_open "$STREAM_PORT"; then
    speaks_amqp "$AMQP_PORT" || die "127.0.0.1:$AMQP_PORT is taken by something that does not speak AMQP 0-9-1"
    if [ "$(id -u)" = 0 ] && [ -d "$ROOT" ] && node_running "$NODE" && ! port_open "$STREAM_TLS_PORT"; then
      # Our own node, started by an older version of this script: restart it with TLS listeners.
      log "restarting node $NODE@localhost to add its TLS listeners"
      stop_node "$NODE"
    else
      log "using the broker already listening on 127.0.0.1 (AMQP $AMQP_PORT, stream $STREAM_PORT)"
      log_tls
      return
    fi
  fi
  need_root
  with_lock
  ensure_root
  mount_root "$ROOT"
  make_tls
  start_node "$NODE" "$AMQP_PORT" "$STREAM_PORT" "$DIST_PORT" "$AMQP_TLS_PORT" "$STREAM_TLS_PORT"
  wait_node "$NODE" "$STREAM_PORT"
  port_open "$STREAM_TLS_PORT" && port_open "$AMQP_TLS_PORT" ||
    die "node $NODE@localhost runs but its TLS listeners ($AMQP_TLS_PORT, $STREAM_TLS_PORT) do not answer; see $ROOT/var/lib/stream-dedup/$NODE/log"
  log_tls
}

# log_tls: where the TLS listeners and the test CA are, as a fresh `up` and one on a running broker
# both say (issue 38: the second said nothing).
log_tls() {
  if port_open "$AMQP_TLS_PORT" && port_open "$STREAM_TLS_PORT" && [ -f "$ROOT$TLS_IN_ROOT/ca.pem" ]; then
    log "TLS: AMQP 127.0.0.1:$AMQP_TLS_PORT, stream 127.0.0.1:$STREAM_TLS_PORT; CA and client certificate in $ROOT$TLS_IN_ROOT"
  else
    log "TLS: no listener on 127.0.0.1:$AMQP_TLS_PORT and $STREAM_TLS_PORT with this script's CA (a broker it did not start)"
  fi
}

cluster_ports() { # cluster_ports I -> "AMQP STREAM DIST"
  echo $((CLUSTER_AMQP_BASE + $1)) $((CLUSTER_STREAM_BASE + $1)) $((CLUSTER_DIST_BASE + $1))
}

cmd_cluster() {
  need_root
  # shellcheck disable=SC2046
  stop_other_lines $(cluster_ports 1) $(cluster_ports 2) $(cluster_ports 3)
  with_lock
  ensure_root
  mount_root "$ROOT"
  local i
  for i in 1 2 3; do
    # shellcheck disable=SC2046
    start_node "node$i" $(cluster_ports $i)
  done
  # Until a pass over the three finds every one ready and starts none again: a node started
  # again may be one an earlier wait had seen ready (the join below must not reset a member).
  local ports restarted
  while :; do
    restarted=$(restart_count)
    for i in 1 2 3; do
      read -r -a ports <<<"$(cluster_ports $i)"
      wait_node "node$i" "${ports[1]}" 1 2 3
    done
    [ "$(restart_count)" = "$restarted" ] && break
  done
  for i in 2 3; do
    if as_rabbit rabbitmqctl -q -n "node$i@localhost" cluster_status --formatter json 2>/dev/null | grep -q 'node1@localhost'; then
      continue
    fi
    log "joining node$i to node1"
    as_rabbit rabbitmqctl -q -n "node$i@localhost" stop_app
    as_rabbit rabbitmqctl -q -n "node$i@localhost" reset
    as_rabbit rabbitmqctl -q -n "node$i@localhost" join_cluster node1@localhost
    as_rabbit rabbitmqctl -q -n "node$i@localhost" start_app
  done
  log "cluster of node1..node3@localhost ready; stream ports $((CLUSTER_STREAM_BASE + 1))-$((CLUSTER_STREAM_BASE + 3)), AMQP $((CLUSTER_AMQP_BASE + 1))-$((CLUSTER_AMQP_BASE + 3))"
}

node_index() {
  case "${1:-}" in 1 | 2 | 3) ;; *) die "usage: $0 node-kill|node-start|node-stop 1|2|3" ;; esac
}

cmd_node_start() {
  node_index "${1:-}"
  need_root
  mount_root "$ROOT"
  local ports
  read -r -a ports <<<"$(cluster_ports "$1")"
  start_node "node$1" "${ports[@]}"
  wait_node "node$1" "${ports[1]}" "$1"
}

known_nodes() {
  ls "$ROOT/var/lib/stream-dedup" 2>/dev/null || true
}

cmd_down() {
  [ -d "$ROOT" ] || return 0
  need_root
  local n
  for n in $(known_nodes); do
    if node_running "$n"; then
      log "stopping node $n@localhost"
      stop_node "$n"
    fi
    kill_node "$n"
  done
  # epmd outlives the nodes; it belongs to this chroot's Erlang.
  pkill -f "$ROOT/.*epmd" 2>/dev/null || as_rabbit epmd -kill >/dev/null 2>&1 || true
  umount_root "$ROOT"
}

cmd_status() {
  local rc=0
  if [ -d "$ROOT" ] && [ "$(id -u)" = 0 ]; then
    local n
    for n in $(known_nodes); do
      if node_running "$n"; then echo "$n@localhost: running"; else echo "$n@localhost: stopped"; fi
    done
  fi
  for p in "$AMQP_PORT" "$STREAM_PORT"; do
    if port_open "$p"; then echo "127.0.0.1:$p: listening"; else
      echo "127.0.0.1:$p: closed"
      rc=1
    fi
  done
  return $rc
}

main() {
  case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    cluster) cmd_cluster ;;
    node-start) cmd_node_start "${2:-}" ;;
    node-stop)
      node_index "${2:-}"
      stop_node "node$2"
      ;;
    node-kill)
      node_index "${2:-}"
      kill_node "node$2"
      ;;
    reset)
      cmd_down
      rm -rf "$ROOT/var/lib/stream-dedup" "$ROOT$TLS_IN_ROOT"
      ;;
    tls-dir) echo "$ROOT$TLS_IN_ROOT" ;;
    ctl)
      # rabbitmqctl ARGS… on the single node of this line (root: the chroot's tools and cookie).
      need_root
      [ -d "$ROOT/usr/lib/rabbitmq/bin" ] || die "ctl: no RabbitMQ $LINE chroot in $ROOT (run \`up\` first)"
      as_rabbit rabbitmqctl -q -n "$NODE@localhost" "${@:2}"
      ;;
    streams)
      [ -n "${2:-}" ] || die "streams: which node (rabbit, node1, node2, node3)?"
      # The CLI finds the stream plugin's commands through the node's enabled-plugins file and
      # the plugins folder, which it does not find by itself.
      as_rabbit RABBITMQ_ENABLED_PLUGINS_FILE="/var/lib/stream-dedup/$2/enabled_plugins" \
        RABBITMQ_PLUGINS_DIR="$(cd "$ROOT" && echo usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins | sed 's|^|/|')" \
        rabbitmq-streams -q -n "$2@localhost" "${@:3}"
      ;;
    coordinator-to)
      [[ "${2:-}" =~ ^[123]$ ]] || die "coordinator-to: which node (1, 2, 3)?"
      local target="node$2@localhost" leader tries=0
      # During an election ra:members has no leader to name: `none`, asked again.
      local ask='case ra:members({rabbit_stream_coordinator, node()}) of {ok, _, {_, L}} -> L; _ -> none end.'
      for ((;;)); do
        # Asked of a node other than the target, in case the target is the one that lags.
        leader=$(as_rabbit rabbitmqctl -q -n "node$(( $2 % 3 + 1 ))@localhost" eval "$ask" 2>/dev/null) ||
          die "coordinator-to: node$(( $2 % 3 + 1 )) does not answer (is the cluster up? scripts/rabbitmq.sh cluster)"
        [ "$leader" = "$target" ] && break
        (( ++tries <= 50 )) || die "coordinator-to: the stream coordinator stays on $leader"
        # Once per second (the transfer is asynchronous; there is no event to wait on).
        if [ "$leader" != none ] && (( tries % 5 == 1 )); then
          as_rabbit rabbitmqctl -q -n "$leader" eval \
            "ra:transfer_leadership({rabbit_stream_coordinator, '$leader'}, {rabbit_stream_coordinator, '$target'})." \
            >/dev/null 2>&1 || echo "rabbitmq.sh: coordinator-to: $leader refused the transfer; asking again" >&2
        fi
        sleep 0.2
      done
      echo "$leader"
      ;;
    *)
      sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

# Sourced (scripts/nemesis.sh uses the chroot functions above): define only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
