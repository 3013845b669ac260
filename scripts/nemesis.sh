#!/usr/bin/env bash
# A three-node RabbitMQ cluster whose network can fail: partitions, paused nodes, slow links.
#
#   scripts/nemesis.sh up                 make the network and start the cluster (fresh data)
#   scripts/nemesis.sh down               stop the nodes, delete the network and the data
#   scripts/nemesis.sh status             nodes, links and the faults in force
#   scripts/nemesis.sh cut A B [oneway]   drop packets from A to B (and B to A unless `oneway`);
#                                         A and B are node numbers 1..3 or `client`
#   scripts/nemesis.sh isolate N          cut node N from the other two nodes (clients still reach it)
#   scripts/nemesis.sh heal               print the packets the faults dropped and duplicated
#                                         (`dropped=N duplicated=M`), then remove every fault
#   scripts/nemesis.sh pause N | resume N SIGSTOP / SIGCONT node N's Erlang VM
#   scripts/nemesis.sh slow N RATE LOSS% [DUP%]
#                                         on the link between clients and node N: a rate limit
#                                         both ways (tc tbf and htb, e.g. 2mbit; queueing delay),
#                                         random packet loss and duplication both ways (nftables
#                                         numgen, dup)
#   scripts/nemesis.sh leader-pid N       print node N's Erlang VM pid
#   scripts/nemesis.sh partitions         each node's view: the nodes it runs with, and the network
#                                         partitions it reports (rabbitmqctl cluster_status)
#
# Layout, all made here and removed by `down`: a router namespace `sdn-r` and one namespace per node
# (`sdn-1`..`sdn-3`), each node joined to the router by a veth pair; node N is 10.99.N.2 (host name
# sdnN inside the chroot), with AMQP on 5672 and the stream protocol on 5552 in its namespace. This
# machine's own processes (the tests, the CLI) reach the nodes through a fourth veth pair: they are
# 10.99.0.1, routed to 10.99.0.0/16 through the router. Every packet between two nodes, or between
# a client and a node, crosses the router, where nftables drops what a fault says. Nothing leaves
# the machine: the router has no other link, and refuses (ICMP) any packet for an address outside
# 10.99.0.0/16 (table nemesis_fence, which `heal` leaves alone). The nodes run from the chroot that
# scripts/rabbitmq.sh builds, with Erlang's net_ticktime at 5 s (60 s by default) so that a
# partition or a pause is noticed within ~6 s, and cluster_partition_handling = pause_minority
# (README, Operations). Each node resolves names from /etc/hosts only (ERL_INETRC).
#
# The kernel of this machine has no netem qdisc ("Specified qdisc kind is unknown"): no fixed added
# delay and no reordering. Loss is real (TCP retransmits, as on a lossy link), duplication is real
# (nftables `dup` sends a second copy of the packet), and the rate limit queues packets (delay under
# load). Reordered packets, like duplicated ones, are absorbed by TCP below the client and the
# broker; what they cost above it is delay, which loss and queueing give.
# -E: the ERR trap that removes a half-made network (net_up) also fires inside functions.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/rabbitmq.sh
source "$HERE/rabbitmq.sh"

NET=10.99
TICKTIME=${NEMESIS_NET_TICKTIME:-5}
DATA_IN_ROOT=/var/lib/stream-dedup-nemesis
NODES=(1 2 3)

nlog() { printf "nemesis.sh: [%ss] %s\n" "$SECONDS" "$*" >&2; }
ndie() {
  printf 'nemesis.sh: error: %s\n' "$*" >&2
  exit 1
}

addr_of() { # addr_of 1..3|client
  case "$1" in
    client) echo "$NET.0.1" ;;
    1 | 2 | 3) echo "$NET.$1.2" ;;
    *) ndie "no such end: $1 (1, 2, 3 or client)" ;;
  esac
}

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
ns_exists() { [ -e "/run/netns/$1" ]; }

# As rabbitmq.sh's as_rabbit, inside node N's namespace.
rabbit_in() {
  local n=$1
  shift
  ip netns exec "sdn-$n" chroot --userspec=rabbitmq:rabbitmq "$ROOT" /usr/bin/env -i \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 "$@"
}

ctl() { local n=$1; shift; rabbit_in "$n" rabbitmqctl -q -n "rabbit@sdn$n" "$@"; }

net_up() {
  if ns_exists sdn-r; then return; fi
  local missing=()
  command -v nft >/dev/null || missing+=(nftables)
  { command -v ip >/dev/null && command -v tc >/dev/null; } || missing+=(iproute2)
  command -v ps >/dev/null || missing+=(procps)
  if [ ${#missing[@]} -gt 0 ]; then
    nlog "installing ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
      ndie "could not install ${missing[*]} with apt-get"
  fi
  if ip route show | grep "^$NET\." >/dev/null; then
    ndie "$NET.0.0/16 is already routed on this machine (ip route show); nemesis.sh uses it for its own network"
  fi
  nlog "making namespaces sdn-r, sdn-1..3 and their links ($NET.0.0/16)"
  # Half a network is no network: whatever fails below removes what was made.
  trap 'net_down' ERR
  ip netns add sdn-r
  in_ns sdn-r ip link set lo up
  in_ns sdn-r sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
  # This machine's side: 10.99.0.1.
  ip link add sdn-host type veth peer name to-host netns sdn-r
  ip addr add "$NET.0.1/24" dev sdn-host
  ip link set sdn-host up
  ip route add "$NET.0.0/16" via "$NET.0.2"
  in_ns sdn-r ip addr add "$NET.0.2/24" dev to-host
  in_ns sdn-r ip link set to-host up
  local n
  for n in "${NODES[@]}"; do
    ip netns add "sdn-$n"
    in_ns "sdn-$n" ip link set lo up
    ip link add "n$n" netns sdn-r type veth peer name eth0 netns "sdn-$n"
    in_ns sdn-r ip addr add "$NET.$n.1/24" dev "n$n"
    in_ns sdn-r ip link set "n$n" up
    in_ns "sdn-$n" ip addr add "$NET.$n.2/24" dev eth0
    in_ns "sdn-$n" ip link set eth0 up
    in_ns "sdn-$n" ip route add default via "$NET.$n.1"
  done
  # Drops in an inet table; `dup` works only in an ip one, after the drops.
  in_ns sdn-r nft -f - <<EOF
table inet nemesis {
  chain forward {
    type filter hook forward priority 0; policy accept;
  }
}
table ip nemesis_dup {
  chain forward {
    type filter hook forward priority 10; policy accept;
  }
}
table ip nemesis_fence {
  chain forward {
    type filter hook forward priority -10; policy accept;
    ip daddr != $NET.0.0/16 reject
  }
}
EOF
  trap - ERR
}

net_down() {
  local ns
  for ns in sdn-1 sdn-2 sdn-3 sdn-r; do
    if ns_exists "$ns"; then ip netns del "$ns"; fi
  done
  ip link del sdn-host 2>/dev/null || true
}

node_pid() { cat "$ROOT$DATA_IN_ROOT/sdn$1/pid" 2>/dev/null || true; }

write_nemesis_node() {
  local n=$1 dir="$ROOT$DATA_IN_ROOT/sdn$1"
  mkdir -p "$dir/mnesia" "$dir/log"
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = 0.0.0.0:5672
stream.listeners.tcp.1 = 0.0.0.0:5552
stream.advertised_host = $(addr_of "$n")
stream.advertised_port = 5552
cluster_partition_handling = pause_minority
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = rabbit@sdn1
cluster_formation.classic_config.nodes.2 = rabbit@sdn2
cluster_formation.classic_config.nodes.3 = rabbit@sdn3
loopback_users = none
log.file.level = warning
log.console = false
EOF
  printf '[{kernel, [{net_ticktime, %s}]}].\n' "$TICKTIME" >"$dir/advanced.config"
  echo '[rabbitmq_stream].' >"$dir/enabled_plugins"
  # Names from /etc/hosts only, never DNS: a node looks up the peer of each client connection, and
  # from inside a namespace a DNS query has no answer (measured: 5 s per connection after the first).
  printf '{file, hosts, "/etc/hosts"}.\n{lookup, [file]}.\n' >"$dir/inetrc"
}

start_nemesis_node() {
  local n=$1 dir="$DATA_IN_ROOT/sdn$1"
  local pid
  pid=$(node_pid "$n")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then return; fi
  write_nemesis_node "$n"
  in_root chown -R rabbitmq:rabbitmq "$DATA_IN_ROOT"
  nlog "starting rabbit@sdn$n ($(addr_of "$n"): AMQP 5672, stream 5552)"
  setsid ip netns exec "sdn-$n" chroot --userspec=rabbitmq:rabbitmq "$ROOT" /usr/bin/env -i \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    RABBITMQ_NODENAME="rabbit@sdn$n" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
    ERL_INETRC="$dir/inetrc" \
    /usr/lib/rabbitmq/bin/rabbitmq-server \
    >"$ROOT$dir/log/console.log" 2>&1 </dev/null 9>&- &
  disown
}

wait_nemesis_node() {
  local n=$1 deadline=$((SECONDS + READY_TIMEOUT))
  until ctl "$n" await_startup --timeout 5 >/dev/null 2>&1 &&
    (exec 3<>"/dev/tcp/$(addr_of "$n")/5552") 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$ROOT$DATA_IN_ROOT/sdn$n/log/console.log" >&2 || true
      ndie "rabbit@sdn$n did not become ready within ${READY_TIMEOUT}s; more in $ROOT$DATA_IN_ROOT/sdn$n/log"
    fi
    sleep 1
  done
}

kill_nemesis_nodes() {
  local n pid
  for n in "${NODES[@]}"; do
    pid=$(node_pid "$n")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -9 "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
  done
  # Each namespace's epmd (started by its node) and anything else left in a namespace.
  local ns
  for ns in sdn-1 sdn-2 sdn-3; do
    if ns_exists "$ns"; then
      for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    fi
  done
}

cmd_nemesis_up() {
  need_root
  with_lock
  ensure_root
  mount_root "$ROOT"
  # Every address of this network by name, the clients' too: a node looks up the address of a
  # client that connects (measured: each connection after the first waited 5 s for a DNS answer
  # that cannot come from inside a namespace, and the router refuses it, below).
  if ! grep -q ' sdn-client$' "$ROOT/etc/hosts"; then
    sed -i '/ sdn[0-9]$/d' "$ROOT/etc/hosts"
    local n
    for n in "${NODES[@]}"; do echo "$(addr_of "$n") sdn$n" >>"$ROOT/etc/hosts"; done
    echo "$(addr_of client) sdn-client" >>"$ROOT/etc/hosts"
  fi
  kill_nemesis_nodes
  rm -rf "${ROOT:?}$DATA_IN_ROOT"
  net_up
  heal
  local n
  for n in "${NODES[@]}"; do start_nemesis_node "$n"; done
  # The nodes find each other at boot (classic_config peer discovery): no join_cluster round trips.
  for n in "${NODES[@]}"; do wait_nemesis_node "$n"; done
  local running
  running=$(ctl 1 eval 'length(rabbit_nodes:list_running()).' 2>/dev/null || echo 0)
  [ "$running" = 3 ] || ndie "the nodes did not form one cluster (rabbit@sdn1 sees $running running)"
  nlog "cluster rabbit@sdn1..3 ready: stream $NET.1.2:5552, $NET.2.2:5552, $NET.3.2:5552 (AMQP 5672)"
}

cmd_nemesis_down() {
  kill_nemesis_nodes
  net_down
  [ -d "$ROOT" ] && rm -rf "${ROOT:?}$DATA_IN_ROOT"
  nlog "nodes stopped, namespaces sdn-* and their data removed"
}

drop_rule() { # drop_rule FROM_ADDR TO_ADDR [extra nft matches]
  in_ns sdn-r nft add rule inet nemesis forward ip saddr "$1" ip daddr "$2" "${@:3}" counter drop
}

cut() {
  local a b
  a=$(addr_of "$1")
  b=$(addr_of "$2")
  drop_rule "$a" "$b"
  [ "${3:-}" = oneway ] || drop_rule "$b" "$a"
}

# The packets a chain's rules counted (every fault rule has a counter).
counted() { in_ns sdn-r nft list chain "$1" "$2" forward | grep -o 'counter packets [0-9]*' | awk '{ n += $3 } END { print n + 0 }'; }

# Bytes a rate limit let through (htb class 1:20 on a router link; 0 when there is none).
limited() { in_ns sdn-r tc -s class show dev "$1" classid 1:20 2>/dev/null | awk '/Sent/ { print $2; f = 1 } END { if (!f) print 0 }'; }

# Prints what the faults in force did (`dropped=N duplicated=M limited=B`: packets, packets, and
# bytes through rate limits), then removes them.
heal() {
  local n bytes=0
  for n in to-host "${NODES[@]/#/n}"; do bytes=$((bytes + $(limited "$n"))); done
  echo "dropped=$(counted inet nemesis) duplicated=$(counted ip nemesis_dup) limited=$bytes"
  in_ns sdn-r nft flush chain inet nemesis forward
  in_ns sdn-r nft flush chain ip nemesis_dup forward
  local n
  for n in "${NODES[@]}"; do in_ns sdn-r tc qdisc del dev "n$n" root 2>/dev/null || true; done
  in_ns sdn-r tc qdisc del dev to-host root 2>/dev/null || true
}

slow() {
  local n=$1 rate=$2 loss=$3 dup=${4:-0} node client
  node=$(addr_of "$n")
  client=$(addr_of client)
  # Both directions queue at the router, on the link they leave by: the clients' packets to node N
  # on N's link, N's packets to the clients on theirs. Only those (htb class 1:20, chosen by source
  # address): traffic between the nodes, and the other nodes' to the clients, go at full speed.
  limit_from "n$n" "$client" "$rate"
  limit_from to-host "$node" "$rate"
  if [ "$loss" -gt 0 ]; then
    drop_rule "$client" "$node" numgen random mod 100 "<" "$loss"
    drop_rule "$node" "$client" numgen random mod 100 "<" "$loss"
  fi
  if [ "$dup" -gt 0 ]; then
    in_ns sdn-r nft add rule ip nemesis_dup forward ip saddr "$client" ip daddr "$node" \
      numgen random mod 100 "<" "$dup" counter dup to "$node" device "n$n"
    in_ns sdn-r nft add rule ip nemesis_dup forward ip saddr "$node" ip daddr "$client" \
      numgen random mod 100 "<" "$dup" counter dup to "$client" device to-host
  fi
}

# limit_from DEV SRC RATE: on the router's link DEV, packets from SRC go at most at RATE.
limit_from() {
  in_ns sdn-r tc qdisc del dev "$1" root 2>/dev/null || true
  in_ns sdn-r tc qdisc add dev "$1" root handle 1: htb default 10
  in_ns sdn-r tc class add dev "$1" parent 1: classid 1:10 htb rate 10gbit quantum 60000
  in_ns sdn-r tc class add dev "$1" parent 1: classid 1:20 htb rate "$3" ceil "$3" burst 4k quantum 1514
  in_ns sdn-r tc filter add dev "$1" parent 1: protocol ip u32 match ip src "$2/32" flowid 1:20
}

signal_node() {
  local pid
  pid=$(node_pid "$2")
  [ -n "$pid" ] || ndie "node $2 has no pid file (not started?)"
  kill "-$1" "$pid"
  if [ "$1" = STOP ]; then
    # Stopped ('T') before this returns: a pause that did not take would pass for one that did.
    local i
    for i in $(seq 50); do
      [[ "$(ps -o stat= -p "$pid")" == T* ]] && return
      sleep 0.1
    done
    ndie "node $2 (pid $pid) did not stop"
  fi
}

nemesis_status() {
  local n pid
  for n in "${NODES[@]}"; do
    pid=$(node_pid "$n")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      local state
      state=$(ps -o stat= -p "$pid" | tr -d ' ')
      echo "rabbit@sdn$n ($(addr_of "$n")): pid $pid${state:+ ($state)}"
    else
      echo "rabbit@sdn$n ($(addr_of "$n")): not running"
    fi
  done
  if ns_exists sdn-r; then
    in_ns sdn-r nft list chain inet nemesis forward
    in_ns sdn-r nft list chain ip nemesis_dup forward
  fi
}

# One line per node: `sdnN running=[…] partitions=[…]`, as node N's Erlang VM tells it (asked in
# parallel; a paused or unreachable node says so). RabbitMQ 4.3 has no
# rabbit_node_monitor:partitions/0 any more: `partitions=not_reported` there.
partitions() {
  local n
  for n in "${NODES[@]}"; do
    (
      local view
      view=$(timeout 20 ip netns exec "sdn-$n" chroot --userspec=rabbitmq:rabbitmq "$ROOT" /usr/bin/env -i \
        PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
        rabbitmqctl -q -n "rabbit@sdn$n" eval \
        'P = case code:ensure_loaded(rabbit_node_monitor) =:= {module, rabbit_node_monitor} andalso erlang:function_exported(rabbit_node_monitor, partitions, 0) of true -> lists:sort(rabbit_node_monitor:partitions()); false -> not_reported end, io:format("running=~w partitions=~w~n", [lists:sort(rabbit_nodes:list_running()), P]).' \
        2>/dev/null | grep -v '^ok$' | head -n 1) || view=""
      echo "sdn$n ${view:-did-not-answer}"
    ) &
  done
  wait
}

node_arg() { case "${1:-}" in 1 | 2 | 3) ;; *) ndie "a node number 1..3, not '${1:-}'" ;; esac; }

nemesis_main() {
  [ "$(id -u)" = 0 ] || ndie "needs root (network namespaces, nftables, the chroot)"
  case "${1:-}" in
    up) cmd_nemesis_up ;;
    down) cmd_nemesis_down ;;
    status) nemesis_status ;;
    cut) cut "${2:-}" "${3:-}" "${4:-}" ;;
    isolate)
      node_arg "${2:-}"
      local other
      for other in "${NODES[@]}"; do [ "$other" = "$2" ] || cut "$2" "$other"; done
      ;;
    heal) heal ;;
    pause)
      node_arg "${2:-}"
      signal_node STOP "$2"
      ;;
    resume)
      node_arg "${2:-}"
      signal_node CONT "$2"
      ;;
    slow)
      node_arg "${2:-}"
      [[ "${3:-}" =~ ^[0-9]+[kmg]?bit$ ]] || ndie "a rate like 2mbit, not '${3:-}'"
      [[ "${4:-}" =~ ^[0-9]+$ ]] || ndie "a loss percentage 0..99, not '${4:-}'"
      [[ "${5:-0}" =~ ^[0-9]+$ ]] || ndie "a duplication percentage 0..99, not '${5:-}'"
      slow "$2" "$3" "$4" "${5:-0}"
      ;;
    partitions) partitions | sort ;;
    leader-pid)
      node_arg "${2:-}"
      node_pid "$2"
      ;;
    *)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

nemesis_main "$@"
