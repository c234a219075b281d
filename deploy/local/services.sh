#!/usr/bin/env bash
# deploy/local/services.sh — build and run kurz's five services on loopback,
# against the stack that deploy/local/infra.sh starts.
#
#   services.sh up      build, then start every service that is not running
#                       (a running service whose binary changed is restarted)
#   services.sh down    stop every service by PID (SIGTERM, then SIGKILL)
#   services.sh status  print each service up/down; exit 1 if any is down
#
# Every address is a KURZ_* variable with the defaults below (see docs/configuration.md).
# Runtime files live under ${KURZ_LOCAL_DIR:-<repo>/.local}: bin/, run/*.pid,
# log/*.log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOCAL=${KURZ_LOCAL_DIR:-$ROOT/.local}
BIN=$LOCAL/bin RUN=$LOCAL/run LOG=$LOCAL/log

# Start order: the shortener applies the PostgreSQL schema the redirect reads.
SERVICES=(limiter shortener analytics redirect gateway)

export KURZ_LIMITER_GRPC_ADDR=${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}
export KURZ_LIMITER_HTTP_ADDR=${KURZ_LIMITER_HTTP_ADDR:-127.0.0.1:9191}
export KURZ_SHORTENER_GRPC_ADDR=${KURZ_SHORTENER_GRPC_ADDR:-127.0.0.1:9092}
export KURZ_SHORTENER_HTTP_ADDR=${KURZ_SHORTENER_HTTP_ADDR:-127.0.0.1:9192}
export KURZ_ANALYTICS_GRPC_ADDR=${KURZ_ANALYTICS_GRPC_ADDR:-127.0.0.1:9093}
export KURZ_ANALYTICS_HTTP_ADDR=${KURZ_ANALYTICS_HTTP_ADDR:-127.0.0.1:9193}
export KURZ_REDIRECT_GRPC_ADDR=${KURZ_REDIRECT_GRPC_ADDR:-127.0.0.1:9094}
export KURZ_REDIRECT_HTTP_ADDR=${KURZ_REDIRECT_HTTP_ADDR:-127.0.0.1:8787}
export KURZ_REDIRECT_OPS_ADDR=${KURZ_REDIRECT_OPS_ADDR:-127.0.0.1:9194}
export KURZ_GATEWAY_GRPC_ADDR=${KURZ_GATEWAY_GRPC_ADDR:-127.0.0.1:9095}
export KURZ_GATEWAY_HTTP_ADDR=${KURZ_GATEWAY_HTTP_ADDR:-127.0.0.1:8080}
export KURZ_GATEWAY_OPS_ADDR=${KURZ_GATEWAY_OPS_ADDR:-127.0.0.1:9195}
# The stores where infra.sh put them (KURZ_PG_PORT, KURZ_REDIS_BASE_PORT,
# KURZ_CH_TCP_PORT), unless their addresses are given.
own_postgres_url=${KURZ_POSTGRES_URL:-}
if [[ -n ${KURZ_PG_PORT:-} ]]; then
  export KURZ_POSTGRES_URL=${KURZ_POSTGRES_URL:-postgres://kurz:kurz@127.0.0.1:${KURZ_PG_PORT}/kurz?sslmode=disable}
fi
# The redirect reads links and domains only, under a login that can do
# nothing else (infra.sh creates it; pkg/linkschema ReaderRole); with a
# KURZ_POSTGRES_URL of your own, the same as the other services'.
KURZ_REDIRECT_POSTGRES_URL=${KURZ_REDIRECT_POSTGRES_URL:-${own_postgres_url:-postgres://kurz_redirect:kurz-redirect@127.0.0.1:${KURZ_PG_PORT:-5433}/kurz?sslmode=disable}}
if [[ -n ${KURZ_REDIS_BASE_PORT:-} ]]; then
  export KURZ_REDIS_ADDRS=${KURZ_REDIS_ADDRS:-127.0.0.1:${KURZ_REDIS_BASE_PORT},127.0.0.1:$((KURZ_REDIS_BASE_PORT + 1)),127.0.0.1:$((KURZ_REDIS_BASE_PORT + 2))}
fi
if [[ -n ${KURZ_CH_TCP_PORT:-} ]]; then
  export KURZ_CLICKHOUSE_ADDRS=${KURZ_CLICKHOUSE_ADDRS:-127.0.0.1:${KURZ_CH_TCP_PORT}}
fi
# Limiter: the 10 ms default Redis deadline holds 32 callers on this machine
# (make bench measures it), but make demo's burst of 500 concurrent calls on
# one key queues ~500 scripts on one Redis node: it would miss 10 ms and be
# decided by the rules' fallbacks instead.
export KURZ_LIMITER_REDIS_TIMEOUT=${KURZ_LIMITER_REDIS_TIMEOUT:-50ms}
# Shortener and redirect: grpcurl may create links without a tenant (they
# belong to "anonymous"); short URLs point at the local redirect service.
export KURZ_SHORTENER_ALLOW_ANONYMOUS=${KURZ_SHORTENER_ALLOW_ANONYMOUS:-true}
export KURZ_SHORTENER_BASE_URL=${KURZ_SHORTENER_BASE_URL:-http://127.0.0.1:8787}
# A fixed, public key for local use only: anyone can invert these codes.
export KURZ_SHORTENER_CODE_KEY=${KURZ_SHORTENER_CODE_KEY:-kurz-local-code-key-not-a-secret-0123456789}
export KURZ_REDIRECT_VISITOR_SALT=${KURZ_REDIRECT_VISITOR_SALT:-kurz-local-visitor-salt-0123456789abcdef}
# make bench draws up to 1,000,000 codes from one loopback address: lift the
# per-IP walk bound here (the service's default is 10/s, bursts of 1,000).
export KURZ_REDIRECT_WALK_RATE=${KURZ_REDIRECT_WALK_RATE:-1000000}
export KURZ_REDIRECT_WALK_BURST=${KURZ_REDIRECT_WALK_BURST:-1000000}
# Analytics: statistics of those anonymous links, for calls without a tenant.
export KURZ_ANALYTICS_ALLOW_ANONYMOUS=${KURZ_ANALYTICS_ALLOW_ANONYMOUS:-true}
# Gateway: link creation without an API key (tenant "anonymous", limited per
# client IP), and a local-only admin token for /v1/admin/... (the examples in
# services/gateway/README.md use it).
export KURZ_GATEWAY_ALLOW_ANONYMOUS=${KURZ_GATEWAY_ALLOW_ANONYMOUS:-true}
export KURZ_GATEWAY_ADMIN_TOKEN=${KURZ_GATEWAY_ADMIN_TOKEN:-kurz-local-admin-token}
# The code key and admin token above are published in this repository: the
# services refuse such values unless told this is a local setup.
export KURZ_ALLOW_PUBLISHED_SECRETS=${KURZ_ALLOW_PUBLISHED_SECRETS:-true}

# Each service's GOMEMLIMIT, as its pod has it in deploy/k8s/base (below the
# pod's memory limit): the Go runtime collects harder as the heap nears it
# rather than grow without bound. A GOMEMLIMIT in the environment wins.
declare -A GOMEMLIMITS=([limiter]=200MiB [shortener]=200MiB [analytics]=400MiB [redirect]=200MiB [gateway]=200MiB)
# Internal gRPC calls carry assertions signed with KURZ_SERVICE_AUTH_KEY (the
# gateway signs, the shortener and analytics verify and refuse unsigned
# calls; the limiter only those of its rules admin API). Unless set, it is a random key made once in $LOCAL/service-auth.key
# (readable by this user only), so that restarted services agree; tools that
# call the shortener or analytics directly (clicklag) read it from there.
local_service_auth_key() {
	local f=$LOCAL/service-auth.key
	if [[ ! -s $f ]]; then
		mkdir -p "$LOCAL"
		(umask 077 && head -c 48 /dev/urandom | base64 | tr -d '\n' >"$f")
	fi
	cat "$f"
}
KURZ_SERVICE_AUTH_KEY=${KURZ_SERVICE_AUTH_KEY:-$(local_service_auth_key)}
export KURZ_SERVICE_AUTH_KEY

# Each secret goes only to the services that use it (a service's
# /proc/<pid>/environ holds no other's).
declare -A SECRET_USERS=(
	[KURZ_GATEWAY_ADMIN_TOKEN]="gateway"
	[KURZ_SERVICE_AUTH_KEY]="gateway shortener analytics limiter"
	[KURZ_SERVICE_AUTH_PREVIOUS_KEY]="gateway shortener analytics limiter"
	[KURZ_SHORTENER_CODE_KEY]="shortener"
	[KURZ_SHORTENER_WEBHOOK_KEY]="shortener"
	[KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY]="shortener"
	[KURZ_REDIRECT_VISITOR_SALT]="redirect"
	[KURZ_REDIRECT_FORM_SECRET]="redirect"
	[KURZ_POSTGRES_URL]="limiter shortener gateway"
	[KURZ_CLICKHOUSE_PASSWORD]="analytics"
	[KURZ_REDIS_PASSWORD]="limiter shortener analytics redirect"
)

# env_of prints the env(1) arguments that start service $1: the secrets of
# other services removed, the redirect's own PostgreSQL login.
env_of() {
	local s=$1 v
	for v in "${!SECRET_USERS[@]}"; do
		[[ " ${SECRET_USERS[$v]} " == *" $s "* ]] || printf '%s\0' -u "$v"
	done
	if [[ $s == redirect ]]; then
		# The stack's variable, not the redirect's (which would warn of it).
		printf '%s\0' -u KURZ_REDIRECT_POSTGRES_URL "KURZ_POSTGRES_URL=$KURZ_REDIRECT_POSTGRES_URL"
	fi
}

http_addr() { local v="KURZ_${1^^}_HTTP_ADDR"; echo "${!v}"; }
# ops_addr is where /readyz is: the ops listener of the public services, the
# HTTP listener of the others.
ops_addr() { local v="KURZ_${1^^}_OPS_ADDR"; echo "${!v:-$(http_addr "$1")}"; }
grpc_addr() { local v="KURZ_${1^^}_GRPC_ADDR"; echo "${!v}"; }

pid_of() {
	local f=$RUN/$1.pid pid
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
	echo "$pid"
}

build() {
	mkdir -p "$BIN"
	local t0=$SECONDS
	(cd "$ROOT" && for s in "${SERVICES[@]}"; do go build -o "$BIN/$s" "./services/$s"; done)
	echo "built ${SERVICES[*]} in $((SECONDS - t0))s"
}

await_ready() {
	local s=$1 pid=$2 url
	url="http://$(ops_addr "$1")/readyz"
	for _ in $(seq 1 150); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "$s exited during start; last lines of $LOG/$s.log:" >&2
			tail -n 20 "$LOG/$s.log" >&2
			return 1
		fi
		curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null && return 0
		sleep 0.2
	done
	echo "$s not ready at $url after 30s; last lines of $LOG/$s.log:" >&2
	tail -n 20 "$LOG/$s.log" >&2
	return 1
}

start() {
	local s=$1 pid sum
	sum=$(sha256sum "$BIN/$s" | cut -c1-16)
	if pid=$(pid_of "$s"); then
		if [[ $(cat "$RUN/$s.sum" 2>/dev/null) == "$sum" ]]; then
			return 0
		fi
		echo "$s: binary changed, restarting"
		stop "$s"
	fi
	: >"$LOG/$s.log"
	# setsid: the service gets its own session, so it outlives this shell
	# and a terminal's ^C does not reach it; `down` stops it by PID.
	local envs=()
	mapfile -d '' envs < <(env_of "$s")
	GOMEMLIMIT=${GOMEMLIMIT:-${GOMEMLIMITS[$s]}} env "${envs[@]}" setsid "$BIN/$s" >>"$LOG/$s.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$RUN/$s.pid"
	echo "$sum" >"$RUN/$s.sum"
	await_ready "$s" "$pid"
}

stop() {
	local s=$1 pid
	pid=$(pid_of "$s") || { rm -f "$RUN/$s.pid"; return 0; }
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "$s (pid $pid) did not stop within 10s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$RUN/$s.pid" "$RUN/$s.sum"
}

cmd_up() {
	mkdir -p "$RUN" "$LOG"
	build
	local t0=$SECONDS
	for s in "${SERVICES[@]}"; do start "$s"; done
	echo "services ready in $((SECONDS - t0))s:"
	printf '  %-10s gRPC %-16s HTTP http://%s\n' \
		limiter "$(grpc_addr limiter)" "$(http_addr limiter)" \
		shortener "$(grpc_addr shortener)" "$(http_addr shortener)" \
		analytics "$(grpc_addr analytics)" "$(http_addr analytics)" \
		redirect "$(grpc_addr redirect)" "$(http_addr redirect)  (public; ops http://$(ops_addr redirect))" \
		gateway "$(grpc_addr gateway)" "$(http_addr gateway)  (public; ops http://$(ops_addr gateway))"
}

cmd_down() {
	local i
	for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop "${SERVICES[i]}"; done
	echo "services stopped"
}

cmd_status() {
	local s pid rc=0
	for s in "${SERVICES[@]}"; do
		if pid=$(pid_of "$s"); then
			printf '%-10s up   pid %s\n' "$s" "$pid"
		else
			printf '%-10s down\n' "$s"
			rc=1
		fi
	done
	return $rc
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
*)
	echo "usage: $0 up|down|status" >&2
	exit 2
	;;
esac
