# git.liken.sh — every target installs what it needs, idempotently, so a fresh
# clone on a fresh machine needs only `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := build

PNPM_VERSION := 10.34.9
CSI_TEST_VERSION := v5.4.0
HELM_VERSION := v3.21.4
# Debian packages: FUSE (libfuse3-dev and a C compiler for the mount owner's
# addon, fuse3 for fusermount3), bindfs for the benchmark baseline, protoc with
# the well-known protos, and real servers for the tests; for the cluster tests,
# containerd, runc and the CNI plugins the kubelets run pods with, iproute2 for
# the test's network namespace, a static libc for the pause binary; for the
# images, buildah (the builder), skopeo (pushes), debootstrap and busybox-static
# (the public base images made here, e2e/images/bases.sh), docker-registry (the
# tests' registry) and apache2-utils (htpasswd, for a registry with a login);
# faketime (libfaketime) for the nodes whose clocks run ahead or behind;
# iptables, for the cluster test's forge that refuses connections.
APT_PACKAGES := libfuse3-dev fuse3 gcc make pkg-config bindfs protobuf-compiler libprotobuf-dev git openssh-server openssh-client lighttpd util-linux procps python3 prometheus openssl \
	containerd runc containernetworking-plugins iproute2 libc6-dev \
	buildah skopeo debootstrap docker-registry busybox-static apache2-utils faketime iptables

CACHE := $(CURDIR)/.cache
GOBIN := $(CACHE)/bin
export PATH := $(GOBIN):$(PATH)

# A real kube-apiserver, kubectl and etcd for the tests against an API server
# (e2e/src/kube.ts), built with Go from the module proxy at the versions that
# e2e/k8s/kube/go.mod and e2e/k8s/etcd/go.mod pin, into a directory named for
# the Kubernetes version. Each is built only when absent (or when its module's
# go.mod or go.sum changed), and each build prints how long it took.
KUBE_VERSION := $(shell awk '$$1 == "require" && $$2 == "k8s.io/kubernetes" { print $$3 } $$1 == "k8s.io/kubernetes" { print $$2 }' e2e/k8s/kube/go.mod)
ETCD_VERSION := $(shell awk '$$1 == "require" && $$2 == "go.etcd.io/etcd/server/v3" { print $$3 } $$1 == "go.etcd.io/etcd/server/v3" { print $$2 }' e2e/k8s/etcd/go.mod)
KUBE_BIN := $(CACHE)/k8s/$(KUBE_VERSION)
KUBE_TOOLS := $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kubectl $(KUBE_BIN)/etcd
# What `make` builds from source would otherwise report v0.0.0; kubectl warns on
# version skew, so both binaries say the version they are.
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_LDFLAGS := -s -w $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(pkg).gitVersion=$(KUBE_VERSION) -X $(pkg).gitMajor=1 -X $(pkg).gitMinor=$(KUBE_MINOR) -X $(pkg).gitTreeState=clean)
# Cold (empty Go caches, 2 busy cores) the three take about 6.5 minutes, so
# `make test` builds them rather than skip the tests; see the README's "Tests
# against a real API server".

# The cluster of the cluster tests (e2e/src/cluster.ts) adds the node and
# control-plane commands of the same module, the pause binary the pods'
# sandboxes run (gcc, from the same module's source), and the three CSI
# sidecars of the chart's controller, from the module proxy: csi-resizer with
# `go install`, csi-provisioner and csi-snapshotter through
# e2e/k8s/csi-provisioner (their go.mod files have replace directives, which
# `go install` refuses; one module, so the Go build cache shares client-go),
# and from the same module the snapshot-controller the cluster test runs (the
# chart leaves it to the cluster). Without cgo, so each is one static binary,
# the whole of its image. See docs/tests.md, "Tests in a real cluster", for
# the cold times.
KUBE_CLUSTER_TOOLS := $(KUBE_BIN)/kubelet $(KUBE_BIN)/kube-controller-manager $(KUBE_BIN)/kube-scheduler $(KUBE_BIN)/pause
# The chart pins the sidecars' versions (values.yaml); the wrapper module requires the same (charts/test.sh checks).
RESIZER_VERSION := $(shell awk '$$1 == "resizer:" { found = 1 } found && $$1 == "tag:" { print $$2; exit }' charts/git-csi/values.yaml)
SIDECAR_MODULE := e2e/k8s/csi-provisioner
module_version = $(shell awk '($$1 == "require" && $$2 == "$(1)") { print $$3 } $$1 == "$(1)" { print $$2 }' $(SIDECAR_MODULE)/go.mod)
PROVISIONER_VERSION := $(call module_version,github.com/kubernetes-csi/external-provisioner/v6)
SNAPSHOTTER_VERSION := $(call module_version,github.com/kubernetes-csi/external-snapshotter/v8)
SIDECARS := $(CACHE)/csi-sidecars
CSI_SIDECARS := $(SIDECARS)/csi-resizer/$(RESIZER_VERSION)/csi-resizer $(SIDECARS)/csi-provisioner/$(PROVISIONER_VERSION)/csi-provisioner \
	$(SIDECARS)/csi-snapshotter/$(SNAPSHOTTER_VERSION)/csi-snapshotter $(SIDECARS)/snapshot-controller/$(SNAPSHOTTER_VERSION)/snapshot-controller

# The driver's images: the one Dockerfile, built as is by buildah (Debian's),
# into a store under .cache/ that keeps the builder's layers between runs, and
# named $(REGISTRY)/git-csi/<service>:$(VERSION). `make publish` pushes them
# and the chart. Where no public registry can be reached (CI, the tests),
# BASES=local first makes the public base images the Dockerfile names from
# local parts (e2e/images/bases.sh), and the build never pulls.
REGISTRY ?= ghcr.io/liken-sh
VERSION ?= $(shell awk '$$1 == "appVersion:" { gsub(/"/, "", $$2); print $$2 }' charts/git-csi/Chart.yaml)
BASES ?= pull
SERVICES := csi-frontend mount-owner git-worker
IMAGE_STORE := $(CACHE)/containers
BUILDAH := buildah --root $(IMAGE_STORE)/storage --runroot $(IMAGE_STORE)/run --storage-driver overlay
export BUILDAH_ISOLATION := chroot
# The host's trust store, for the build's npm and pnpm: a machine behind a
# TLS-intercepting proxy reaches the npm registry only with its CA.
BUILD_CA ?= $(or $(NODE_EXTRA_CA_CERTS),$(wildcard /etc/ssl/certs/ca-certificates.crt))
BUILD_CA_FLAGS := $(if $(BUILD_CA),--volume $(BUILD_CA):/run/build-ca.crt:ro --build-arg NODE_EXTRA_CA_CERTS=/run/build-ca.crt)

.PHONY: deps apt pnpm node-deps go-tools kube-tools cluster-tools build lint test unit e2e sanity chart demo bench clean base-images cluster-images images publish

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing: $$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

pnpm:
	@command -v pnpm >/dev/null && [ "$$(pnpm --version)" = "$(PNPM_VERSION)" ] || npm install -g --silent pnpm@$(PNPM_VERSION)

node-deps: pnpm
	@pnpm install --frozen-lockfile --silent

$(GOBIN)/csi-sanity:
	GOBIN=$(GOBIN) go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_TEST_VERSION)

$(GOBIN)/helm:
	GOBIN=$(GOBIN) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

go-tools: $(GOBIN)/csi-sanity $(GOBIN)/helm

# $(call timed,WHAT,COMMAND): one build, and a line saying how long it took.
define timed
	@start=$$(date +%s); echo "building $(1) (cached in $(@D))"; $(2) && echo "built $(1) in $$(( $$(date +%s) - start )) s"
endef

# Every Kubernetes command the tests run comes from the one pinned module.
$(KUBE_BIN)/%: e2e/k8s/kube/go.mod e2e/k8s/kube/go.sum
	$(call timed,$* $(KUBE_VERSION),cd e2e/k8s/kube && go build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/$*)

$(KUBE_BIN)/etcd: e2e/k8s/etcd/go.mod e2e/k8s/etcd/go.sum e2e/k8s/etcd/main.go
	$(call timed,etcd $(ETCD_VERSION),cd e2e/k8s/etcd && go build -trimpath -ldflags '-s -w' -o $@ .)

# The pod sandbox's process: pause.c of the pinned Kubernetes source.
$(KUBE_BIN)/pause: e2e/k8s/kube/go.mod
	$(call timed,pause $(KUBE_VERSION),cd e2e/k8s/kube && gcc -Os -static -o $@ "$$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c")

$(SIDECARS)/csi-resizer/$(RESIZER_VERSION)/csi-resizer:
	$(call timed,csi-resizer $(RESIZER_VERSION),CGO_ENABLED=0 GOBIN=$(@D) go install -trimpath -ldflags '-s -w' github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer@$(RESIZER_VERSION))

$(SIDECARS)/csi-provisioner/$(PROVISIONER_VERSION)/csi-provisioner: $(SIDECAR_MODULE)/go.mod $(SIDECAR_MODULE)/go.sum
	$(call timed,csi-provisioner $(PROVISIONER_VERSION),cd $(SIDECAR_MODULE) && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $@ github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner)

# csi-snapshotter and snapshot-controller: two commands of external-snapshotter's module.
$(wordlist 3,4,$(CSI_SIDECARS)): $(SIDECAR_MODULE)/go.mod $(SIDECAR_MODULE)/go.sum
	$(call timed,$(@F) $(SNAPSHOTTER_VERSION),cd $(SIDECAR_MODULE) && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $@ github.com/kubernetes-csi/external-snapshotter/v8/cmd/$(@F))

kube-tools: $(KUBE_TOOLS)

base-images: apt
	BUILDAH="$(BUILDAH)" bash e2e/images/bases.sh $(CACHE)/images

# The public images the cluster tests pull besides the driver's: the pause
# image and the chart's three controller sidecars, each the binary
# `make cluster-tools` built, under the name the chart and the kubelet use.
cluster-images: apt cluster-tools
	BUILDAH="$(BUILDAH)" bash e2e/images/bases.sh $(CACHE)/images registry.k8s.io/pause:3.10=$(KUBE_BIN)/pause \
	  registry.k8s.io/sig-storage/csi-resizer:$(RESIZER_VERSION)=$(word 1,$(CSI_SIDECARS)) \
	  registry.k8s.io/sig-storage/csi-provisioner:$(PROVISIONER_VERSION)=$(word 2,$(CSI_SIDECARS)) \
	  registry.k8s.io/sig-storage/csi-snapshotter:$(SNAPSHOTTER_VERSION)=$(word 3,$(CSI_SIDECARS))

images: apt $(if $(filter local,$(BASES)),base-images)
	@mkdir -p $(CACHE)/images; for service in $(SERVICES); do \
	  start=$$(date +%s); echo "building $(REGISTRY)/git-csi/$$service:$(VERSION) with buildah (layers cached in $(IMAGE_STORE))"; \
	  $(BUILDAH) bud --layers $(BUILD_CA_FLAGS) --pull=$(if $(filter local,$(BASES)),never,false) --target $$service -t $(REGISTRY)/git-csi/$$service:$(VERSION) . > $(CACHE)/images/$$service.log 2>&1 \
	    || { tail -30 $(CACHE)/images/$$service.log; exit 1; }; \
	  echo "built $$service in $$(( $$(date +%s) - start )) s"; \
	done

# The images and the packaged chart to $(REGISTRY) (scripts/publish.sh says how).
publish: images $(GOBIN)/helm
	STORE="overlay@$(IMAGE_STORE)/storage+$(IMAGE_STORE)/run" REGISTRY="$(REGISTRY)" VERSION="$(VERSION)" \
	  SERVICES="$(SERVICES)" PLAIN_HTTP="$(PLAIN_HTTP)" HELM="$(GOBIN)/helm" bash scripts/publish.sh

# pjdfstest, the POSIX conformance suite the e2e tests run at the root of a
# staged volume's mount (e2e/test/pjdfstest.test.ts), built from the tarball
# kept beside the project; the script does nothing when it is built already.
PJDFSTEST := $(CACHE)/pjdfstest/pjdfstest
$(PJDFSTEST):
	bash ../shared/tools/pjdfstest/build.sh $(CACHE)/pjdfstest

cluster-tools: apt kube-tools $(KUBE_CLUSTER_TOOLS) $(CSI_SIDECARS)

deps: apt node-deps go-tools

build: apt node-deps
	pnpm run build

unit: build
	pnpm run test:unit

e2e: BASES = local
e2e: build go-tools kube-tools cluster-tools cluster-images images $(PJDFSTEST)
	pnpm run test:e2e

sanity: build go-tools
	node e2e/dist/src/sanity.js

# helm lint and template, values.schema.json, and the dashboard's metric names.
chart:
	bash charts/test.sh

# ESLint (typescript-eslint) and Prettier, configured once at the root: eslint.config.mjs, .prettierrc.json.
lint: node-deps
	pnpm run lint

# The images first, from the public bases made here (no registry is reached):
# the cluster test's `make publish` then finds every layer built.
test: BASES = local
test: deps build kube-tools cluster-tools cluster-images images $(PJDFSTEST) lint
	pnpm run test:unit
	pnpm run test:e2e
	node e2e/dist/src/sanity.js
	bash charts/test.sh

demo: build
	node e2e/dist/src/demo.js

# BENCH_ARGS: bench.ts's options, e.g. --no-scale for sections 1 and 2 only (bench/README.md).
bench: build
	node e2e/dist/src/bench.js $(BENCH_ARGS)

clean:
	rm -rf packages/*/dist e2e/dist packages/protos/src/gen packages/*/tsconfig.tsbuildinfo e2e/tsconfig.tsbuildinfo
