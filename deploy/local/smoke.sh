#!/usr/bin/env bash
# deploy/local/smoke.sh — checks the stack that `make up` started, from the
# outside, the way an operator would: gRPC health and reflection through
# grpcurl, /readyz over HTTP. Exits non-zero on the first failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GRPCURL=${GRPCURL:-$ROOT/bin/grpcurl}

declare -A GRPC=(
	[limiter]=${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}
	[shortener]=${KURZ_SHORTENER_GRPC_ADDR:-127.0.0.1:9092}
	[analytics]=${KURZ_ANALYTICS_GRPC_ADDR:-127.0.0.1:9093}
	[redirect]=${KURZ_REDIRECT_GRPC_ADDR:-127.0.0.1:9094}
	[gateway]=${KURZ_GATEWAY_GRPC_ADDR:-127.0.0.1:9095}
)
declare -A HTTP=(
	[limiter]=${KURZ_LIMITER_HTTP_ADDR:-127.0.0.1:9191}
	[shortener]=${KURZ_SHORTENER_HTTP_ADDR:-127.0.0.1:9192}
	[analytics]=${KURZ_ANALYTICS_HTTP_ADDR:-127.0.0.1:9193}
	[redirect]=${KURZ_REDIRECT_HTTP_ADDR:-127.0.0.1:8787}
	[gateway]=${KURZ_GATEWAY_HTTP_ADDR:-127.0.0.1:8080}
)
declare -A API=(
	[limiter]=kurz.ratelimit.v1.RateLimitService
	[shortener]=kurz.shortener.v1.ShortenerService
	[analytics]=kurz.analytics.v1.AnalyticsService
)

passed=0 failed=0
check() {
	local what=$1
	shift
	if out=$("$@" 2>&1); then
		passed=$((passed + 1))
		printf 'ok    %s\n' "$what"
	else
		failed=$((failed + 1))
		printf 'FAIL  %s\n%s\n' "$what" "$out"
	fi
}

for s in limiter shortener analytics redirect gateway; do
	check "$s gRPC health SERVING" bash -c "'$GRPCURL' -plaintext -max-time 5 '${GRPC[$s]}' grpc.health.v1.Health/Check | grep -q '\"SERVING\"'"
	check "$s /readyz 200" curl -fsS --max-time 5 -o /dev/null "http://${HTTP[$s]}/readyz"
	check "$s /metrics" bash -c "curl -fsS --max-time 5 'http://${HTTP[$s]}/metrics' | grep -q '^go_goroutines'"
	if [[ -n ${API[$s]:-} ]]; then
		check "$s lists ${API[$s]} via reflection" bash -c "'$GRPCURL' -plaintext -max-time 5 '${GRPC[$s]}' list | grep -qx '${API[$s]}'"
	fi
done

# The README's CheckQuota example, as written there.
user="smoke-$(date +%s%N)"
check "README CheckQuota example allows with rule token_bucket from Redis" bash -c "'$GRPCURL' -plaintext -max-time 5 -d '{\"domain\":\"demo\",\"descriptors\":{\"user\":\"$user\"}}' '${GRPC[limiter]}' kurz.ratelimit.v1.RateLimitService/CheckQuota | tr -d ' \n' | grep -q '\"allowed\":true,\"decidingRule\":\"token_bucket\",\"limit\":\"100\",\"remaining\":\"99\"'"
check "limiter lists envoy.service.ratelimit.v3.RateLimitService" bash -c "'$GRPCURL' -plaintext -max-time 5 '${GRPC[limiter]}' list | grep -qx envoy.service.ratelimit.v3.RateLimitService"

# make demo: the notes' race, boundary trace and shortener transcript,
# through the running services, checked against the notes' figures.
check "make demo: the notes' figures" bash -c "cd '$ROOT' && go run ./services/limiter/cmd/kurz-demo -check"

echo "smoke: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
