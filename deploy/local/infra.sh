#!/usr/bin/env bash
# deploy/local/infra.sh — local kurz stack on loopback, no Docker.
#
#   infra.sh up      install missing packages (as root), start Redis Cluster,
#                    PostgreSQL and ClickHouse; idempotent (only starts what is
#                    not running), prints the addresses
#   infra.sh down    stop everything this script started (by PID), keep data
#   infra.sh status  print each component up/down; exit 0 if all up, 1 otherwise
#   infra.sh reset   down + delete all local data
#
# Components (all bound to 127.0.0.1 only):
#   Redis Cluster  6 nodes (3 masters + 3 replicas), ports BASE..BASE+5
#   PostgreSQL 15  postgres://kurz:kurz@127.0.0.1:5433/kurz?sslmode=disable
#                  (+ database kurz_test owned by kurz; superuser "postgres"
#                  reachable without password over the unix socket only)
#   ClickHouse     native 127.0.0.1:9000, HTTP http://127.0.0.1:8123,
#                  user "default" with empty password; databases kurz, kurz_test
#
# Environment variables:
#   KURZ_LOCAL_DIR        runtime data dir          (default: <repo>/.local)
#   KURZ_REDIS_BASE_PORT  first Redis node port     (default: 7001; uses 6 ports)
#   KURZ_PG_PORT          PostgreSQL port           (default: 5433)
#   KURZ_CH_TCP_PORT      ClickHouse native port    (default: 9000)
#   KURZ_CH_HTTP_PORT     ClickHouse HTTP port      (default: 8123)
#
# Layout under $KURZ_LOCAL_DIR:
#   redis/<port>/           node dirs (nodes.conf)
#   postgres/               PostgreSQL home (data/, socket/), owned by "postgres".
#                           If the postgres OS user cannot traverse to
#                           $KURZ_LOCAL_DIR (e.g. a clone under /root, mode 700)
#                           the home lives in /var/tmp/kurz-<hash>/postgres
#                           instead; that path is recorded in postgres.path and
#                           postgres/ becomes a symlink to it.
#   clickhouse/             config.xml, users.xml (generated), data/, tmp/
#   run/                    pidfiles (redis-<port>.pid, clickhouse.pid), lock
#   log/                    redis-<port>.log, postgres.log, clickhouse/*.log
#
# Running as root: PostgreSQL runs as the "postgres" OS user (it refuses root),
# Redis and ClickHouse run as root. Running as a normal user: everything runs
# as that user and nothing is installed.
set -euo pipefail
umask 022

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOCAL_DIR="$(realpath -m "${KURZ_LOCAL_DIR:-$ROOT/.local}")"
RUN_DIR="$LOCAL_DIR/run"
LOG_DIR="$LOCAL_DIR/log"

REDIS_BASE_PORT="${KURZ_REDIS_BASE_PORT:-7001}"
REDIS_NODES=6
REDIS_PORTS=()
for ((i = 0; i < REDIS_NODES; i++)); do REDIS_PORTS+=("$((REDIS_BASE_PORT + i))"); done
REDIS_LAST_PORT="${REDIS_PORTS[$((REDIS_NODES - 1))]}"

PG_PORT="${KURZ_PG_PORT:-5433}"
PG_PATH_FILE="$LOCAL_DIR/postgres.path"
PG_LOG="$LOG_DIR/postgres.log" # symlink to $PG_HOME/postgres.log
PG_URL="postgres://kurz:kurz@127.0.0.1:${PG_PORT}/kurz?sslmode=disable"

CH_TCP_PORT="${KURZ_CH_TCP_PORT:-9000}"
CH_HTTP_PORT="${KURZ_CH_HTTP_PORT:-8123}"
CH_HOME="$LOCAL_DIR/clickhouse"
CH_CONF="$CH_HOME/config.xml"
CH_PID="$RUN_DIR/clickhouse.pid"
CH_LOG_DIR="$LOG_DIR/clickhouse"
CH_LOG="$CH_LOG_DIR/clickhouse-server.log"

export PATH="$PATH:/usr/sbin:/sbin"

for _v in REDIS_BASE_PORT PG_PORT CH_TCP_PORT CH_HTTP_PORT; do
  if ! [[ ${!_v} =~ ^[0-9]+$ ]] || ((${!_v} < 1 || ${!_v} > 65535)); then
    echo "infra: ERROR: KURZ_$_v='${!_v}' is not a valid port" >&2
    exit 2
  fi
done
unset _v
# the Redis cluster bus listens on port+10000
((REDIS_BASE_PORT + REDIS_NODES - 1 <= 55535)) ||
  { echo "infra: ERROR: KURZ_REDIS_BASE_PORT must be <= $((55535 - REDIS_NODES + 1)) (cluster bus = port+10000)" >&2; exit 2; }

IS_ROOT=0
[[ $EUID -eq 0 ]] && IS_ROOT=1

# ----------------------------------------------------------------- helpers --

LOG_NAME=infra
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"

pid_comm() { local c=""; c=$(<"/proc/$1/comm") 2>/dev/null || true; printf '%s' "$c"; }

pid_cmd() { ps -o args= -p "$1" 2>/dev/null || true; }

# pid of the process listening on TCP PORT on this host (empty if none/unknown)
port_pid() {
  ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true
}

# Daemons are re-parented to PID 1, which may reap them a bit later; wait
# (≤ 5 s, not fatal) until the stopped processes are gone from the process
# table so `pgrep` right after `down` shows nothing.
wait_reaped() {
  local pid i busy
  for ((i = 0; i < 50; i++)); do
    busy=0
    for pid in "${STOPPED_PIDS[@]}"; do
      if [[ -e /proc/$pid ]]; then busy=1; fi
    done
    ((busy)) || return 0
    sleep 0.1
  done
  return 0
}

xml_escape() {
  local s=$1
  s=${s//&/&amp;}
  s=${s//</&lt;}
  s=${s//>/&gt;}
  printf '%s' "$s"
}

# NB: every daemon is launched with `9>&-` so it does not inherit (and keep
# holding) the lock after this script exits.
take_lock() {
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/infra.lock"
  flock -w 300 9 || die "could not get $RUN_DIR/infra.lock (another infra.sh running?)"
}

# ---------------------------------------------------------------- packages --

pg_bin_dir() {
  local d
  if [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
    echo /usr/lib/postgresql/15/bin
    return 0
  fi
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V -r | head -n1)
  if [[ -x $d ]]; then dirname "$d"; return 0; fi
  d=$(command -v initdb 2>/dev/null || true)
  if [[ -n $d ]]; then dirname "$d"; return 0; fi
  return 1
}

ch_server_bin() {
  command -v clickhouse-server 2>/dev/null && return 0
  [[ -x /usr/sbin/clickhouse-server ]] && { echo /usr/sbin/clickhouse-server; return 0; }
  return 1
}

ensure_packages() {
  local missing=() unknown=0 p
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  ch_server_bin >/dev/null || missing+=(clickhouse-server)
  command -v clickhouse-client >/dev/null 2>&1 || missing+=(clickhouse-client)
  pg_bin_dir >/dev/null || missing+=(postgresql)
  # Headless Chromium drives the web console's browser test.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  ((${#missing[@]} == 0)) && return 0

  if ((!IS_ROOT)); then
    die "missing packages: ${missing[*]} — install them: sudo apt-get install -y ${missing[*]}"
  fi
  log "installing missing packages: ${missing[*]} (log: $LOG_DIR/apt.log)"
  for p in "${missing[@]}"; do
    apt-cache show "$p" >/dev/null 2>&1 || unknown=1
  done
  local apt_opts=(-o DPkg::Lock::Timeout=600 -y --no-install-recommends)
  if ((unknown)); then
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update >>"$LOG_DIR/apt.log" 2>&1 ||
      die_with_log "apt-get update failed" "$LOG_DIR/apt.log"
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1; then
    log "apt-get install failed, retrying after apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update >>"$LOG_DIR/apt.log" 2>&1 ||
      die_with_log "apt-get update failed" "$LOG_DIR/apt.log"
    DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1 ||
      die_with_log "apt-get install ${missing[*]} failed" "$LOG_DIR/apt.log"
  fi
}

# ------------------------------------------------------------------- redis --

redis_dir() { echo "$LOCAL_DIR/redis/$1"; }
redis_pidfile() { echo "$RUN_DIR/redis-$1.pid"; }
redis_log() { echo "$LOG_DIR/redis-$1.log"; }

# prints the pid of OUR redis node on PORT, fails if it is not running
redis_pid() {
  local port=$1 pid cwd
  if pid=$(read_pidfile "$(redis_pidfile "$port")") && pid_alive "$pid" &&
    [[ $(pid_comm "$pid") == redis-server* ]]; then
    echo "$pid"
    return 0
  fi
  # pidfile lost: adopt a redis-server on this port whose cwd is our node dir
  pid=$(port_pid "$port")
  if [[ -n $pid ]] && [[ $(pid_cmd "$pid") == *redis-server* ]]; then
    cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
    if [[ $cwd == "$(redis_dir "$port")" ]]; then
      echo "$pid"
      return 0
    fi
  fi
  return 1
}

redis_ping() { [[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]]; }

redis_start_node() {
  local port=$1 dir
  dir=$(redis_dir "$port")
  if redis_pid "$port" >/dev/null; then
    return 0
  fi
  if port_in_use "$port"; then
    die "port $port is already in use by another process: $(pid_cmd "$(port_pid "$port")")"
  fi
  mkdir -p "$dir"
  rm -f "$(redis_pidfile "$port")"
  redis-server \
    --port "$port" --bind 127.0.0.1 --dir "$dir" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --daemonize yes --pidfile "$(redis_pidfile "$port")" --logfile "$(redis_log "$port")" \
    --appendonly no --save '' 9>&- ||
    die_with_log "redis-server on port $port failed to start" "$(redis_log "$port")"
  STARTED_REDIS+=("$port")
}

# redis_info PORT — sets RI_STATE, RI_SLOTS, RI_KNOWN from CLUSTER INFO
redis_info() {
  local out
  out=$(redis-cli -p "$1" cluster info 2>/dev/null) || out=""
  RI_STATE="" RI_SLOTS="" RI_KNOWN=""
  if [[ $out =~ cluster_state:([a-z]+) ]]; then RI_STATE=${BASH_REMATCH[1]}; fi
  if [[ $out =~ cluster_slots_assigned:([0-9]+) ]]; then RI_SLOTS=${BASH_REMATCH[1]}; fi
  if [[ $out =~ cluster_known_nodes:([0-9]+) ]]; then RI_KNOWN=${BASH_REMATCH[1]}; fi
}

redis_cluster_ok() {
  local p
  for p in "${REDIS_PORTS[@]}"; do
    redis_info "$p"
    [[ $RI_STATE == ok && $RI_SLOTS == 16384 ]] || return 1
  done
}

redis_role_counts() { # prints "<masters> <replicas>" as seen from the base node
  redis-cli -p "$REDIS_BASE_PORT" cluster nodes 2>/dev/null | tr -d '\r' |
    awk '$3 !~ /fail/ { if ($3 ~ /master/ && NF > 8) m++; else if ($3 ~ /slave/) r++ }
         END { printf "%d %d\n", m, r }'
}

redis_replicas_ready() { [[ $(redis_role_counts) == "3 3" ]]; }

redis_up() {
  local p fresh=1 addrs=()
  STARTED_REDIS=()
  for p in "${REDIS_PORTS[@]}"; do redis_start_node "$p"; done
  for p in "${STARTED_REDIS[@]}"; do
    wait_for 15 "redis-server on 127.0.0.1:$p" "$(redis_log "$p")" redis_ping "$p"
  done
  if ((${#STARTED_REDIS[@]})); then log "redis: started node(s) ${STARTED_REDIS[*]}"; fi

  for p in "${REDIS_PORTS[@]}"; do
    redis_info "$p"
    if [[ $RI_KNOWN != 1 || $RI_SLOTS != 0 ]]; then fresh=0; fi
    addrs+=("127.0.0.1:$p")
  done
  if ((fresh)); then
    log "redis: creating cluster ${addrs[0]} .. ${addrs[$((REDIS_NODES - 1))]} (--cluster-replicas 1)"
    timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
      >>"$LOG_DIR/redis-cluster-create.log" 2>&1 ||
      die_with_log "redis-cli --cluster create failed" "$LOG_DIR/redis-cluster-create.log"
  fi
  if ! redis_cluster_ok; then
    local deadline=$(($(now_ms) + 30000))
    until redis_cluster_ok; do
      if (($(now_ms) >= deadline)); then
        {
          echo "infra: ERROR: redis cluster not ok after 30s; per-node state:"
          for p in "${REDIS_PORTS[@]}"; do
            redis_info "$p"
            echo "    $p: cluster_state=${RI_STATE:-?} slots_assigned=${RI_SLOTS:-?} known_nodes=${RI_KNOWN:-?}"
          done
          echo "infra: logs: $LOG_DIR/redis-<port>.log; if the node dirs are inconsistent run: $0 reset"
        } >&2
        die_with_log "redis cluster did not reach cluster_state:ok" "$(redis_log "$REDIS_BASE_PORT")"
      fi
      sleep 0.2
    done
  fi
  # best effort: let every replica show up in the base node's view (≤ 5 s)
  local deadline=$(($(now_ms) + 5000))
  until redis_replicas_ready || (($(now_ms) >= deadline)); do sleep 0.2; done
}

redis_down() {
  local p pid stopped=() pids=()
  for p in "${REDIS_PORTS[@]}"; do
    if pid=$(redis_pid "$p"); then
      pids+=("$pid")
      stopped+=("$p")
    fi
  done
  stop_pids "redis-server" "${pids[@]}"
  for p in "${REDIS_PORTS[@]}"; do rm -f "$(redis_pidfile "$p")"; done
  if ((${#stopped[@]})); then log "redis: stopped node(s) ${stopped[*]}"; fi
}

redis_status() {
  local p running=0 state="-" counts first=""
  for p in "${REDIS_PORTS[@]}"; do
    if redis_pid "$p" >/dev/null && redis_ping "$p"; then
      running=$((running + 1))
      first=${first:-$p}
    fi
  done
  if ((running == REDIS_NODES)) && redis_cluster_ok; then
    counts=$(redis_role_counts)
    printf '%-14s %-28s up   (%d/%d nodes, cluster_state:ok, %s masters, %s replicas)\n' \
      "redis cluster" "127.0.0.1:$REDIS_BASE_PORT-$REDIS_LAST_PORT" "$running" "$REDIS_NODES" \
      "${counts% *}" "${counts#* }"
    return 0
  fi
  if [[ -n $first ]]; then
    redis_info "$first"
    state="$RI_STATE as seen by :$first"
  fi
  printf '%-14s %-28s down (%d/%d nodes running, cluster_state:%s)\n' \
    "redis cluster" "127.0.0.1:$REDIS_BASE_PORT-$REDIS_LAST_PORT" "$running" "$REDIS_NODES" "${state:--}"
  return 1
}

# ---------------------------------------------------------------- postgres --

# run a command as the postgres OS user (root) or as ourselves (non-root)
as_pg() {
  if ((IS_ROOT)); then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && "$@")
  fi
}

# resolve PG_HOME without creating anything (status/down)
pg_resolve_home() {
  if [[ -s $PG_PATH_FILE ]]; then
    PG_HOME=$(<"$PG_PATH_FILE")
  else
    PG_HOME="$LOCAL_DIR/postgres"
  fi
  PG_DATA="$PG_HOME/data"
  PG_SOCK="$PG_HOME/socket"
}

# choose (and record) PG_HOME for `up`
pg_choose_home() {
  if [[ -s $PG_PATH_FILE || -e $LOCAL_DIR/postgres/data/PG_VERSION ]]; then
    pg_resolve_home
    return 0
  fi
  local default="$LOCAL_DIR/postgres" reason=""
  if ((IS_ROOT)) && ! runuser -u postgres -- test -x "$LOCAL_DIR" 2>/dev/null; then
    reason="the postgres user cannot traverse to $LOCAL_DIR"
  fi
  local sock="$default/socket/.s.PGSQL.$PG_PORT"
  if [[ -z $reason ]] && ((${#sock} > 100)); then
    reason="unix socket path would be too long (${#sock} chars)"
  fi
  if [[ -z $reason ]]; then
    pg_resolve_home
    return 0
  fi
  local hash
  hash=$(printf '%s' "$LOCAL_DIR" | sha256sum | cut -c1-10)
  PG_HOME="/var/tmp/kurz-$hash/postgres"
  log "postgres: $reason; using $PG_HOME (recorded in $PG_PATH_FILE)"
  mkdir -p "/var/tmp/kurz-$hash"
  chmod 755 "/var/tmp/kurz-$hash"
  printf '%s\n' "$PG_HOME" >"$PG_PATH_FILE"
  [[ -e $default || -L $default ]] || ln -s "$PG_HOME" "$default"
  pg_resolve_home
}

pg_running() { [[ -d $PG_DATA ]] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }
pg_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 1 >/dev/null 2>&1; }

pg_write_config() {
  as_pg tee "$PG_DATA/kurz.conf" >/dev/null <<EOF
# generated by deploy/local/infra.sh — rewritten on every start
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
log_min_messages = warning
log_timezone = 'UTC'
timezone = 'UTC'
EOF
  as_pg tee "$PG_DATA/pg_hba.conf" >/dev/null <<'EOF'
# generated by deploy/local/infra.sh — rewritten on every start
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  trust
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
EOF
  if ! grep -q "^include_if_exists = 'kurz.conf'" "$PG_DATA/postgresql.conf"; then
    printf "\ninclude_if_exists = 'kurz.conf'\n" | as_pg tee -a "$PG_DATA/postgresql.conf" >/dev/null
  fi
}

pg_up() {
  PG_BIN=$(pg_bin_dir) || die "PostgreSQL server binaries (initdb) not found"
  if ((IS_ROOT)) && ! id postgres >/dev/null 2>&1; then
    log "postgres: creating system user 'postgres'"
    useradd --system --home-dir /var/lib/postgresql --no-create-home --shell /bin/bash postgres
  fi
  pg_choose_home
  mkdir -p "$PG_HOME"
  if ((IS_ROOT)); then chown postgres:postgres "$PG_HOME"; fi
  as_pg test -w "$PG_HOME" ||
    die "postgres OS user cannot write $PG_HOME (run '$0 reset' to re-create the data dir)"
  [[ -d $PG_SOCK ]] || as_pg mkdir -p "$PG_SOCK"
  # log: written by postgres inside PG_HOME, symlinked into LOG_DIR
  if [[ -L $PG_LOG || ! -e $PG_LOG ]]; then ln -sfn "$PG_HOME/postgres.log" "$PG_LOG"; fi

  if [[ ! -f $PG_DATA/PG_VERSION ]]; then
    log "postgres: initdb $PG_DATA"
    as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C \
      --auth-local=trust --auth-host=scram-sha-256 >"$LOG_DIR/postgres-initdb.log" 2>&1 ||
      die_with_log "initdb failed" "$LOG_DIR/postgres-initdb.log"
  fi

  if ! pg_running; then
    if port_in_use "$PG_PORT"; then
      die "port $PG_PORT is already in use by another process: $(pid_cmd "$(port_pid "$PG_PORT")")"
    fi
    pg_write_config
    log "postgres: starting on 127.0.0.1:$PG_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_HOME/postgres.log" -w -t 30 -s start >/dev/null 2>&1 9>&- ||
      die_with_log "PostgreSQL failed to start" "$PG_HOME/postgres.log"
  fi
  wait_for 30 "PostgreSQL on 127.0.0.1:$PG_PORT" "$PG_HOME/postgres.log" pg_ready

  as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres \
    >"$LOG_DIR/postgres-bootstrap.log" 2>&1 <<'SQL' || die_with_log "creating role/databases failed" "$LOG_DIR/postgres-bootstrap.log"
DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kurz') THEN
    CREATE ROLE kurz;
  END IF;
END$$;
ALTER ROLE kurz WITH LOGIN CREATEDB PASSWORD 'kurz';
-- The redirect's login reads links and domains only (pkg/linkschema
-- ReaderRole: the shortener grants the role its reads at start).
DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kurz_link_reader') THEN
    CREATE ROLE kurz_link_reader NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kurz_redirect') THEN
    CREATE ROLE kurz_redirect;
  END IF;
END$$;
ALTER ROLE kurz_redirect WITH LOGIN PASSWORD 'kurz-redirect';
GRANT kurz_link_reader TO kurz_redirect;
SELECT 'CREATE DATABASE kurz OWNER kurz'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'kurz')\gexec
SELECT 'CREATE DATABASE kurz_test OWNER kurz'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'kurz_test')\gexec
SQL
}

pg_down() {
  pg_resolve_home
  PG_BIN=$(pg_bin_dir) || return 0
  [[ -f $PG_DATA/PG_VERSION ]] || return 0
  pg_running || return 0
  local pid=""
  pid=$(head -n1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
  if ! as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" stop -m fast -w -t 10 -s >/dev/null 2>&1; then
    warn "pg_ctl stop -m fast did not finish in 10s"
  fi
  if [[ -n $pid ]]; then stop_pid "$pid" "postgres"; fi
  log "postgres: stopped"
}

pg_status() {
  pg_resolve_home
  PG_BIN=$(pg_bin_dir 2>/dev/null) || PG_BIN=/nonexistent
  if [[ -x $PG_BIN/pg_ctl ]] && pg_running && pg_ready; then
    printf '%-14s %-28s up   (%s, data %s)\n' postgres "127.0.0.1:$PG_PORT" "$PG_URL" "$PG_DATA"
    return 0
  fi
  printf '%-14s %-28s down (data %s)\n' postgres "127.0.0.1:$PG_PORT" "$PG_DATA"
  return 1
}

# -------------------------------------------------------------- clickhouse --

ch_pid() {
  local pid
  pid=$(read_pidfile "$CH_PID") || return 1
  pid_alive "$pid" || return 1
  [[ $(pid_comm "$pid") == clickhouse* ]] || return 1
  echo "$pid"
}

ch_ping() {
  if command -v curl >/dev/null 2>&1; then
    [[ $(curl -fsS --max-time 2 "http://127.0.0.1:$CH_HTTP_PORT/ping" 2>/dev/null) == Ok.* ]]
  else
    clickhouse-client --host 127.0.0.1 --port "$CH_TCP_PORT" -q 'SELECT 1' >/dev/null 2>&1
  fi
}

# A clickhouse-server started by the Debian package (system instance) holding
# one of our ports is stopped; any other process on our ports is an error.
ch_free_ports() {
  local port pid cmd user
  for port in "$CH_TCP_PORT" "$CH_HTTP_PORT"; do
    port_in_use "$port" || continue
    pid=$(port_pid "$port")
    cmd=$(pid_cmd "${pid:-0}")
    user=$(ps -o user= -p "${pid:-0}" 2>/dev/null || true)
    if [[ -n $pid && $cmd == *clickhouse* && ($cmd == */etc/clickhouse-server/* || $user == clickhouse) ]]; then
      log "clickhouse: stopping the system clickhouse-server (pid $pid, '$cmd') started by the Debian package — it occupies port $port"
      if ((IS_ROOT)); then
        if command -v service >/dev/null 2>&1; then
          service clickhouse-server stop >/dev/null 2>&1 || true
        fi
        stop_pid "$pid" "system clickhouse-server"
      else
        die "port $port is held by the system clickhouse-server (pid $pid); stop it as root: sudo service clickhouse-server stop"
      fi
    else
      die "port $port is already in use by another process: pid=${pid:-?} ${cmd:-}"
    fi
  done
}

ch_write_config() {
  local data tmp logd
  data=$(xml_escape "$CH_HOME/data/")
  tmp=$(xml_escape "$CH_HOME/tmp/")
  logd=$(xml_escape "$CH_LOG_DIR")
  cat >"$CH_CONF" <<EOF
<?xml version="1.0"?>
<!-- generated by deploy/local/infra.sh — rewritten on every start -->
<yandex>
    <logger>
        <level>information</level>
        <log>$logd/clickhouse-server.log</log>
        <errorlog>$logd/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>3</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$CH_TCP_PORT</tcp_port>
    <http_port>$CH_HTTP_PORT</http_port>
    <!-- no interserver_http_port: replication port disabled -->
    <max_connections>1024</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>100</max_concurrent_queries>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <mark_cache_size>268435456</mark_cache_size>
    <path>$data</path>
    <tmp_path>$tmp</tmp_path>
    <user_files_path>${data}user_files/</user_files_path>
    <format_schema_path>${data}format_schemas/</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
    <query_log>
        <database>system</database>
        <table>query_log</table>
        <partition_by>toYYYYMM(event_date)</partition_by>
        <flush_interval_milliseconds>7500</flush_interval_milliseconds>
    </query_log>
</yandex>
EOF
  cat >"$CH_HOME/users.xml" <<'EOF'
<?xml version="1.0"?>
<!-- generated by deploy/local/infra.sh — rewritten on every start -->
<yandex>
    <profiles>
        <default>
            <max_memory_usage>1000000000</max_memory_usage>
            <max_memory_usage_for_all_queries>2000000000</max_memory_usage_for_all_queries>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
        </default>
        <readonly>
            <readonly>1</readonly>
        </readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks replace="replace">
                <ip>::1</ip>
                <ip>127.0.0.1</ip>
                <ip>::ffff:127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
}

ch_up() {
  local bin
  bin=$(ch_server_bin) || die "clickhouse-server binary not found"
  if ! ch_pid >/dev/null; then
    ch_free_ports
    mkdir -p "$CH_HOME/data" "$CH_HOME/tmp" "$CH_LOG_DIR"
    ch_write_config
    rm -f "$CH_PID"
    log "clickhouse: starting on 127.0.0.1:$CH_TCP_PORT (native) / :$CH_HTTP_PORT (http)"
    (cd "$CH_HOME" && "$bin" --config-file="$CH_CONF" --pid-file="$CH_PID" --daemon \
      >>"$CH_LOG_DIR/startup.log" 2>&1 9>&-) ||
      die_with_log "clickhouse-server failed to start" "$CH_LOG_DIR/startup.log"
  fi
  wait_for 30 "ClickHouse HTTP ping on 127.0.0.1:$CH_HTTP_PORT" "$CH_LOG" ch_ping
  ch_pid >/dev/null || die_with_log "ClickHouse answers but pidfile $CH_PID has no live pid" "$CH_LOG"
  # the native port comes up together with HTTP; this also checks it
  wait_for 15 "ClickHouse native port 127.0.0.1:$CH_TCP_PORT (CREATE DATABASE kurz, kurz_test)" \
    "$CH_LOG_DIR/clickhouse-server.err.log" ch_create_dbs
}

ch_create_dbs() {
  clickhouse-client --host 127.0.0.1 --port "$CH_TCP_PORT" --multiquery \
    -q 'CREATE DATABASE IF NOT EXISTS kurz; CREATE DATABASE IF NOT EXISTS kurz_test' >/dev/null 2>&1
}

ch_down() {
  local pid
  if pid=$(ch_pid); then
    stop_pid "$pid" "clickhouse-server"
    log "clickhouse: stopped"
  fi
  rm -f "$CH_PID"
}

ch_status() {
  if ch_pid >/dev/null && ch_ping; then
    printf '%-14s %-28s up   (http://127.0.0.1:%s)\n' clickhouse "127.0.0.1:$CH_TCP_PORT" "$CH_HTTP_PORT"
    return 0
  fi
  printf '%-14s %-28s down\n' clickhouse "127.0.0.1:$CH_TCP_PORT"
  return 1
}

# ---------------------------------------------------------------- commands --

cmd_up() {
  local t0
  t0=$(now_ms)
  mkdir -p "$LOCAL_DIR" "$RUN_DIR" "$LOG_DIR"
  take_lock
  ensure_packages
  redis_up
  pg_up
  ch_up
  local counts ms
  counts=$(redis_role_counts)
  ms=$(($(now_ms) - t0))
  printf '%-14s %s (%s masters, %s replicas) ok\n' "redis cluster" \
    "127.0.0.1:$REDIS_BASE_PORT-$REDIS_LAST_PORT" "${counts% *}" "${counts#* }"
  printf '%-14s %s  (test db: kurz_test)\n' postgres "$PG_URL"
  printf '%-14s %s\n' clickhouse "127.0.0.1:$CH_TCP_PORT (native), http://127.0.0.1:$CH_HTTP_PORT  (dbs: kurz, kurz_test)"
  printf 'up in %d.%03ds (data: %s)\n' $((ms / 1000)) $((ms % 1000)) "$LOCAL_DIR"
}

cmd_down() {
  [[ -d $LOCAL_DIR ]] || { log "nothing to stop ($LOCAL_DIR does not exist)"; return 0; }
  take_lock
  ch_down
  pg_down
  redis_down
  wait_reaped
  log "down (data kept in $LOCAL_DIR)"
}

cmd_status() {
  local rc=0
  redis_status || rc=1
  pg_status || rc=1
  ch_status || rc=1
  return "$rc"
}

cmd_reset() {
  cmd_down
  [[ -d $LOCAL_DIR ]] || return 0
  pg_resolve_home
  if [[ -s $PG_PATH_FILE ]]; then
    local fb
    fb=$(dirname "$PG_HOME") # /var/tmp/kurz-<hash>
    if [[ $fb == /var/tmp/kurz-* ]]; then rm -rf -- "$fb"; fi
  fi
  rm -rf -- "$LOCAL_DIR/redis" "$LOCAL_DIR/postgres" "$PG_PATH_FILE" "$LOCAL_DIR/clickhouse" \
    "$LOCAL_DIR/run" "$LOCAL_DIR/log"
  rmdir -- "$LOCAL_DIR" 2>/dev/null || true
  log "reset: removed data under $LOCAL_DIR"
}

usage() {
  sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
reset) cmd_reset ;;
-h | --help | help) usage ;;
*)
  usage >&2
  exit 2
  ;;
esac
