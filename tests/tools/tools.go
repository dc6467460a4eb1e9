//go:build tools

// Package tools pins the Kubernetes components the sandbox builds from
// their Go modules: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, and kube-proxy (the baseline tests/bench compares Seine's
// Service proxy with), built by `make control-plane`; and, for the real
// Nodes of `bin/sandbox up --kubelet`, the kubelet, kubectl and the e2e
// test image agnhost, built by `make node-tools`. It is never imported;
// both targets build into a cache directory outside the repository.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
