#!/usr/bin/env bash
# A PostgreSQL server for the tests, the examples and the benchmarks, from Debian's packages.
#
#   scripts/postgres.sh up       install the `postgresql` package if it is missing (root), initdb a
#                                cluster of the project's own into $PG_DIR (once), start it on
#                                127.0.0.1:$PG_PORT (TCP only, password auth) and create the role and
#                                database below; a server that already answers with them is used as is
#   scripts/postgres.sh down     stop it (fast shutdown)
#   scripts/postgres.sh status   exit 0 when the role can log in over TCP, 1 otherwise
#   scripts/postgres.sh kill     SIGKILL the postmaster (a crash, for fault tests); `up` restarts it
#   scripts/postgres.sh url      print the connection URL the tests use (STREAM_DEDUP_PG_URL)
#   scripts/postgres.sh psql …   psql as the role, over TCP (arguments passed on)
#
# The server never runs as root: as root the cluster belongs to Debian's `postgres` system user (made
# by the package); otherwise to the calling user. Debian's own cluster (15/main on 5432) is left
# alone: this one has its own folder and port. Settings (environment):
#   STREAM_DEDUP_PG_PORT (5433), STREAM_DEDUP_PG_DIR (/var/cache/stream-dedup/postgres as root,
#   ~/.cache/stream-dedup/postgres otherwise), STREAM_DEDUP_PG_USER (stream_dedup),
#   STREAM_DEDUP_PG_PASSWORD (stream-dedup), STREAM_DEDUP_PG_DB (stream_dedup).
# The role may create databases and roles (the refusal tests make a read-only role) but is not a
# superuser. The tests read STREAM_DEDUP_PG_URL, whose default is what `url` prints.
set -euo pipefail

PORT=${STREAM_DEDUP_PG_PORT:-5433}
HOST=127.0.0.1
ROLE=${STREAM_DEDUP_PG_USER:-stream_dedup}
PASSWORD=${STREAM_DEDUP_PG_PASSWORD:-stream-dedup}
DB=${STREAM_DEDUP_PG_DB:-stream_dedup}
if [ "$(id -u)" = 0 ]; then
  DIR=${STREAM_DEDUP_PG_DIR:-/var/cache/stream-dedup/postgres}
  OWNER=postgres
else
  DIR=${STREAM_DEDUP_PG_DIR:-$HOME/.cache/stream-dedup/postgres}
  OWNER=$(id -un)
fi
DATA=$DIR/data
SOCKETS=$DIR/run
LOG=$DIR/server.log

log() { echo "postgres.sh: $*" >&2; }
die() {
  log "$*"
  exit 1
}

# The newest installed server's binaries (Debian puts them under /usr/lib/postgresql/<major>/bin).
bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && [ -x "$d/postgres" ] && echo "$d"
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    # runuser keeps no root privileges; cd first: postgres may not read root's working directory.
    (cd / && runuser -u "$OWNER" -- "$@")
  else
    "$@"
  fi
}

url() { echo "postgres://$ROLE:$PASSWORD@$HOST:$PORT/$DB"; }

can_login() {
  PGPASSWORD=$PASSWORD PGCONNECT_TIMEOUT=3 psql -X -q -h "$HOST" -p "$PORT" -U "$ROLE" -d "$DB" \
    -tAc 'select 1' >/dev/null 2>&1
}

install_server() {
  [ -n "$(bindir || true)" ] && return 0
  [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and installing it needs root: apt-get install postgresql"
  log "installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's postinst would start its own 15/main cluster; we run our own, so keep it from starting.
  local policy=/usr/sbin/policy-rc.d had_policy=0
  [ -e "$policy" ] && had_policy=1
  if [ $had_policy = 0 ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
  fi
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql >/dev/null
  [ $had_policy = 1 ] || rm -f "$policy"
  [ -n "$(bindir || true)" ] || die "the postgresql package installed no server binaries"
}

init_cluster() {
  [ -f "$DATA/PG_VERSION" ] && return 0
  local bin
  bin=$(bindir)
  log "initdb into $DATA ($("$bin/postgres" --version))"
  mkdir -p "$DIR"
  [ "$(id -u)" = 0 ] && chown "$OWNER": "$DIR"
  # Local (socket) connections trust the owner only, for the setup below; TCP needs a password.
  as_owner "$bin/initdb" -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >/dev/null ||
    as_owner "$bin/initdb" -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 -E UTF8 --locale=C >/dev/null
  # Peer authentication maps the OS user to the role of the same name; the owner's OS name may not
  # be `postgres` when not root, so trust the socket (it lives in the cluster's own folder, 0700).
  sed -i 's/^local\(.*\)peer$/local\1trust/' "$DATA/pg_hba.conf"
}

start_server() {
  local bin
  bin=$(bindir)
  as_owner mkdir -p "$SOCKETS"
  chmod 700 "$SOCKETS" 2>/dev/null || true
  log "starting PostgreSQL on $HOST:$PORT (data $DATA, log $LOG)"
  as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start \
    -o "-c listen_addresses=$HOST -p $PORT -k $SOCKETS -c max_connections=200" >/dev/null ||
    die "PostgreSQL did not start; its log: $(tail -n 20 "$LOG" 2>/dev/null)"
}

superuser_sql() {
  as_owner "$(bindir)/psql" -X -q -h "$SOCKETS" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"
}

create_role_and_db() {
  superuser_sql <<SQL >/dev/null
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE "$ROLE" LOGIN CREATEDB CREATEROLE PASSWORD '$PASSWORD';
  ELSE
    ALTER ROLE "$ROLE" LOGIN CREATEDB CREATEROLE PASSWORD '$PASSWORD';
  END IF;
END \$\$;
SQL
  if [ -z "$(superuser_sql -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
    superuser_sql -c "CREATE DATABASE \"$DB\" OWNER \"$ROLE\"" >/dev/null
  fi
}

postmaster_pid() { [ -f "$DATA/postmaster.pid" ] && head -n 1 "$DATA/postmaster.pid"; }
# A process that runs (a killed postmaster whose parent does not reap it stays a zombie, and
# `kill -0` still finds it).
alive() { [ -n "$1" ] && [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up)
  if can_login; then
    log "PostgreSQL already answers at $(url)"
    exit 0
  fi
  if (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null && ! alive "$(postmaster_pid || true)"; then
    die "port $HOST:$PORT is taken by another process that does not accept $ROLE; free it or set STREAM_DEDUP_PG_PORT"
  fi
  install_server
  init_cluster
  pid=$(postmaster_pid || true)
  if ! alive "$pid"; then
    # A postmaster killed here may linger as a zombie (no init reaps it in a container), and the
    # server refuses to start while the pid in postmaster.pid exists at all: the file is stale.
    # The socket's lock file names the same pid; the folder is the cluster's own.
    [ -n "$pid" ] && rm -f "$DATA/postmaster.pid" "$SOCKETS"/.s.PGSQL."$PORT".lock
    start_server
  fi
  create_role_and_db
  can_login || die "PostgreSQL is up but $ROLE cannot log in over TCP at $HOST:$PORT"
  log "PostgreSQL $(superuser_sql -tAc 'show server_version') ready at $(url)"
  ;;
down)
  if [ -f "$DATA/PG_VERSION" ] && [ -n "$(bindir || true)" ]; then
    as_owner "$(bindir)/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 || true
  fi
  log "PostgreSQL on $HOST:$PORT stopped"
  ;;
status)
  if can_login; then
    echo "up: $(url)"
  else
    echo "down: nothing accepts $ROLE at $HOST:$PORT"
    exit 1
  fi
  ;;
kill)
  pid=$(postmaster_pid || true)
  [ -n "$pid" ] || die "no postmaster.pid in $DATA"
  kill -9 "$pid"
  # The backends notice their postmaster is gone and exit; wait until the port is free.
  for _ in $(seq 1 100); do alive "$pid" || (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null || break; sleep 0.1; done
  log "postmaster $pid killed (SIGKILL)"
  ;;
url) url ;;
psql) PGPASSWORD=$PASSWORD exec psql -X -h "$HOST" -p "$PORT" -U "$ROLE" -d "$DB" "$@" ;;
*)
  sed -n '2,20p' "$0" >&2
  exit 2
  ;;
esac
