# kurz — `make up` runs the system on loopback; `make unit` runs the tests
# that need nothing running, `make test` every test (it starts the stack).
# `make help` lists the rest.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
# Builds that do not depend on where the clone is: the Go build cache then
# serves a fresh clone (CI's) everything it already compiled elsewhere, and
# stack traces name kurz.dev/... paths.
export GOFLAGS += -trimpath

# Pinned tool versions, installed into ./bin with `go install`.
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPC_GATEWAY_VERSION       := v2.34.0
GRPCURL_VERSION            := v1.9.4
# deploy/k8s validates the rendered overlays with kubeconform against the
# JSON schemas deploy/k8s/schemagen makes from the OpenAPI document of this
# Kubernetes release (in the k8s.io/kubernetes module). Its minor version
# must be k8s.io/api's in go.mod: the tests check.
KUBECONFORM_VERSION        := v0.8.0
K8S_SCHEMA_VERSION         := v1.37.2
# The peers make bench measures kurz against (deploy/bench/peers.sh).
ENVOY_RATELIMIT_VERSION    := v1.4.1-0.20260122083618-3fb702589d36
# make release's SBOMs and make images' builder (tools/release, .ko.yaml).
CYCLONEDX_GOMOD_VERSION    := v1.10.0
KO_VERSION                 := v0.19.1
GUBERNATOR_VERSION         := v2.13.0


# Tests use their own databases so they never touch the data of `make up`.
TEST_ENV := KURZ_POSTGRES_URL=$${KURZ_TEST_POSTGRES_URL:-postgres://kurz:kurz@127.0.0.1:5433/kurz_test?sslmode=disable} \
            KURZ_CLICKHOUSE_DATABASE=$${KURZ_TEST_CLICKHOUSE_DATABASE:-kurz_test}

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# --- tools -------------------------------------------------------------------

$(BIN)/.buf-$(BUF_VERSION):
	GOBIN=$(BIN) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@touch $@
$(BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	GOBIN=$(BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@touch $@
$(BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	GOBIN=$(BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@touch $@
$(BIN)/.protoc-gen-openapiv2-$(GRPC_GATEWAY_VERSION):
	GOBIN=$(BIN) go install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)
	@touch $@
$(BIN)/.protoc-gen-grpc-gateway-$(GRPC_GATEWAY_VERSION):
	GOBIN=$(BIN) go install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION)
	@touch $@
$(BIN)/.grpcurl-$(GRPCURL_VERSION):
	GOBIN=$(BIN) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	@touch $@
$(BIN)/.kubeconform-$(KUBECONFORM_VERSION):
	GOBIN=$(BIN) go install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)
	@touch $@
$(BIN)/k8s-schemas/$(K8S_SCHEMA_VERSION)-standalone-strict/.done: deploy/k8s/schemagen/main.go
	go run ./deploy/k8s/schemagen -version $(K8S_SCHEMA_VERSION) -out $(BIN)/k8s-schemas
	@touch $@

$(BIN)/.cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION):
	GOBIN=$(BIN) go install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)
	@touch $@
$(BIN)/.ko-$(KO_VERSION):
	GOBIN=$(BIN) go install github.com/google/ko@$(KO_VERSION)
	@touch $@

$(BIN)/.service_cmd-$(ENVOY_RATELIMIT_VERSION):
	GOBIN=$(BIN) go install github.com/envoyproxy/ratelimit/src/service_cmd@$(ENVOY_RATELIMIT_VERSION)
	@touch $@
$(BIN)/.gubernator-$(GUBERNATOR_VERSION):
	GOBIN=$(BIN) go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@$(GUBERNATOR_VERSION)
	@touch $@
# debian_tool installs a tool the tests need from Debian's package $(2)
# when $(3), a command that prints where the tool is, finds nothing: as
# root only, logged to .local/apt-$(1).log, with apt's lock timeout, again
# after an apt-get update if the first try fails. The package's system
# service $(4) is not wanted (nothing should listen that the tests did not
# start): where systemd runs it is stopped and disabled right after the
# install, elsewhere stopped by its init script.
define debian_tool
	@{ $(3); } >/dev/null 2>&1 && exit 0; \
	if [[ $$(id -u) -ne 0 ]]; then \
		echo "$(1) is missing: sudo apt-get install -y --no-install-recommends $(2)" >&2; exit 1; \
	fi; \
	echo "installing $(1) (Debian package $(2), log: .local/apt-$(1).log)"; \
	mkdir -p .local; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends $(2) >.local/apt-$(1).log 2>&1 || \
	{ apt-get -o DPkg::Lock::Timeout=600 update >>.local/apt-$(1).log 2>&1 && \
	  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends $(2) >>.local/apt-$(1).log 2>&1; } || \
	{ cat .local/apt-$(1).log >&2; echo "$(1) could not be installed (Debian package $(2); log above)" >&2; exit 1; }; \
	if [[ -d /run/systemd/system ]]; then systemctl disable --now $(4) >>.local/apt-$(1).log 2>&1 || true; \
	elif [[ -x /etc/init.d/$(4) ]]; then /etc/init.d/$(4) stop >>.local/apt-$(1).log 2>&1 || true; fi; \
	$(3)
endef

# promtool checks and unit-tests the alert rules (deploy/k8s/alerts_test.go).
# It comes in Debian's package prometheus, whose Prometheus server is not
# wanted here (9090 is no port of ours).
.PHONY: promtool
promtool:
	$(call debian_tool,promtool,prometheus,command -v promtool,prometheus)

# nginx runs the limiter README's forward-auth recipe in an end-to-end test
# (services/limiter/internal/app, TestForwardAuthNginxRecipe), which starts
# it on a port of its own, as the current user, with its files in a
# temporary directory. It comes in Debian's package nginx-light, whose
# system service is not wanted (on port 80). /usr/sbin is on no user's PATH.
.PHONY: nginx
nginx: ## Install nginx (Debian's nginx-light) for the forward-auth recipe's end-to-end test.
	$(call debian_tool,nginx,nginx-light,command -v nginx || ls /usr/sbin/nginx,nginx)

# The Node prototype's packages, as its package-lock.json pins them.
NODE_PROTOTYPE := deploy/bench/node-prototype
$(NODE_PROTOTYPE)/node_modules/.installed: $(NODE_PROTOTYPE)/package-lock.json
	cd $(NODE_PROTOTYPE) && npm ci --no-audit --no-fund
	@touch $@

# The published Shlink and Bitly clients (Shlink's JS SDK, the bitly Node
# SDK), as their package-lock.json pins them: the gateway's compatibility
# tests (services/gateway/internal/app, TestShlinkSDK and TestBitlySDK)
# drive them with node, and fail, saying to run this, without them.
TEST_CLIENTS := services/gateway/internal/app/testdata/clients
$(TEST_CLIENTS)/node_modules/.installed: $(TEST_CLIENTS)/package-lock.json
	cd $(TEST_CLIENTS) && npm ci --no-audit --no-fund
	@touch $@

.PHONY: clients
clients: $(TEST_CLIENTS)/node_modules/.installed ## Install the pinned Shlink and Bitly SDKs the gateway's compatibility tests drive (npm ci).

TOOLS := $(BIN)/.buf-$(BUF_VERSION) $(BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION) \
       $(BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION) $(BIN)/.grpcurl-$(GRPCURL_VERSION) \
       $(BIN)/.protoc-gen-openapiv2-$(GRPC_GATEWAY_VERSION) $(BIN)/.protoc-gen-grpc-gateway-$(GRPC_GATEWAY_VERSION) \
       $(BIN)/.kubeconform-$(KUBECONFORM_VERSION) $(BIN)/k8s-schemas/$(K8S_SCHEMA_VERSION)-standalone-strict/.done \
       promtool

.PHONY: tools
tools: $(TOOLS) ## Install the pinned tools into ./bin, and promtool (Debian's prometheus).

# --- code generation and static checks --------------------------------------

.PHONY: gen
gen: tools ## Regenerate gen/ (Go code, grpc-gateway handlers, the OpenAPI spec) from proto/ with buf, and the gateway's served openapi.json.
	rm -rf gen/kurz gen/pb gen/openapi
	buf generate
	go run ./tools/openapigen -swagger gen/openapi/kurz.swagger.json -overlay $(OPENAPI_OVERLAY) -out $(OPENAPI_SERVED)

# The gateway's served OpenAPI document: the generated spec of the mapped
# RPCs plus the hand-written overlay (tools/openapigen, docs/api.md).
OPENAPI_OVERLAY := services/gateway/internal/httpapi/openapi.overlay.yaml
OPENAPI_SERVED  := services/gateway/internal/httpapi/openapi.json

.PHONY: check-gen
check-gen: tools ## Fail if gen/ or the served openapi.json differs from what proto/ and the overlay generate.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	buf generate --output "$$tmp"; \
	go run ./tools/openapigen -swagger "$$tmp/gen/openapi/kurz.swagger.json" -overlay $(OPENAPI_OVERLAY) -out "$$tmp/openapi.json"; \
	if ! diff -r "$$tmp/gen/kurz" gen/kurz || ! diff -r "$$tmp/gen/pb" gen/pb || ! diff -r "$$tmp/gen/openapi" gen/openapi || ! diff "$$tmp/openapi.json" $(OPENAPI_SERVED); then \
		echo "gen/ or $(OPENAPI_SERVED) is stale: run 'make gen' and commit the result" >&2; exit 1; \
	fi; \
	echo "gen/ and $(OPENAPI_SERVED) match proto/ and the overlay"

.PHONY: docs
docs: ## Regenerate docs/configuration.md from the services' Config structs, and docs/cli from kurzctl's commands.
	go run ./tools/envdoc -w docs/configuration.md
	rm -rf docs/cli
	go run ./cmd/kurzctl docs docs/cli

.PHONY: lint
lint: tools ## buf lint, gofmt, go vet (both test tiers).
	buf lint
	@bad=$$(gofmt -l cmd tools pkg services faults deploy); if [[ -n $$bad ]]; then echo "gofmt needed: $$bad" >&2; exit 1; fi
	go vet ./...
	go vet -tags integration ./...
	go vet -tags integration,chcluster ./services/analytics/...

# --- the local stack ---------------------------------------------------------

.PHONY: up
up: ## Start Redis Cluster, PostgreSQL, ClickHouse and the five services (idempotent).
	deploy/local/infra.sh up
	deploy/local/services.sh up

.PHONY: down
down: ## Stop everything `make up` (and `make test-chcluster`) started.
	deploy/local/services.sh down
	deploy/local/infra.sh down
	deploy/local/chcluster.sh down

.PHONY: status
status: ## Show what is running.
	deploy/local/infra.sh status || true
	deploy/local/services.sh status || true

# --- tests -------------------------------------------------------------------

# Two tiers. The unit tier is every test file without a build tag: it needs
# nothing running (plain `go test ./...`). The integration tier is the files
# tagged `//go:build integration`: they need Redis Cluster, PostgreSQL and
# ClickHouse, and their packages' TestMain refuses at once, naming what is
# down, when the stack is not up (pkg/testkit/stack).

# The packages with integration tests (test files that the untagged build
# leaves out), and the rest. make test runs each package once: the
# unit-only ones before the stack is needed, the others with the tag (their
# unit tests included), so no test binary is built or run twice. The fault
# suite runs on its own (see test).
PKGS_BY_TIER = go list -f '{{.ImportPath}}{{range .IgnoredGoFiles}} {{.}}{{end}}' ./... | \
               awk '/_test\.go/ {print "integration", $$1; next} {print "unit", $$1}'
UNIT_PKGS        = $(PKGS_BY_TIER) | awk '$$1 == "unit" {print $$2}'
INTEGRATION_PKGS = $(PKGS_BY_TIER) | awk '$$1 == "integration" && $$2 != "kurz.dev/faults" {print $$2}'

.PHONY: unit
unit: tools ## The unit tier: every test that needs nothing running (no stack).
	go test -count=1 ./...

.PHONY: test
test: lint check-gen nginx clients ## Both tiers with -race (the stack started when needed, the fault suite included), a short fuzz run and the smoke test.
	@# The stack starts while the unit-only packages run: they need none of it.
	@mkdir -p .local; deploy/local/infra.sh up > .local/infra-up.log 2>&1 & infra=$$!; \
	go test -race -count=1 $$($(UNIT_PKGS)); unit=$$?; \
	wait $$infra; up=$$?; cat .local/infra-up.log; \
	if [[ $$unit -ne 0 || $$up -ne 0 ]]; then exit 1; fi
	$(TEST_ENV) go test -race -count=1 -tags integration $$($(INTEGRATION_PKGS))
	$(MAKE) --no-print-directory test-chcluster
	@# The fault suite loads both cores with its own processes: alone, after
	@# the rest, so it does not starve the timing of other packages' tests.
	$(TEST_ENV) go test -race -count=1 -timeout 20m -tags integration ./faults/
	FUZZTIME=$(CI_FUZZTIME) deploy/local/fuzz.sh
	deploy/local/services.sh up
	deploy/local/smoke.sh

# The analytics click tests again on a ClickHouse cluster, 2 shards x 2
# replicas on ZooKeeper (deploy/local/chcluster.sh, left running: make down
# stops it), with the cluster tier's failure tests (tag chcluster). Redis
# comes from the stack (make up). One package at a time: the consumer's
# failure tests stop servers the others would be reading.
CHCLUSTER_ENV := KURZ_CLICKHOUSE_CLUSTER=kurz \
                 KURZ_CLICKHOUSE_ADDRS=127.0.0.1:9111,127.0.0.1:9112,127.0.0.1:9113,127.0.0.1:9114
CHCLUSTER_PKGS := ./services/analytics/internal/clickstore/ ./services/analytics/internal/consumer/ \
                  ./services/analytics/internal/stats/

.PHONY: test-chcluster
test-chcluster: ## The click consumer, store and stats tests on a local ClickHouse cluster (2 shards x 2 replicas).
	deploy/local/chcluster.sh up
	$(TEST_ENV) $(CHCLUSTER_ENV) go test -race -count=1 -p 1 -tags integration,chcluster $(CHCLUSTER_PKGS)

# How long each fuzz target runs inside make test; make fuzz runs longer.
CI_FUZZTIME ?= 2s
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 30s each).
	FUZZTIME=$(FUZZTIME) deploy/local/fuzz.sh

.PHONY: screenshot
screenshot: ## Regenerate docs/console-stats.png (docs/api.md's) with the console's browser test.
	deploy/local/infra.sh up
	$(TEST_ENV) KURZ_UPDATE_SCREENSHOT=1 go test -count=1 -tags integration -run '^TestConsoleInBrowser$$' ./services/gateway/internal/console/

.PHONY: reliability
reliability: ## Run the fault suite against the stack and write its table into RELIABILITY.md.
	deploy/local/infra.sh up
	deploy/local/reliability.sh

.PHONY: soak
soak: ## The soak test alone, for SOAK_DURATION (default 5m).
	deploy/local/infra.sh up
	$(TEST_ENV) KURZ_SOAK_DURATION=$(SOAK_DURATION) go test -race -count=1 -tags integration -v -run '^TestSoak$$' -timeout 30m ./faults/

SOAK_DURATION ?= 5m

.PHONY: kurzctl
kurzctl: ## Build the kurzctl CLI into ./bin (see docs/cli.md).
	go build -ldflags "-X kurz.dev/pkg/buildinfo.Version=$(VERSION) -X kurz.dev/pkg/buildinfo.Commit=$$(git rev-parse HEAD)" \
		-o $(BIN)/kurzctl ./cmd/kurzctl

# --- release -----------------------------------------------------------------

# The release's version: the tag of HEAD, else the nearest tag with the
# commits since and the commit, e.g. v0.3.0-4-gabcdef0 (-dirty with
# uncommitted changes).
VERSION ?= $(shell git describe --tags --always --dirty)

.PHONY: release
release: $(BIN)/.cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION) ## Build kurzctl and the services for linux/darwin × amd64/arm64 into dist/, with checksums.txt and SBOMs (VERSION=v0.3.0).
	go run ./tools/release -version $(VERSION) -out dist -sbom $(BIN)/cyclonedx-gomod

.PHONY: release-check
release-check: release ## make release, then check its checksums and that the binaries know their version.
	cd dist && sha256sum -c --quiet checksums.txt
	v=$$(dist/kurzctl_$(VERSION)_linux_amd64 version -o json); echo "$$v"; \
	[[ $$v == *'"version":"$(VERSION)"'* ]] || { echo "kurzctl does not know its version" >&2; exit 1; }

# Container images without a Docker daemon: ko builds each service onto
# .ko.yaml's base image and writes one OCI tarball (docker load, podman
# load, crane push). KO_DOCKER_REPO names the images: by default as the dev
# overlay runs them, a name Docker Hub cannot serve (deploy/k8s/README.md).
KO_DOCKER_REPO ?= localhost:5001/kurz
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: images
images: $(BIN)/.ko-$(KO_VERSION) ## Build the five services' images with ko (no Docker) into dist/images.tar.
	@mkdir -p dist
	KO_DOCKER_REPO=$(KO_DOCKER_REPO) VERSION=$(VERSION) ko build --push=false --tarball=dist/images.tar --base-import-paths --tags=$(VERSION) \
		--platform=$(IMAGE_PLATFORMS) ./services/limiter ./services/shortener ./services/redirect ./services/analytics ./services/gateway

.PHONY: demo
demo: ## Reproduce the design notes' figures against the running stack (make up first).
	go run ./services/limiter/cmd/kurz-demo -check

# --- benchmarks --------------------------------------------------------------

BENCH_DURATION ?= 10s

PEERS := $(BIN)/.service_cmd-$(ENVOY_RATELIMIT_VERSION) $(BIN)/.gubernator-$(GUBERNATOR_VERSION) \
         $(NODE_PROTOTYPE)/node_modules/.installed

.PHONY: peers
peers: $(PEERS) ## Install the pinned peers of make bench: envoyproxy/ratelimit and gubernator into ./bin, the Node prototype's packages.

.PHONY: bench
bench: peers ## Measure the hot paths against baselines from the same run, and kurz vs peers; writes BENCHMARKS.md.
	deploy/local/infra.sh up
	deploy/local/services.sh up
	BENCH_DURATION=$(BENCH_DURATION) deploy/bench/bench.sh

# make bench-peers: short runs, one round, for iterating on the comparison.
# The peers listen on 127.0.0.1:9301-9309 (deploy/bench/peers.sh), ports the
# stack does not use.
BENCH_PEERS_DURATION ?= 3s
BENCH_PEERS_ROUNDS ?= 1

.PHONY: bench-peers
bench-peers: peers ## Only the kurz vs peers section of make bench, on the running stack (make up first): BENCH_PEERS_DURATION (3s) per run, markdown to stdout.
	@BENCH_DURATION=$(BENCH_PEERS_DURATION) BENCH_PEERS_ROUNDS=$(BENCH_PEERS_ROUNDS) deploy/bench/peers.sh
