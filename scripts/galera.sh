#!/usr/bin/env bash
# scripts/galera.sh - a three-node MariaDB Galera cluster on this machine's loopback, for
# rowactor's cluster test and benchmarks.
#
#   bash scripts/galera.sh start          # bootstrap node 1, join 2 and 3, wait until synced
#   bash scripts/galera.sh status         # each node's wsrep state; exit 1 unless 3 synced
#   bash scripts/galera.sh stop           # stop the nodes, remove their data
#   bash scripts/galera.sh kill N         # SIGKILL node N (the fault the test injects)
#   bash scripts/galera.sh start-node N   # start node N again: it rejoins by state transfer
#   bash scripts/galera.sh wait-synced N  # wait until node N is Synced
#   bash scripts/galera.sh dsn N          # the node's DSN for rowactor (Go MySQL driver form)
#
# Node N (1..3) listens for SQL on 127.0.0.1:330(6+N) and for group communication on
# 4567, 4577, 4587 (incremental state transfer on the next port, full state transfer by
# rsync on 4444, 4454, 4464). Data, sockets and logs live under $GALERA_DIR
# (default /tmp/rowactor-galera). root logs in over TCP with an empty password, and
# database "test" exists, as on the single MariaDB server of the test suite.
#
# A dead node is suspected after 3 s and evicted after 5 s (evs.suspect_timeout and
# evs.inactive_timeout; Galera's defaults are 5 s and 15 s): the others' commits wait for
# it until then.
#
# Needs Debian's mariadb-server, galera-4 and rsync: installed with apt-get when missing
# (exit status 3 when they cannot be).
set -euo pipefail

GALERA_DIR=${GALERA_DIR:-/tmp/rowactor-galera}
NODES=(1 2 3)
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf 'galera.sh: %s\n' "$*" >&2; }
die() { printf 'galera.sh: ERROR: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else SUDO=(); fi
as_root() { "${SUDO[@]}" "$@"; }

sql_port() { echo $((3306 + $1)); }
gcomm_port() { echo $((4557 + 10 * $1)); }
sst_port() { echo $((4434 + 10 * $1)); }
node_dir() { echo "$GALERA_DIR/node$1"; }
provider() {
  local p
  for p in /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so /usr/lib/galera-4/libgalera_smm.so; do
    [ -f "$p" ] && { echo "$p"; return; }
  done
  return 1
}

install_packages() {
  local missing=()
  [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  provider >/dev/null || missing+=(galera-4)
  command -v rsync >/dev/null || missing+=(rsync)
  command -v ss >/dev/null || missing+=(iproute2)
  [ "${#missing[@]}" -eq 0 ] && return
  # Exit status 3: the packages cannot be had (scripts/test.sh then skips the Galera tests).
  if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
    log "ERROR: need ${missing[*]} but not root and no sudo; install them by hand"
    exit 3
  fi
  log "apt-get install ${missing[*]}"
  if ! as_root apt-get update || ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
    log "ERROR: apt-get could not install ${missing[*]}"
    exit 3
  fi
  provider >/dev/null || { log "ERROR: galera-4 installed but libgalera_smm.so not found"; exit 3; }
}

write_config() {
  local n=$1 dir
  dir=$(node_dir "$n")
  cat >"$dir/my.cnf" <<EOF
[mysqld]
user=mysql
datadir=$dir/data
socket=$dir/mysqld.sock
pid-file=$dir/mysqld.pid
log-error=$dir/error.log
bind-address=127.0.0.1
port=$(sql_port "$n")
skip-name-resolve
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_flush_log_at_trx_commit=2
innodb_autoinc_lock_mode=2
binlog_format=ROW
default_storage_engine=InnoDB
max_connections=300
wsrep_on=ON
wsrep_provider=$(provider)
wsrep_cluster_name=rowactor
wsrep_cluster_address=gcomm://127.0.0.1:$(gcomm_port 1),127.0.0.1:$(gcomm_port 2),127.0.0.1:$(gcomm_port 3)
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:$(gcomm_port "$n")
wsrep_provider_options="base_port=$(gcomm_port "$n");gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT5S;gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$(($(gcomm_port "$n") + 1))"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$(sst_port "$n")
wsrep_slave_threads=2
EOF
}

sql() { # sql N STATEMENT...: run on node N as root over its socket
  local n=$1
  shift
  mariadb --no-defaults -uroot -S "$(node_dir "$n")/mysqld.sock" -N -B -e "$*"
}

wsrep_status() { # prints "size state" of node N, or fails
  local n=$1
  sql "$n" "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_size','wsrep_local_state_comment')" 2>/dev/null |
    awk '$1=="wsrep_cluster_size"{s=$2} $1=="wsrep_local_state_comment"{c=$2} END{if (s=="") exit 1; print s, c}'
}

wait_synced() { # wait_synced N [SECONDS]
  local n=$1 deadline=$((SECONDS + ${2:-180})) st=""
  until st=$(wsrep_status "$n") && [ "${st#* }" = "Synced" ]; do
    if ! node_running "$n"; then
      tail -n 30 "$(node_dir "$n")/error.log" >&2 || true
      die "node $n exited (log above: $(node_dir "$n")/error.log)"
    fi
    [ "$SECONDS" -ge "$deadline" ] && die "node $n not synced after ${2:-180} s (state: ${st:-down}); see $(node_dir "$n")/error.log"
    sleep 1
  done
}

node_pid() { cat "$(node_dir "$1")/mysqld.pid" 2>/dev/null; }
node_running() { local p; p=$(node_pid "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

start_node() { # start_node N [--wsrep-new-cluster]
  local n=$1 dir
  shift
  dir=$(node_dir "$n")
  node_running "$n" && { log "node $n already runs"; return; }
  rm -f "$dir/mysqld.pid"
  # A node that died (SIGKILL) left seqno -1 in grastate.dat. Recover its last committed
  # position from InnoDB, as Debian's galera_recovery does under systemd, so that it
  # rejoins by incremental state transfer from the others' gcache: a full transfer by
  # rsync would block the donor's writes while it copies.
  local pos=()
  if [ "$#" -eq 0 ] && [ -f "$dir/data/grastate.dat" ]; then
    local rec
    rec=$(as_root /usr/sbin/mariadbd --defaults-file="$dir/my.cnf" --wsrep-recover --log-error="$dir/recover.log" >/dev/null 2>&1;
      sed -n 's/.*WSREP: Recovered position: \([^ ]*\).*/\1/p' "$dir/recover.log" | tail -n 1)
    if [ -n "$rec" ]; then
      log "node $n recovered position $rec"
      pos=(--wsrep-start-position="$rec")
    fi
  fi
  log "starting node $n on 127.0.0.1:$(sql_port "$n") $* ${pos[*]}"
  # Not start-stop-daemon --exec: that finds the machine's own mariadbd and starts nothing.
  as_root setsid /usr/sbin/mariadbd --defaults-file="$dir/my.cnf" "$@" "${pos[@]}" </dev/null >>"$dir/stdout.log" 2>&1 &
  local deadline=$((SECONDS + 60))
  until [ -S "$dir/mysqld.sock" ] && node_running "$n"; do
    [ "$SECONDS" -ge "$deadline" ] && { tail -n 30 "$dir/error.log" >&2 || true; die "node $n did not start"; }
    sleep 0.5
  done
}

cmd_start() {
  install_packages
  if wsrep_status 1 >/dev/null 2>&1; then
    log "a cluster already runs under $GALERA_DIR; checking it"
    cmd_status
    return
  fi
  cmd_stop_quiet
  local n
  for n in "${NODES[@]}"; do
    mkdir -p "$(node_dir "$n")/data"
    write_config "$n"
  done
  as_root chown -R mysql:mysql "$GALERA_DIR"
  log "creating node 1's data directory"
  as_root mariadb-install-db --no-defaults --user=mysql --datadir="$(node_dir 1)/data" \
    --auth-root-authentication-method=normal --skip-test-db >"$(node_dir 1)/install.log" 2>&1 ||
    { cat "$(node_dir 1)/install.log" >&2; die "mariadb-install-db failed"; }
  start_node 1 --wsrep-new-cluster
  wait_synced 1
  sql 1 "CREATE DATABASE IF NOT EXISTS test; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
  for n in 2 3; do
    start_node "$n"
    wait_synced "$n"
  done
  cmd_status
}

cmd_status() {
  local n st ok=1
  for n in "${NODES[@]}"; do
    if st=$(wsrep_status "$n"); then
      echo "node $n 127.0.0.1:$(sql_port "$n") cluster_size=${st% *} state=${st#* }"
      [ "$st" = "3 Synced" ] || ok=0
    else
      echo "node $n 127.0.0.1:$(sql_port "$n") down"
      ok=0
    fi
  done
  [ "$ok" -eq 1 ]
}

cmd_stop_quiet() {
  local n p
  for n in "${NODES[@]}"; do
    p=$(node_pid "$n") || continue
    [ -n "$p" ] && as_root kill -9 "$p" 2>/dev/null || true
  done
  # mariadbd processes of this folder whose pid file is gone (killed mid-start)
  pkill -9 -f "defaults-file=$GALERA_DIR/" 2>/dev/null || true
  pkill -9 -f "rsync --daemon.*$GALERA_DIR" 2>/dev/null || true
  sleep 0.5
  as_root rm -rf "$GALERA_DIR"
}

case "${1:-}" in
start) cmd_start ;;
status) cmd_status ;;
stop) cmd_stop_quiet; log "stopped; $GALERA_DIR removed" ;;
kill)
  [ -n "${2:-}" ] || die "usage: galera.sh kill N"
  p=$(node_pid "$2") || die "node $2 has no pid file"
  as_root kill -9 "$p"
  log "node $2 (pid $p) killed"
  ;;
start-node)
  [ -n "${2:-}" ] || die "usage: galera.sh start-node N"
  start_node "$2"
  ;;
wait-synced)
  [ -n "${2:-}" ] || die "usage: galera.sh wait-synced N"
  wait_synced "$2" "${3:-180}"
  ;;
dsn)
  [ -n "${2:-}" ] || die "usage: galera.sh dsn N"
  echo "root@tcp(127.0.0.1:$(sql_port "$2"))/test?parseTime=true"
  ;;
*)
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
