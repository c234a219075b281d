#!/usr/bin/env bash
# deploy/bench/default-deadline.sh — a limiter with the production defaults
# (KURZ_LIMITER_REDIS_TIMEOUT unset: 10 ms, where make up's limiter runs with
# 50 ms for make demo's bursts), beside the stack on 127.0.0.1:9310 (gRPC)
# and 9311 (HTTP), loaded by quotaload at 32 callers over 100,000 keys: how
# many answers it decides on Redis, by source. Rules from the built-in
# bootstrap file. Needs the stack of make up (its Redis Cluster and the
# limiter binary services.sh built); stops what it started on exit.
#
# BENCH_DURATION (default 10s) is the length of the run; LIMITER_BIN (default
# the one services.sh built) another limiter binary, to compare builds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
LOCAL=${KURZ_LOCAL_DIR:-$ROOT/.local}
GRPC=127.0.0.1:9310 HTTP=127.0.0.1:9311
for p in 9310 9311; do
	[[ -z $(ss -Hltn "sport = :$p") ]] || { echo "default-deadline: port $p is in use" >&2; exit 1; }
done
log=$(mktemp)
env -u KURZ_LIMITER_REDIS_TIMEOUT KURZ_LIMITER_GRPC_ADDR=$GRPC KURZ_LIMITER_HTTP_ADDR=$HTTP \
	KURZ_LIMITER_RULES_SOURCE=file KURZ_LOG_LEVEL=warn "${LIMITER_BIN:-$LOCAL/bin/limiter}" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
	curl -fsS -o /dev/null --max-time 1 "http://$HTTP/readyz" 2>/dev/null && break
	kill -0 $pid 2>/dev/null || { echo "default-deadline: limiter exited:" >&2; cat "$log" >&2; exit 1; }
	sleep 0.1
done
go run ./services/limiter/cmd/quotaload -addr "$GRPC" -c 32 -k 100000 -d "${BENCH_DURATION:-10s}" -redis-target 0.99
echo "breaker openings: $(grep -c 'redis breaker opened' "$log" || true)"
