# git.liken.sh — every target installs what it needs, idempotently, so a fresh
# clone on a fresh machine needs only `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := build

PNPM_VERSION := 10.34.9
CSI_TEST_VERSION := v5.4.0
HELM_VERSION := v3.21.4
# Debian packages: FUSE (libfuse2 for fuse-native, fuse3 for fusermount3),
# bindfs for the benchmark baseline, protoc with the well-known protos, and
# real servers for the tests.
APT_PACKAGES := libfuse2 fuse3 bindfs protobuf-compiler libprotobuf-dev git openssh-server openssh-client lighttpd util-linux procps python3

CACHE := $(CURDIR)/.cache
GOBIN := $(CACHE)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: deps apt pnpm node-deps go-tools build test unit e2e sanity chart demo bench clean

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing: $$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

pnpm:
	@command -v pnpm >/dev/null && [ "$$(pnpm --version)" = "$(PNPM_VERSION)" ] || npm install -g --silent pnpm@$(PNPM_VERSION)

node-deps: pnpm
	@pnpm install --frozen-lockfile --silent

$(GOBIN)/csi-sanity:
	GOBIN=$(GOBIN) go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_TEST_VERSION)

go-tools: $(GOBIN)/csi-sanity

deps: apt node-deps go-tools

build: apt node-deps
	pnpm run build

unit: build
	pnpm run test:unit

e2e: build
	pnpm run test:e2e

sanity: build go-tools
	node e2e/dist/src/sanity.js

# helm lint and template, values.schema.json, and the dashboard's metric names.
chart:
	bash charts/test.sh

test: deps build
	pnpm run test:unit
	pnpm run test:e2e
	node e2e/dist/src/sanity.js
	bash charts/test.sh

demo: build
	node e2e/dist/src/demo.js

bench: build
	node e2e/dist/src/bench.js

clean:
	rm -rf packages/*/dist e2e/dist packages/protos/src/gen packages/*/tsconfig.tsbuildinfo e2e/tsconfig.tsbuildinfo
