#!/usr/bin/env bash
# deploy/local/smoke.sh — checks the stack that `make up` started, from the
# outside, the way an operator would: gRPC health and reflection through
# grpcurl, /readyz and /metrics on each service's ops listener (and not on
# the public ones). Exits non-zero on the first failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GRPCURL=${GRPCURL:-$ROOT/bin/grpcurl}
SMOKE_TMP=$(umask 077 && mktemp -d)
trap 'rm -rf "$SMOKE_TMP"' EXIT

declare -A GRPC=(
	[limiter]=${KURZ_LIMITER_GRPC_ADDR:-127.0.0.1:9091}
	[shortener]=${KURZ_SHORTENER_GRPC_ADDR:-127.0.0.1:9092}
	[analytics]=${KURZ_ANALYTICS_GRPC_ADDR:-127.0.0.1:9093}
	[redirect]=${KURZ_REDIRECT_GRPC_ADDR:-127.0.0.1:9094}
	[gateway]=${KURZ_GATEWAY_GRPC_ADDR:-127.0.0.1:9095}
)
# Where /readyz and /metrics are: the HTTP listener of the internal services,
# the ops listener of the public ones.
declare -A OPS=(
	[limiter]=${KURZ_LIMITER_HTTP_ADDR:-127.0.0.1:9191}
	[shortener]=${KURZ_SHORTENER_HTTP_ADDR:-127.0.0.1:9192}
	[analytics]=${KURZ_ANALYTICS_HTTP_ADDR:-127.0.0.1:9193}
	[redirect]=${KURZ_REDIRECT_OPS_ADDR:-127.0.0.1:9194}
	[gateway]=${KURZ_GATEWAY_OPS_ADDR:-127.0.0.1:9195}
)
declare -A PUBLIC=(
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
	check "$s /readyz 200" curl -fsS --max-time 5 -o /dev/null "http://${OPS[$s]}/readyz"
	check "$s /metrics" bash -c "curl -fsS --max-time 5 'http://${OPS[$s]}/metrics' | grep -q '^go_goroutines'"
	if [[ -n ${PUBLIC[$s]:-} ]]; then
		check "$s public /metrics 404" bash -c "[[ \$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' 'http://${PUBLIC[$s]}/metrics') == 404 ]]"
	fi
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

# End to end: a tenant and its API key from the gateway's admin API, a link
# created with that key, N browser redirects through the redirect service,
# and exactly N human clicks from one visitor in the link's statistics
# through the gateway once the consumer has moved them into ClickHouse
# (bounded wait). Statistics go through the gateway: the analytics service
# answers only calls the gateway signed (KURZ_SERVICE_AUTH_KEY).
# bearer prints a path to read an Authorization header with token from
# (curl -H @path): a token in curl's arguments is visible to ps.
bearer() { printf '%s\n' "Authorization: Bearer $1" >"$SMOKE_TMP/auth-$2" && echo "@$SMOKE_TMP/auth-$2"; }

clicks_end_to_end() {
	local n=7 code i stats key tenant="smoke-$(date +%s%N)" gw="http://${PUBLIC[gateway]}"
	local admin
	admin=$(bearer "${KURZ_GATEWAY_ADMIN_TOKEN:-kurz-local-admin-token}" admin)
	curl -fsS --max-time 5 "$gw/v1/admin/tenants" -H "$admin" \
		-d "{\"id\":\"$tenant\",\"name\":\"smoke\",\"plan\":\"free\"}" >/dev/null || { echo "no tenant $tenant"; return 1; }
	key=$(curl -fsS --max-time 5 -XPOST "$gw/v1/admin/tenants/$tenant/keys" -H "$admin" -d '{"name":"smoke"}' |
		sed -n 's/.*"key":"\([^"]*\)".*/\1/p')
	[[ -n $key ]] || { echo "no API key for $tenant"; return 1; }
	key=$(bearer "$key" key)
	code=$(curl -fsS --max-time 5 "$gw/v1/links" -H "$key" -d '{"longUrl":"https://example.com/smoke-clicks"}' |
		sed -n 's/.*"code":"\([^"]*\)".*/\1/p')
	[[ -n $code ]] || { echo "no code from POST /v1/links"; return 1; }
	for ((i = 0; i < n; i++)); do
		curl -fsS --max-time 5 -o /dev/null -w '%{http_code}\n' -A 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36' \
			"http://${PUBLIC[redirect]}/$code" | grep -qx 302 || { echo "redirect $i of $code was not a 302"; return 1; }
	done
	for _ in $(seq 1 150); do
		stats=$(curl -fsS --max-time 5 "$gw/v1/links/$code/stats?interval=day" -H "$key" 2>/dev/null | tr -d ' \n')
		if [[ $stats == *"\"total\":\"$n\""* && $stats == *"\"human\":\"$n\""* && $stats == *"\"uniqueVisitors\":\"1\""* ]]; then
			return 0
		fi
		sleep 0.2
	done
	echo "stats of $code after 30 s: $stats"
	return 1
}
check "7 redirects through a gateway-created link -> 7 human clicks, 1 visitor in its stats" clicks_end_to_end

echo "smoke: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
