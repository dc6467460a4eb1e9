# Seine's build, test and sandbox entry points. Run as root on Debian 12.
# `make test` and `make sandbox` install what they need (`make deps`).

SHELL        := /bin/bash
GO           ?= go
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
BIN          := $(CURDIR)/bin
K8S_VERSION  := v1.36.3
K8S_BIN      ?= $(HOME)/.cache/seine/k8s-$(K8S_VERSION)/bin
export SEINE_K8S_BIN := $(K8S_BIN)
# The real Nodes' kubelet, kubectl, container runtime and test images
# (`bin/sandbox up --kubelet`), built once like the control plane.
CONTAINERD_VERSION := v2.4.2
RUNC_VERSION := v1.5.2
NODE_BIN     ?= $(HOME)/.cache/seine/node-$(K8S_VERSION)-containerd-$(CONTAINERD_VERSION)
export SEINE_NODE_BIN := $(NODE_BIN)
# The upstream e2e suite (e2e.test) and its ginkgo runner, for `make conformance`.
E2E_BIN      ?= $(HOME)/.cache/seine/e2e-$(K8S_VERSION)
export SEINE_E2E_BIN := $(E2E_BIN)
# Seine's image: one definition, in package deploy.
IMAGE        ?= $(shell $(GO) run ./deploy/render --print-image)
IMAGE_ARCHIVE := $(BIN)/seine-image.tar
LDFLAGS      := -s -w -X github.com/seine-net/seine/node/version.version=$(VERSION)
# Leave out code seine never runs: urfave/cli's man-page and markdown
# generators.
BUILDTAGS    := urfave_cli_no_docs
K8S_LDFLAGS  := -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
                -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 \
                -X k8s.io/component-base/version.gitTreeState=clean
APT_PACKAGES := openvswitch-switch containernetworking-plugins iperf3 nftables iproute2 \
                tcpdump conntrack ethtool kubectl iputils-ping \
                libseccomp-dev busybox netcat-openbsd bind9-dnsutils curl kmod nginx-light
TEST_TIMEOUT ?= 25m

.PHONY: all deps build control-plane node-tools e2e-tools image manifests generate test unit-test e2e-test lint bench \
        sandbox sandbox-kubelet sandbox-down conformance clean

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
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(BUILDTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/seine .
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

## node-tools: the real Nodes' parts, built from their Go modules (tests/tools,
## tests/tools/containerd) and Debian packages into $(NODE_BIN), once: kubelet
## and kubectl $(K8S_VERSION), containerd $(CONTAINERD_VERSION) with runc
## $(RUNC_VERSION), and the images Pods and the e2e suite run (pause 3.10.2 from
## the kubelet's pause.c, agnhost 2.63.0, CoreDNS 1.15.0 for cluster DNS, and the e2e suite's
## busybox, glibc-dns-testing and nginx from Debian's packages), as archives `ctr images import` reads.
node-tools: $(NODE_BIN)/.built-v2

K8S_SRC = $(shell cd tests/tools && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)
# busybox (Debian's) at /bin/busybox with a link per applet but those named in
# $(1): a shell and the usual tools. Its shell runs its own applets before PATH, so images
# that carry real tools (nc, nslookup) get dash as /bin/sh instead.
# Expanded when a recipe runs, after `deps` installed busybox: on a fresh machine it is
# not there yet when make reads this file (images built then had no applet but busybox).
BUSYBOX_APPLETS = $(shell /bin/busybox --list 2>/dev/null)
busybox = --file /bin/busybox:/bin/busybox $(foreach a,$(filter-out busybox $(1),$(BUSYBOX_APPLETS)),--link busybox:/bin/$(a))
check-busybox = @test -n "$(BUSYBOX_APPLETS)" || { echo "/bin/busybox --list names no applets: is busybox installed?"; exit 1; }
# What the e2e suite's test images run in their shells.
# (busybox is linked statically with glibc, whose name service then crashes without glibc's
# own libraries: its wget and others that resolve names give way to Debian's.)
E2E_SHELL = $(call busybox,sh ash nc nslookup wget) --file /bin/dash:/bin/sh --file /bin/bash:/bin/bash \
  --file /usr/bin/wget:/usr/bin/wget \
  --file /usr/bin/dig:/usr/bin/dig --file /usr/bin/nslookup:/usr/bin/nslookup --file /usr/bin/host:/usr/bin/host \
  --file /usr/bin/getent:/usr/bin/getent

# The stamp's -v2: node tools built before busybox's applets were read at recipe time
# may hold images without them; a new stamp rebuilds those once.
$(NODE_BIN)/.built-v2: tests/tools/go.mod tests/tools/go.sum tests/tools/tools.go tests/tools/containerd/go.mod \
		tests/tools/containerd/go.sum tests/tools/coredns/go.mod tests/tools/coredns/main.go tests/tools/images/nginx.conf \
		deploy/image/main.go | deps
	$(check-busybox)
	@mkdir -p $(NODE_BIN)/images
	cd tests/tools && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(NODE_BIN)/ \
	  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/test/images/agnhost
	cd tests/tools/containerd && CGO_ENABLED=0 $(GO) build -trimpath -tags 'no_btrfs no_zfs' \
	  -ldflags '-X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)' -o $(NODE_BIN)/ \
	  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	  github.com/containerd/containerd/v2/cmd/ctr
	cd tests/tools/containerd && CGO_ENABLED=1 $(GO) build -trimpath -tags 'seccomp urfave_cli_no_docs' \
	  -ldflags '-X main.version=$(RUNC_VERSION:v%=%)' -o $(NODE_BIN)/runc github.com/opencontainers/runc
	cd tests/tools/coredns && CGO_ENABLED=0 $(GO) build -trimpath -o $(NODE_BIN)/coredns .
	gcc -Os -static -o $(NODE_BIN)/pause $(K8S_SRC)/build/pause/linux/pause.c
	cd deploy/image && $(GO) run . --tag registry.k8s.io/pause:3.10.2 --out $(NODE_BIN)/images/pause.tar \
	  --file $(NODE_BIN)/pause:/pause --entrypoint /pause
	@echo "building registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	@cd deploy/image && $(GO) run . --tag registry.k8s.io/e2e-test-images/agnhost:2.63.0 --out $(NODE_BIN)/images/agnhost.tar \
	  --file $(NODE_BIN)/agnhost:/agnhost --link agnhost:/agnhost-2 --mkdir /uploads $(E2E_SHELL) \
	  --file $(K8S_SRC)/test/images/agnhost/porter/localhost.crt:/localhost.crt \
	  --file $(K8S_SRC)/test/images/agnhost/porter/localhost.key:/localhost.key \
	  --file /usr/bin/curl:/usr/bin/curl --file /bin/nc.openbsd:/usr/bin/nc \
	  --file /usr/bin/ss:/usr/bin/ss --entrypoint /agnhost --cmd pause
	@echo "building the e2e suite's busybox, glibc-dns-testing and nginx images"
	@cd deploy/image && $(GO) run . --tag registry.k8s.io/e2e-test-images/busybox:1.37.0-1 --out $(NODE_BIN)/images/busybox.tar \
	  $(call busybox,) --cmd sh
	@cd deploy/image && $(GO) run . --tag registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0 \
	  --out $(NODE_BIN)/images/glibc-dns-testing.tar $(E2E_SHELL) \
	  --file $(NODE_BIN)/coredns:/coredns --cmd sh
	@cd deploy/image && $(GO) run . --tag registry.k8s.io/e2e-test-images/nginx:1.15-4 --out $(NODE_BIN)/images/nginx.tar \
	  --file /usr/sbin/nginx:/usr/sbin/nginx --file $(CURDIR)/tests/tools/images/nginx.conf:/etc/nginx/nginx.conf \
	  --mkdir /var/log/nginx --mkdir /var/lib/nginx --entrypoint /usr/sbin/nginx
	cd deploy/image && $(GO) run . --tag registry.k8s.io/coredns/coredns:v1.15.0 --out $(NODE_BIN)/images/coredns.tar \
	  --file $(NODE_BIN)/coredns:/coredns --entrypoint /coredns
	touch $@

## e2e-tools: e2e.test and ginkgo from the Kubernetes $(K8S_VERSION) module (tests/tools/e2e), once.
e2e-tools: $(E2E_BIN)/.built

$(E2E_BIN)/.built: tests/tools/e2e/go.mod tests/tools/e2e/go.sum tests/tools/e2e/tools.go
	@mkdir -p $(E2E_BIN)
	cd tests/tools/e2e && CGO_ENABLED=0 $(GO) test -c -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(E2E_BIN)/e2e.test k8s.io/kubernetes/test/e2e
	cd tests/tools/e2e && CGO_ENABLED=0 $(GO) build -trimpath -o $(E2E_BIN)/ github.com/onsi/ginkgo/v2/ginkgo
	touch $@

## conformance: upstream sig-network conformance, NetworkPolicy and Services e2e tests on real
## kubelets with Seine installed by its manifest (docs/conformance.md); about 15 minutes.
conformance: deps control-plane node-tools e2e-tools build image
	$(GO) test -tags conformance -count=1 -timeout 4h -v ./tests/conformance/

## image: Seine's image as an OCI archive, $(IMAGE_ARCHIVE), for `ctr images import`
## or `podman load`: the static seine binary (seine, seine-cni, seinectl), Open
## vSwitch's daemons and tools, nft and modprobe from this machine's Debian
## packages (with their shared libraries), the CNI plugins seine relies on, busybox.
OVS_TOOLS := /usr/sbin/ovsdb-server /usr/sbin/ovs-vswitchd /usr/bin/ovs-vsctl /usr/bin/ovs-ofctl /usr/bin/ovs-appctl \
             /usr/bin/ovs-dpctl /usr/bin/ovsdb-tool /usr/bin/ovsdb-client
image: build deps
	$(check-busybox)
	@echo "building $(IMAGE) into $(IMAGE_ARCHIVE)"
	@cd deploy/image && $(GO) run . --tag $(IMAGE) --out $(IMAGE_ARCHIVE) \
	  --file $(BIN)/seine:/usr/local/bin/seine --link seine:/usr/local/bin/seine-cni --link seine:/usr/local/bin/seinectl \
	  $(foreach f,$(OVS_TOOLS),--file $(f):$(f)) \
	  --file /usr/share/openvswitch/vswitch.ovsschema:/usr/share/openvswitch/vswitch.ovsschema \
	  --file /usr/sbin/nft:/usr/sbin/nft --file /bin/kmod:/usr/sbin/modprobe \
	  $(foreach p,portmap bandwidth loopback,--file /usr/lib/cni/$(p):/opt/cni/bin/$(p)) \
	  $(call busybox,) --mkdir /var/run/openvswitch --mkdir /var/lib/seine --entrypoint /usr/local/bin/seine

## manifests: render deploy/seine.yaml from deploy/seine.yaml.tmpl (a test fails when it is stale).
manifests:
	$(GO) run ./deploy/render -o deploy/seine.yaml

## generate: regenerate OVSDB models, CRD types (deepcopy, manifests, clientset, listers, informers).
generate:
	$(GO) generate ./...

## lint: gofmt, go vet, and `go mod tidy` leaving no diff (every module).
lint: deps
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	@for m in $$(git ls-files '*go.mod' | xargs -n1 dirname); do \
	  (cd $$m && $(GO) mod tidy -diff) || { echo "go mod tidy changes $$m/go.mod"; exit 1; }; done

## unit-test: the package tests (real OVS daemons and a real kube-apiserver where they need them).
unit-test: deps control-plane build
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v /tests/e2e)

## e2e-test: the end-to-end suites on sandboxes: Seine's daemons on the sandbox's kubelets
## (tests/e2e), once per traffic mode (tests/e2e/modes.sh; SEINE_E2E_MODES=all: every table
## in every mode), and Seine installed by its manifest on real kubelets (tests/e2e/realnodes).
e2e-test: deps control-plane node-tools build image
	GO=$(GO) TEST_TIMEOUT=$(TEST_TIMEOUT) tests/e2e/modes.sh
	$(GO) test -count=1 -p 1 -timeout $(TEST_TIMEOUT) -v ./tests/e2e/realnodes/...

## test: everything, with real OVS, namespaces, a real control plane and real kubelets.
test: lint unit-test e2e-test

## bench: benchmarks (docs/benchmarks.md records the figures), the real-Node ones
## (tests/e2e/realnodes) on their package's two kubelets.
bench: deps control-plane node-tools build image
	@tests/bench/antrea/build.sh >/dev/null || echo "Antrea's controller test binary not built: BenchmarkSideBySide reports Seine alone"
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -timeout 4h ./tests/bench/... ./datapath/... ./ipam/... ./policy/... ./node/proxy/... ./node/podnet/...
	SEINE_REALNODES_NAME=rnb $(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -timeout 30m ./tests/e2e/realnodes/...

## sandbox: a 3-Node cluster with demo Pods, left running.
sandbox: deps control-plane build
	$(BIN)/sandbox down --name sbx >/dev/null 2>&1 || true
	$(BIN)/sandbox up --name sbx --nodes 3 --host-link
	$(BIN)/sandbox demo --name sbx

## sandbox-kubelet: the same cluster with real Nodes (kubelet, containerd) and Seine installed
## only by `kubectl apply -f` of its manifest, left running (replaces `make sandbox`'s).
sandbox-kubelet: deps control-plane node-tools build image
	ln -sf $(NODE_BIN)/kubectl $(BIN)/kubectl
	$(BIN)/sandbox down --name sbx >/dev/null 2>&1 || true
	$(BIN)/sandbox up --name sbx --nodes 3 --host-link --kubelet

## sandbox-down: remove the sandbox completely.
sandbox-down:
	@if [ -x $(BIN)/sandbox ]; then $(BIN)/sandbox down --name sbx; else echo "bin/sandbox not built"; fi

clean:
	rm -rf $(BIN)
