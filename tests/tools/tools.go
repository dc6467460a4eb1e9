//go:build tools

// Package tools pins the control-plane components the sandbox builds from
// their Go modules: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, and kube-proxy (the baseline tests/bench compares Seine's
// Service proxy with). It is never imported; `make control-plane` builds these
// packages into a cache directory outside the repository.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
