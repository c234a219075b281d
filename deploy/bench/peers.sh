#!/usr/bin/env bash
# deploy/bench/peers.sh — the "kurz vs peers" section of make bench, which
# make bench-peers runs alone: kurz's limiter and redirect service under the
# same load as peers this script starts beside them, on the same machine.
#
#   limiter   envoyproxy/ratelimit (fixed window on the stack's Redis
#             Cluster) and gubernator (one node, in memory), installed pinned
#             into ./bin by make; every target enforces 100 per minute per
#             user (tools/peerload).
#   redirect  a net/http handler answering a fixed 302 in its own process
#             (tools/fixed302) and the design notes' Node
#             prototype (deploy/bench/node-prototype, npm ci by make) on a
#             redis-server of its own (tools/redirectpeers).
#
# Needs the stack of make up (it starts nothing of it). Writes the section's
# markdown to stdout, progress to stderr; stops what it started on exit.
#
# Ports, on 127.0.0.1, outside everything the stack uses, and checked free
# first: 9301-9309.
#   9301 9302 9303  envoyproxy/ratelimit gRPC, HTTP, debug
#   9304 9305 9306  gubernator gRPC, HTTP, member-list (TCP and UDP)
#   9307            fixed302
#   9308 9309       Node prototype, its redis-server
#
# BENCH_DURATION (default 10s) is the length of each run, BENCH_PEERS_ROUNDS
# (default 2) how many times each target runs, in turns. The stack's
# processes are found by the ports they listen on (KURZ_* addresses, as in
# deploy/local), else by the pid files under KURZ_LOCAL_DIR (<repo>/.local).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
D=${BENCH_DURATION:-10s}
ROUNDS=${BENCH_PEERS_ROUNDS:-2}
BIN=${PEERS_BIN:-$ROOT/bin}
LOCAL=${KURZ_LOCAL_DIR:-$ROOT/.local}
LIMITER=${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}
LIMITER_HTTP=${KURZ_LIMITER_HTTP_ADDR:-127.0.0.1:9191}
REDIRECT=${KURZ_REDIRECT_HTTP_ADDR:-127.0.0.1:8787}
REDIRECT_OPS=${KURZ_REDIRECT_OPS_ADDR:-127.0.0.1:9194}
ANALYTICS_HTTP=${KURZ_ANALYTICS_HTTP_ADDR:-127.0.0.1:9193}
CLICKHOUSE_PORT=${KURZ_CH_TCP_PORT:-9000}
REDIS_ADDRS=${KURZ_REDIS_ADDRS:-127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005,127.0.0.1:7006}
NODE_DIR=$ROOT/deploy/bench/node-prototype

ENVOY_GRPC=9301 ENVOY_HTTP=9302 ENVOY_DEBUG=9303
GUB_GRPC=9304 GUB_HTTP=9305 GUB_MEMBERLIST=9306
FIXED302=9307 NODE=9308 NODE_REDIS=9309

log() { echo "peers: $*" >&2; }
die() {
	log "$*"
	exit 1
}

for f in "$BIN/service_cmd" "$BIN/gubernator" "$NODE_DIR/node_modules/ioredis/package.json"; do
	[[ -e $f ]] || die "missing $f: run make bench-peers (it installs the peers)"
done
for p in $(seq 9301 9309); do
	[[ -z $(ss -Hltn "sport = :$p") ]] || die "port $p is in use; this script needs 9301-9309"
done
[[ -z $(ss -Hlun "sport = :$GUB_MEMBERLIST") ]] || die "UDP port $GUB_MEMBERLIST is in use"

# pid_of NAME PORT: the stack's process NAME, the one listening on PORT, else
# the one in NAME's pid file.
pid_of() {
	local pid f=$LOCAL/run/$1.pid
	pid=$(ss -Hltnp "sport = :$2" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true)
	if [[ -z $pid && -f $f ]]; then
		pid=$(<"$f")
		kill -0 "$pid" 2>/dev/null || pid=
	fi
	[[ -n $pid ]] || die "$1: nothing listens on port $2 and no live pid in $f: is the stack up (make up)?"
	echo "$pid"
}
port() { echo "${1##*:}"; }

curl -fsS -o /dev/null --max-time 2 "http://$LIMITER_HTTP/readyz" || die "the limiter is not ready at $LIMITER_HTTP: is the stack up (make up)?"
curl -fsS -o /dev/null --max-time 2 "http://$REDIRECT_OPS/readyz" || die "the redirect service is not ready at $REDIRECT_OPS: is the stack up (make up)?"
limiter_pid=$(pid_of limiter "$(port "$LIMITER")")
redirect_pid=$(pid_of redirect "$(port "$REDIRECT")")
analytics_pid=$(pid_of analytics "$(port "$ANALYTICS_HTTP")")
clickhouse_pid=$(pid_of clickhouse "$CLICKHOUSE_PORT")
redis_pids=
for a in ${REDIS_ADDRS//,/ }; do
	p=$(pid_of "redis-$(port "$a")" "$(port "$a")")
	redis_pids+=${redis_pids:+,}$p
done

# alive PID: the process runs (a child that exited stays a zombie until
# reaped, and kill -0 would still find it).
alive() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	[[ ${s:0:1} != Z ]]
}

tmp=$(mktemp -d)
started=()
cleanup() {
	local pid
	for pid in "${started[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${started[@]}"; do
		for _ in $(seq 1 50); do
			alive "$pid" || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME CHECK CMD...: runs CMD in the background (its log in $tmp),
# waits until the command CHECK succeeds, and sets pid. CMD execs the
# server itself (env ... BINARY), so $! is the server's PID.
start() {
	local name=$1 check=$2
	shift 2
	"$@" >"$tmp/$name.log" 2>&1 &
	pid=$!
	started+=("$pid")
	for _ in $(seq 1 150); do
		if ! alive "$pid"; then
			tail -n 20 "$tmp/$name.log" >&2
			die "$name exited during start"
		fi
		if eval "$check" >/dev/null 2>&1; then
			log "$name up (pid $pid)"
			return 0
		fi
		sleep 0.2
	done
	tail -n 20 "$tmp/$name.log" >&2
	die "$name not ready after 30 s"
}

# envoyproxy/ratelimit: its rule in a runtime directory; the stack's Redis
# Cluster; its local cache of over-limit keys on (64 MiB), as kurz's
# over-limit cache is, so a hot key over its limit is answered from memory
# by both; its defaults otherwise (a pool of 10 connections per node). The
# pipeline window is what its docs require for cluster mode (150us-500us).
# Stats go to its log sink, not a statsd that is not there.
mkdir -p "$tmp/runtime/ratelimit/config"
cat >"$tmp/runtime/ratelimit/config/kurz-peers.yaml" <<'EOF'
domain: kurz-peers
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
EOF
start envoy-ratelimit "curl -fsS http://127.0.0.1:$ENVOY_HTTP/healthcheck" \
	env USE_STATSD=false LOG_LEVEL=warn \
	REDIS_TYPE=cluster REDIS_SOCKET_TYPE=tcp REDIS_URL="$REDIS_ADDRS" REDIS_PIPELINE_WINDOW=150us \
	LOCAL_CACHE_SIZE_IN_BYTES=67108864 \
	RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
	HOST=127.0.0.1 PORT=$ENVOY_HTTP DEBUG_HOST=127.0.0.1 DEBUG_PORT=$ENVOY_DEBUG \
	GRPC_HOST=127.0.0.1 GRPC_PORT=$ENVOY_GRPC "$BIN/service_cmd"
envoy_pid=$pid

# gubernator: one node, a member-list of itself; its cache holds every key
# of a run (its default, 50,000, would forget limits of the 100,000 keys);
# no trace exporter (there is no collector).
start gubernator "curl -fsS http://127.0.0.1:$GUB_HTTP/v1/HealthCheck | grep -q '\"peer_count\":1'" \
	env GUBER_GRPC_ADDRESS=127.0.0.1:$GUB_GRPC GUBER_HTTP_ADDRESS=127.0.0.1:$GUB_HTTP \
	GUBER_MEMBERLIST_ADDRESS=127.0.0.1:$GUB_MEMBERLIST GUBER_MEMBERLIST_BIND_ADDRESS=127.0.0.1:$GUB_MEMBERLIST \
	GUBER_MEMBERLIST_KNOWN_NODES=127.0.0.1:$GUB_MEMBERLIST GUBER_CACHE_SIZE=1000000 GUBER_LOG_LEVEL=warn \
	OTEL_TRACES_EXPORTER=none "$BIN/gubernator"
gubernator_pid=$pid

go build -o "$tmp/fixed302" ./tools/fixed302
start fixed302 "[[ \$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$FIXED302/x) == 302 ]]" \
	"$tmp/fixed302" -addr 127.0.0.1:$FIXED302
fixed302_pid=$pid

start node-redis "redis-cli -p $NODE_REDIS ping" \
	redis-server --bind 127.0.0.1 --port $NODE_REDIS --save '' --appendonly no --dir "$tmp"
node_redis_pid=$pid
start node-prototype "[[ \$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$NODE/x) == 404 ]]" \
	env PORT=$NODE REDIS_URL=redis://127.0.0.1:$NODE_REDIS node "$NODE_DIR/server.js"
node_pid=$pid

version() { go version -m "$1" | awk '$1 == "mod" { print $3 }'; }
cat <<EOF
## kurz vs peers

kurz's limiter and redirect service beside peers this run started, under the same load (\`make bench-peers\` runs this section alone).
Peers: envoyproxy/ratelimit $(version "$BIN/service_cmd") (REDIS_TYPE=cluster on the stack's Redis Cluster, REDIS_PIPELINE_WINDOW=150us, LOCAL_CACHE_SIZE_IN_BYTES=67108864: its cache of over-limit keys on, like kurz's; otherwise its defaults: 10 connections per node),
gubernator $(version "$BIN/gubernator") (one node, in memory, GUBER_CACHE_SIZE=1000000), a net/http handler answering a fixed 302 (tools/fixed302),
and the design notes' Node prototype (deploy/bench/node-prototype: Node $(node --version), ioredis $(node -p "require('$NODE_DIR/node_modules/ioredis/package.json').version"), on a redis-server of its own).
kurz: the running stack, its click consumers caught up before every run (clicks an earlier run queued would otherwise be consumed during the next). Everything shares the machine's $(nproc) cores with the load generator.

### Limiter

EOF
# Clicks queued by earlier sections (make bench's redirect runs) would be
# consumed on the same cores during the runs below: wait for the consumers.
go run ./tools/redirectpeers -settle-only >&2
log "limiter peers: $D per run, $ROUNDS round(s)"
go run ./tools/peerload -d "$D" -rounds "$ROUNDS" \
	-envoy 127.0.0.1:$ENVOY_GRPC -envoy-pid "$envoy_pid" -envoy-domain kurz-peers \
	-gubernator 127.0.0.1:$GUB_GRPC -gubernator-pid "$gubernator_pid" \
	-kurz "$LIMITER" -kurz-pid "$limiter_pid" -kurz-metrics "http://$LIMITER_HTTP/metrics" \
	-redis-pids "$redis_pids"
printf '\n### Redirect\n\n'
log "redirect peers: $D per run, $ROUNDS round(s)"
go run ./tools/redirectpeers -d "$D" -rounds "$ROUNDS" \
	-fixed302 127.0.0.1:$FIXED302 -fixed302-pid "$fixed302_pid" \
	-node 127.0.0.1:$NODE -node-pid "$node_pid" -node-redis 127.0.0.1:$NODE_REDIS -node-path-pids "$node_redis_pid" \
	-kurz "$REDIRECT" -kurz-pid "$redirect_pid" \
	-kurz-path-pids "$analytics_pid,$limiter_pid,$redis_pids,$clickhouse_pid" \
	-kurz-consumer-pids "$analytics_pid"
