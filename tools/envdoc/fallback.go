package main

// fallback describes the variables whose field has no doc comment yet, in
// the words the README's configuration table used. Give the field a doc
// comment and delete its line here: the test fails on a line that is no
// longer used.
var fallback = map[string]string{
	"KURZ_ANALYTICS_GRPC_ADDR":       "analytics gRPC listen / dial address",
	"KURZ_ANALYTICS_HTTP_ADDR":       "ops HTTP (`/healthz`, `/readyz`, `/metrics`)",
	"KURZ_CLICKHOUSE_ADDRS":          "ClickHouse native-protocol addresses",
	"KURZ_CLICKHOUSE_DATABASE":       "database, created if missing",
	"KURZ_CLICKHOUSE_PASSWORD":       "credentials",
	"KURZ_CLICKHOUSE_USER":           "credentials",
	"KURZ_GATEWAY_GRPC_ADDR":         "gRPC health",
	"KURZ_GATEWAY_HTTP_ADDR":         "public HTTP API (and `/healthz`)",
	"KURZ_LIMITER_BREAKER_COOLDOWN":  "how long an open breaker skips Redis before probing",
	"KURZ_LIMITER_BREAKER_THRESHOLD": "consecutive failures that open a node's breaker",
	"KURZ_LIMITER_GRPC_ADDR":         "limiter gRPC listen address, and where callers dial it",
	"KURZ_LIMITER_HTTP_ADDR":         "ops HTTP (`/healthz`, `/readyz`, `/metrics`)",
	"KURZ_LIMITER_REPLICAS":          "limiter replicas: `local` fallback holds limit/replicas per key",
	"KURZ_LIMITER_RULES_REFRESH":     "periodic reload (PostgreSQL NOTIFY reloads at once)",
	"KURZ_LOG_FORMAT":                "`json` or `text` (slog)",
	"KURZ_LOG_LEVEL":                 "`debug`, `info`, `warn`, `error`",
	"KURZ_POSTGRES_MAX_CONNS":        "pool size",
	"KURZ_POSTGRES_URL":              "PostgreSQL connection string",
	"KURZ_REDIRECT_GRPC_ADDR":        "gRPC health",
	"KURZ_REDIS_DIAL_TIMEOUT":        "connect timeout",
	"KURZ_REDIS_PASSWORD":            "Redis password",
	"KURZ_REDIS_POOL_SIZE":           "connections per cluster node",
	"KURZ_REDIS_READ_TIMEOUT":        "socket timeout (the limiter bounds each decision tighter)",
	"KURZ_REDIS_WRITE_TIMEOUT":       "socket timeout (the limiter bounds each decision tighter)",
	"KURZ_SHORTENER_GRPC_ADDR":       "shortener gRPC listen / dial address",
	"KURZ_SHORTENER_HTTP_ADDR":       "ops HTTP",
	"KURZ_SHUTDOWN_TIMEOUT":          "drain bound on SIGTERM; keep below the pod's grace period",
	"KURZ_VERSION":                   "reported in telemetry resources",
}
