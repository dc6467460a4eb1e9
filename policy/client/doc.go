// Package client documents the generated Go clients of the
// controlplane.seine.io/v1alpha1 API (policy/apis/controlplane/v1alpha1);
// it has no code of its own. The clients live in sub-packages, generated
// by `make generate` (see the go:generate lines in
// policy/apis/controlplane/v1alpha1/generate.go):
//
//   - clientset/versioned: Clientset (NewForConfig) with
//     ControlplaneV1alpha1().{AddressGroups,AppliedToGroups,NetworkPolicies,
//     PodRealizations}() typed, cluster-scoped clients (Create, Get, List,
//     Watch, Update, Patch, Delete, DeleteCollection; no UpdateStatus:
//     the kinds have no status subresource);
//     clientset/versioned/fake is an in-memory Clientset for unit tests.
//   - listers/controlplane/v1alpha1: indexer-backed listers.
//   - informers: SharedInformerFactory (NewSharedInformerFactoryWithOptions,
//     WithTweakListOptions to watch with a span label selector) and
//     Controlplane().V1alpha1().<Kind>() informers.
package client
