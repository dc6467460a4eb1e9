//go:build tools

// Package tools pins the container runtime of the sandbox's real Nodes
// (`bin/sandbox up --kubelet`): containerd v2.4.2 (Kubernetes v1.36 needs
// containerd 2.2 or newer; Debian 12 has 1.6.20) and runc v1.5.2, the runc
// that containerd v2.4.2 tests with (its script/setup/runc-version). They
// live in a module of their own: containerd requires k8s.io/* v0.37, which
// clashes with the v1.36.3 pins of ../go.mod. `make node-tools` builds them
// into a cache directory outside the repository.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
)
