# lib.sh: the helpers infra.sh and chcluster.sh share (sourced, not run):
# logging with the caller's name (LOG_NAME), waiting with a deadline,
# pidfiles and process liveness from /proc, and stopping processes
# (SIGTERM, then SIGKILL). Bash only; spawns nothing but ss, sleep, tail.
# shellcheck shell=bash

log() { printf '%s: %s\n' "$LOG_NAME" "$*"; }
warn() { printf '%s: WARNING: %s\n' "$LOG_NAME" "$*" >&2; }
die() {
  printf '%s: ERROR: %s\n' "$LOG_NAME" "$*" >&2
  exit 1
}

# die_with_log MESSAGE LOGFILE — fail, pointing at (and tailing) a log file.
die_with_log() {
  local msg=$1 logf=$2
  {
    printf '%s: ERROR: %s\n' "$LOG_NAME" "$msg"
    printf '%s: see %s — last 20 lines:\n' "$LOG_NAME" "$logf"
    if [[ -e $logf ]]; then tail -n 20 "$logf" | sed 's/^/    /'; else echo "    (log file does not exist)"; fi
  } >&2
  exit 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# wait_for TIMEOUT_S DESCRIPTION LOGFILE CMD... — poll CMD until it succeeds.
wait_for() {
  local timeout=$1 desc=$2 logf=$3
  shift 3
  local deadline=$(($(now_ms) + timeout * 1000))
  until "$@"; do
    if (($(now_ms) >= deadline)); then
      die_with_log "timed out after ${timeout}s waiting for $desc" "$logf"
    fi
    sleep 0.2
  done
}

read_pidfile() { # prints the pid in FILE (if any)
  local f=$1 pid=""
  [[ -r $f ]] || return 1
  pid=$(<"$f") || return 1
  pid=${pid//[!0-9]/}
  [[ -n $pid ]] || return 1
  echo "$pid"
}

pid_alive() { # alive and not a zombie (reads /proc, spawns nothing)
  local pid=$1 rest
  [[ -n $pid && -r /proc/$pid/stat ]] || return 1
  rest=$(<"/proc/$pid/stat") 2>/dev/null || return 1
  rest=${rest##*) } # strip "pid (comm) "
  [[ -n $rest && $rest != Z* && $rest != X* ]]
}

port_in_use() { [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]; }

STOPPED_PIDS=()

# stop_pids NAME PID... — SIGTERM all, wait up to 10 s, then SIGKILL the
# survivors and wait up to 5 s more.
stop_pids() {
  local name=$1 pid i left
  shift
  (($#)) || return 0
  STOPPED_PIDS+=("$@")
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for ((i = 0; i < 150; i++)); do
    left=()
    for pid in "$@"; do if pid_alive "$pid"; then left+=("$pid"); fi; done
    ((${#left[@]})) || return 0
    if ((i == 100)); then
      warn "$name (pid ${left[*]}) still alive after 10s, sending SIGKILL"
      kill -KILL "${left[@]}" 2>/dev/null || true
    fi
    sleep 0.1
  done
  die "$name (pid ${left[*]}) did not exit even after SIGKILL"
}

stop_pid() { stop_pids "$2" "$1"; }

