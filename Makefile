# Seine's build, test and sandbox entry points. Run as root on Debian 12.
# `make test` and `make sandbox` install what they need (`make deps`).

SHELL        := /bin/bash
GO           ?= go
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
BIN          := $(CURDIR)/bin
K8S_VERSION  := v1.36.3
K8S_BIN      ?= $(HOME)/.cache/seine/k8s-$(K8S_VERSION)/bin
export SEINE_K8S_BIN := $(K8S_BIN)
LDFLAGS      := -s -w -X github.com/seine-net/seine/node/version.version=$(VERSION)
K8S_LDFLAGS  := -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
                -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 \
                -X k8s.io/component-base/version.gitTreeState=clean
APT_PACKAGES := openvswitch-switch containernetworking-plugins iperf3 nftables iproute2 \
                tcpdump conntrack ethtool kubectl protobuf-compiler iputils-ping
TEST_TIMEOUT ?= 25m

.PHONY: all deps build control-plane generate test unit-test e2e-test bench sandbox sandbox-down clean lint

all: build

## deps: install the Debian packages the tests and the sandbox use (idempotent).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

## build: bin/seine (static) with bin/seine-cni and bin/seinectl as symlinks, and bin/sandbox.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/seine .
	ln -sf seine $(BIN)/seine-cni
	ln -sf seine $(BIN)/seinectl
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/sandbox ./tests/cmd/sandbox

## control-plane: build etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
## kube-proxy (the benchmarks' baseline) from their Go modules (tests/tools) into $(K8S_BIN), once.
control-plane: $(K8S_BIN)/.built-$(K8S_VERSION)

$(K8S_BIN)/.built-$(K8S_VERSION): tests/tools/go.mod tests/tools/go.sum tests/tools/tools.go
	@mkdir -p $(K8S_BIN)
	cd tests/tools && CGO_ENABLED=0 $(GO) build -trimpath -o $(K8S_BIN)/etcd go.etcd.io/etcd/server/v3
	cd tests/tools && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(K8S_BIN)/ \
	  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
	  k8s.io/kubernetes/cmd/kube-proxy
	touch $@

## generate: regenerate OVSDB models, gRPC stubs, CRD types (deepcopy, manifests, clientset, listers, informers).
generate:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./...

## test: everything, with real OVS, namespaces and a real control plane.
test: deps control-plane build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v /tests/e2e)
	$(GO) test -count=1 -p 1 -timeout $(TEST_TIMEOUT) -v ./tests/e2e/...

## bench: benchmarks (docs/benchmarks.md records the figures).
bench: deps control-plane build
	@tests/bench/antrea/build.sh >/dev/null || echo "Antrea's controller test binary not built: BenchmarkSideBySide reports Seine alone"
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -timeout 90m ./tests/bench/... ./datapath/... ./ipam/... ./policy/... ./node/proxy/... ./node/podnet/...

## sandbox: a 3-Node cluster with demo Pods, left running.
sandbox: deps control-plane build
	$(BIN)/sandbox down --name sbx >/dev/null 2>&1 || true
	$(BIN)/sandbox up --name sbx --nodes 3 --host-link
	$(BIN)/sandbox demo --name sbx

## sandbox-down: remove the sandbox completely.
sandbox-down:
	@if [ -x $(BIN)/sandbox ]; then $(BIN)/sandbox down --name sbx; else echo "bin/sandbox not built"; fi

clean:
	rm -rf $(BIN)
