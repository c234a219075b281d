#!/usr/bin/env bash
# deploy/bench/bench.sh — what `make bench` runs: every measurement beside a
# baseline from the same run, written to BENCHMARKS.md (dated, with the
# machine's CPU and core count). Needs the stack of `make up`.
#
# BENCH_DURATION (default 10s) is the length of each load-generator run,
# BENCH_MATRIX_DURATION (default 2s) of each cell of the limiter matrix,
# BENCH_PEERS_ROUNDS (default 2) how many times each kurz vs peers
# measurement runs (deploy/bench/peers.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
D=${BENCH_DURATION:-10s}
MATRIX_D=${BENCH_MATRIX_DURATION:-2s} # 80 cells of the limiter matrix
LIMITER=${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}
REDIRECT=${KURZ_REDIRECT_HTTP_ADDR:-127.0.0.1:8787}
export KURZ_POSTGRES_URL=${KURZ_TEST_POSTGRES_URL:-postgres://kurz:kurz@127.0.0.1:5433/kurz_test?sslmode=disable}
export KURZ_CLICKHOUSE_DATABASE=${KURZ_TEST_CLICKHOUSE_DATABASE:-kurz_test}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
started=$SECONDS

# section TITLE DESCRIPTION -- COMMAND...: runs COMMAND, shows its output,
# and records it with its command line under TITLE.
section() {
	local title=$1 desc=$2
	shift 3
	echo "== $title" >&2
	local res
	res=$("$@" 2>&1 | grep -v -E '^(goos|goarch|pkg|cpu|PASS|ok |--- BENCH|\s+handler.go|\s+\.\.\. \[output truncated\]|\s*$)' | tee /dev/stderr)
	{
		# shellcheck disable=SC2016 # a literal "$ " before the command line
		printf '\n## %s\n\n%s\n\n```\n$ %s\n%s\n```\n' "$title" "$desc" "$*" "$res"
		ratios "$res"
	} >>"$out"
}

# ratios prints, for Go benchmark pairs, the throughput ratio of each
# measurement to its baseline line (the one named baseline, evalsha, redis
# or Ping).
ratios() {
	awk '
		/^Benchmark/ {
			name = $1; sub(/-[0-9]+$/, "", name)
			for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") ns[name] = $i
			for (i = 2; i < NF; i++) if ($(i+1) == "bytes/key") mem[name] = $i
			for (i = 2; i < NF; i++) if ($(i+1) == "events/s") eps[name] = $i
			order[++n] = name
		}
		END {
			for (k = 1; k <= n; k++) {
				name = order[k]; base = ""
				if (name ~ /\/engine$/) { base = name; sub(/\/engine$/, "/evalsha", base) }
				if (name ~ /\/leased$/) { base = name; sub(/\/leased$/, "/redis", base) }
				if (name ~ /^BenchmarkCheck\//) base = "BenchmarkPing"
				if (base != "" && (base in ns) && ns[name] > 0)
					printf "- %s: %.2f x the throughput of %s\n", name, ns[base] / ns[name], base
				if (name ~ /^BenchmarkServeCodeL1HitRules\// && ns[name] > 0) {
					plain = name; sub(/HitRules/, "Hit", plain)
					if (plain in ns)
						printf "- goal: a link with rules within 10%% of a plain one: %s %.2f x its throughput, %s\n", name, ns[plain] / ns[name], (ns[plain] / ns[name] >= 0.9 ? "met" : "missed")
				}
				if (name ~ /\/leased$/ && (base in ns) && ns[name] > 0)
					printf "- target (issue #15): leased >= 3 x the Redis-decided rule: %.2f x, %s\n", ns[base] / ns[name], (ns[base] / ns[name] >= 3 ? "met" : "missed")
				if (name ~ /ConsumerThroughput\/limiter=/ && (name in eps))
					printf "- target (issue #15): a consumer with the stack'"'"'s limiter >= 50,000 events/s: %s %.0f events/s, %s\n", name, eps[name], (eps[name] >= 50000 ? "met" : "missed")
				if (name ~ /MemoryPerKey\// && name !~ /baseline/) {
					b = name; sub(/\/[^\/]*$/, "/baseline-counter", b)
					if ((b in mem) && mem[b] > 0) printf "- %s: %.1f x the bytes of a plain counter\n", name, mem[name] / mem[b]
				}
			}
		}' <<<"$1"
}

section "Limiter: CheckQuota through gRPC, closed loop" \
	"32 concurrent callers, demo token bucket over 10,000 keys; baseline: gRPC health checks on the same server and connections." -- \
	go run ./services/limiter/cmd/quotaload -addr "$LIMITER" -c 32 -d "$D" -baseline
section "Limiter at the production Redis deadline" \
	"A second limiter beside the stack with the default KURZ_LIMITER_REDIS_TIMEOUT (10 ms; make up's runs with 50 ms), 32 callers, 100,000 keys: the answers by source (target: >= 99% decided on Redis)." -- \
	deploy/bench/default-deadline.sh
section "Limiter: CheckQuota, open loop" \
	"3,000 calls/s over 64 workers; latency counted from each call's scheduled start." -- \
	go run ./services/limiter/cmd/quotaload -addr "$LIMITER" -c 64 -d "$D" -rate 3000
section "Limiter: every algorithm, hot key and spread keys, vs direct EVALSHA" \
	"CheckQuota through the running limiter against the same Lua script called directly with EVALSHA on the same cluster, at the same concurrency (closed loop, $MATRIX_D per cell); one hot key (over its limit after 100 calls) and 100,000 uniform keys; then open loop at half the maximum rate." -- \
	go run ./services/limiter/cmd/quotaload -addr "$LIMITER" -matrix -d "$MATRIX_D"
section "Limiter engine vs direct EVALSHA" \
	"The engine (rule match, auto-pipelined script, response) against the same Lua script called directly with EVALSHA, same process, same concurrency, 100,000 keys." -- \
	go test -tags integration -run '^$' -bench BenchmarkDecisionVsEvalsha -benchtime 2s ./services/limiter/internal/ratelimit/
section "Limiter engine vs PING" \
	"One decision (direct and auto-pipelined) against a bare PING through the same client." -- \
	go test -tags integration -run '^$' -bench 'BenchmarkCheck|BenchmarkPing' -benchtime 3s ./services/limiter/internal/ratelimit/
section "Limiter: leased vs Redis-decided hot key" \
	"One key called by 32 goroutines through the engine (auto-pipelined): the token bucket decided on Redis, then the same rule leased 100 units at a time (one script call per lease, the other calls answered from memory); target: leased >= 3x." -- \
	go test -tags integration -run '^$' -bench BenchmarkLeasedHotKey -benchtime 3s ./services/limiter/internal/ratelimit/
section "Redis memory per active key" \
	"MEMORY USAGE of one key after 100 requests in its window, per algorithm; baseline: a plain INCR counter." -- \
	go test -tags integration -run '^$' -bench BenchmarkMemoryPerKey -benchtime 1x ./services/limiter/internal/ratelimit/
section "Redirect, closed loop" \
	"32 HTTP callers; one viral code, the same with four redirect rules and two variants (L1 hit; goal: within 10% of the plain one), 1,000,000 codes drawn uniformly (Redis hits), 10,000 unknown codes (negative cache); baseline: a minimal net/http handler answering a fixed 302, measured in the same process." -- \
	go run ./tools/redirectload -addr "$REDIRECT" -c 32 -d "$D" -codes 1000000
section "Redirect, open loop" \
	"3,000 requests/s over 64 workers." -- \
	go run ./tools/redirectload -addr "$REDIRECT" -c 64 -d "$D" -rate 3000 -codes 2000
section "Redirect handler: L1 hit, plain link vs rules" \
	"The handler in process (no network): GET of a code L1 holds, a plain link against one with four redirect rules no request matches and two variants, same browser headers; goal: rules within 10%." -- \
	go test -tags integration -run '^$' -bench 'BenchmarkServeCodeL1Hit' -benchtime 3s ./services/redirect/internal/redirector/
section "Shortener: CreateLink" \
	"Sequential vs random codes over gRPC in-process, PostgreSQL statements per link and nextval per 1,000 links." -- \
	go test -tags integration -run '^$' -bench BenchmarkCreateLink -benchtime 3s ./services/shortener/internal/app/
section "Analytics: GetLinkStats at 1,000,000 clicks" \
	"One link with 1M stored clicks (10,000 redelivered, 1,000 stored twice)." -- \
	go test -tags integration -run '^$' -bench GetLinkStats1M -benchtime 3s ./services/analytics/internal/stats/
section "Analytics: click pipeline, consumers vs a direct ClickHouse insert" \
	"50,000 click events from the streams into ClickHouse with 1, 2 and 4 consumers of one group, flood checks answered by an allow-all fake limiter and then by the stack's limiter (CheckQuotas, 100 checks a call); baseline: the same rows inserted directly in batches of 5,000 (x-baseline = consumer events/s over the baseline's)." -- \
	env KURZ_BENCH_LIMITER_ADDR="${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}" go test -tags integration -run '^$' -bench ConsumerThroughput -benchtime 3x ./services/analytics/internal/consumer/
# clicklag calls the analytics service as the gateway does, with the
# stack's service-auth key: from the environment, so that the command line
# BENCHMARKS.md shows does not carry it.
KURZ_SERVICE_AUTH_KEY=${KURZ_SERVICE_AUTH_KEY:-$(cat "${KURZ_LOCAL_DIR:-.local}/service-auth.key")}
export KURZ_SERVICE_AUTH_KEY
section "Analytics: end-to-end lag, redirect to queryable stats" \
	"20 clicks, one after the other, each GET on the redirect then GetLinkStats polled every 10 ms until it counts the click (the stack's KURZ_SERVICE_AUTH_KEY in the environment)." -- \
	go run ./services/analytics/cmd/clicklag -n 20

# kurz vs peers: markdown tables of its own (deploy/bench/peers.sh; make
# bench-peers runs it alone). If it fails, the rest is still written, and
# make bench fails at the end.
echo "== kurz vs peers" >&2
peers_rc=0
peers=$(deploy/bench/peers.sh | tee /dev/stderr) || peers_rc=$?
if ((peers_rc != 0)); then
	peers="## kurz vs peers

Not measured: deploy/bench/peers.sh failed (exit $peers_rc); its errors are in make bench's output."
fi
printf '\n%s\n' "$peers" >>"$out"

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
{
	echo "# Benchmarks"
	echo
	echo "Generated by \`make bench\` on $(date -u '+%Y-%m-%d %H:%M UTC') in $((SECONDS - started)) s: ${cpu:-unknown CPU}, $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB,"
	echo "$(go version | cut -d' ' -f3), Redis $(redis-server --version | cut -d' ' -f3 | tr -d 'v='), with the whole local stack and the load generators on the same cores."
	echo "Absolute numbers move by ±30% between runs on such a machine; compare the ratios to the baselines of the same run."
	echo "Each section states the targets of issue #15 it measures, met or missed, from this run's figures; what they mean: README.md (Performance) and docs/performance.md."
	cat "$out"
} >BENCHMARKS.md
echo "wrote BENCHMARKS.md in $((SECONDS - started)) s" >&2
exit "$peers_rc"
