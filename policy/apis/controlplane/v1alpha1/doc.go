// Package v1alpha1 is the controlplane.seine.io API: the computed form of
// Kubernetes NetworkPolicies that the leader's policy controller writes and
// every Node's agent reads (only the objects whose span includes its Node).
//
// The kinds have no status subresource: the controller is their only
// writer and their status (counts for kubectl columns) derives from the
// spec, so one create or update carries both, halving the writes.
//
// +k8s:deepcopy-gen=package
// +groupName=controlplane.seine.io
package v1alpha1
