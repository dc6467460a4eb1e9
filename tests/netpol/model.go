// Package netpol is the test support of Seine's NetworkPolicy conformance
// and differential suites: the cluster model the suites run on (namespaces
// x, y, z with Pods a, b, c), an evaluator of the Kubernetes NetworkPolicy
// API semantics, truth tables with readable diffs, the scenarios of the
// upstream Kubernetes NetworkPolicy e2e suite re-created as data, a random
// policy generator, a parallel prober and an ofproto/trace based check for
// protocols the kernel cannot carry (SCTP).
//
// The semantics are those of the networking.k8s.io/v1 API reference
// (NetworkPolicySpec, NetworkPolicyPeer, NetworkPolicyPort) and the
// Kubernetes concept page "Network Policies".
package netpol

import (
	"fmt"
	"net"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// Namespaces returns the model's namespaces, labelled ns=<name>.
func Namespaces() []string { return []string{"x", "y", "z"} }

// PodNames returns the Pods of every namespace, labelled pod=<name>.
func PodNames() []string { return []string{"a", "b", "c"} }

// ServedPorts returns the port numbers every Pod serves on TCP, UDP and
// SCTP.
func ServedPorts() []int32 { return []int32{80, 81} }

// Protocols returns the protocols every Pod declares ports for.
func Protocols() []corev1.Protocol {
	return []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
}

// Label keys of the model.
const (
	// LabelNS is the namespace label the suite sets (ns=<name>).
	LabelNS = "ns"
	// LabelPod is the Pod label the suite sets (pod=<name>).
	LabelPod = "pod"
	// LabelMetadataName is the namespace label the API server sets on
	// every namespace (kubernetes.io/metadata.name=<name>, KEP-2161).
	LabelMetadataName = corev1.LabelMetadataName
)

// PortName is the container port name of port/proto in the model, e.g.
// "serve-80-tcp" (an IANA_SVC_NAME: at most 15 characters).
func PortName(port int32, proto corev1.Protocol) string {
	p := "tcp"
	switch proto {
	case corev1.ProtocolUDP:
		p = "udp"
	case corev1.ProtocolSCTP:
		p = "sctp"
	}
	return fmt.Sprintf("serve-%d-%s", port, p)
}

// PodID names a Pod.
type PodID struct {
	Namespace, Name string
}

// String renders "ns/name".
func (p PodID) String() string { return p.Namespace + "/" + p.Name }

// ContainerPort is a port a Pod declares.
type ContainerPort struct {
	Name     string
	Port     int32
	Protocol corev1.Protocol
}

// Pod is what the evaluator needs to know of a Pod.
type Pod struct {
	PodID
	Labels map[string]string
	// IP is the Pod IP (IPv4).
	IP net.IP
	// Node is the Node the Pod runs on (for reports and tracing).
	Node  string
	Ports []ContainerPort
}

// State is the part of the cluster that decides NetworkPolicy verdicts:
// namespace labels and Pods.
type State struct {
	// NamespaceLabels maps namespace name → its labels (including
	// kubernetes.io/metadata.name as the API server sets it).
	NamespaceLabels map[string]map[string]string
	// Pods in a stable order (see SortPods).
	Pods []Pod
}

// Pod returns the Pod named id, or nil.
func (s *State) Pod(id PodID) *Pod {
	for i := range s.Pods {
		if s.Pods[i].PodID == id {
			return &s.Pods[i]
		}
	}
	return nil
}

// PodIDs returns the Pods' IDs in order.
func (s *State) PodIDs() []PodID {
	ids := make([]PodID, len(s.Pods))
	for i, p := range s.Pods {
		ids[i] = p.PodID
	}
	return ids
}

// Clone returns a deep copy, so scenario steps can mutate labels.
func (s *State) Clone() *State {
	c := &State{NamespaceLabels: map[string]map[string]string{}}
	for ns, l := range s.NamespaceLabels {
		c.NamespaceLabels[ns] = cloneLabels(l)
	}
	for _, p := range s.Pods {
		q := p
		q.Labels = cloneLabels(p.Labels)
		q.Ports = append([]ContainerPort(nil), p.Ports...)
		c.Pods = append(c.Pods, q)
	}
	return c
}

func cloneLabels(l map[string]string) map[string]string {
	c := make(map[string]string, len(l))
	for k, v := range l {
		c[k] = v
	}
	return c
}

// SortPods orders Pods by namespace, then name.
func SortPods(pods []Pod) {
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
}

// ModelPorts returns the container ports every model Pod declares: ports
// 80 and 81 on TCP, UDP and SCTP, named by PortName.
func ModelPorts() []ContainerPort {
	var ps []ContainerPort
	for _, proto := range Protocols() {
		for _, port := range ServedPorts() {
			ps = append(ps, ContainerPort{Name: PortName(port, proto), Port: port, Protocol: proto})
		}
	}
	return ps
}

// NodeOf spreads the model's Pods over nodes Nodes: Pod j of namespace i
// goes to Node (i+j) mod nodes, so every Node holds one Pod of each
// namespace and of each name, and every namespace spans every Node.
func NodeOf(nsIndex, podIndex, nodes int) int { return (nsIndex + podIndex) % nodes }

// NewModelState builds the model's State from Pod IPs and Nodes (keyed by
// PodID); it is what the cluster holds right after setup, and what unit
// tests evaluate against.
func NewModelState(ips map[PodID]net.IP, nodes map[PodID]string) *State {
	s := &State{NamespaceLabels: map[string]map[string]string{}}
	for _, ns := range Namespaces() {
		s.NamespaceLabels[ns] = map[string]string{LabelNS: ns, LabelMetadataName: ns}
		for _, name := range PodNames() {
			id := PodID{ns, name}
			s.Pods = append(s.Pods, Pod{PodID: id, Labels: map[string]string{LabelPod: name},
				IP: ips[id], Node: nodes[id], Ports: ModelPorts()})
		}
	}
	SortPods(s.Pods)
	return s
}

// PortProto is a destination port and protocol a scenario probes.
type PortProto struct {
	Port     int32
	Protocol corev1.Protocol
}

// String renders "TCP/80".
func (p PortProto) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }
