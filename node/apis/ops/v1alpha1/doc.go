// Package v1alpha1 is the ops.seine.io API: the objects operators read and
// write to watch and debug Seine, apart from the computed policy state of
// controlplane.seine.io (which only Seine writes):
//
//   - AgentInfo, one per Node, written by that Node's daemon: versions,
//     datapath, counts, conditions;
//   - ControllerInfo, one per cluster, written by the policy controller's
//     leader: who leads since when, what it computed, how long it took;
//   - Traceflow, written by an operator (or seinectl traceflow): a real
//     packet injected at a Pod's port and followed across Nodes; the Nodes
//     it crosses write what they saw into its status.
//
// AgentInfo and ControllerInfo have no status subresource: their writer
// owns the whole object and writes it in one request. Traceflow has one:
// its spec is the operator's, its status the Nodes'.
//
// +k8s:deepcopy-gen=package
// +groupName=ops.seine.io
package v1alpha1
