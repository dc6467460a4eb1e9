package podnet

import (
	"sort"
	"strings"
)

// Attachment describes one Pod attached to the bridge, for operators
// (seinectl get podinterface, AgentInfo).
type Attachment struct {
	Namespace, Name     string
	ContainerID, IfName string
	// HostVeth is the host end of the Pod's veth (its OVS port).
	HostVeth string
	OFPort   uint32
	IP       string
	MAC      string
	// IngressIsolated and EgressIsolated: some NetworkPolicy isolates the
	// Pod for that direction.
	IngressIsolated, EgressIsolated bool
	// EgressLimited: the Pod has an egress limit
	// (kubernetes.io/egress-bandwidth), which its own qdisc enforces.
	EgressLimited bool
	// EgressMeter is the OpenFlow meter behind the Pod's egress limit (0:
	// none).
	EgressMeter uint32
	// FlowOwner is the flowsync owner of the Pod's own flows.
	FlowOwner string
}

// Attachments returns the Pods this backend attached or restored, sorted
// by namespace and name: of a Pod attached more than once at a time, the
// attachment made last (see remember). Only Pods whose name the runtime passed
// (K8S_POD_NAME) are known by name.
func (b *Backend) Attachments() []Attachment {
	b.podMu.Lock()
	out := make([]Attachment, 0, len(b.pods))
	for k, rs := range b.pods {
		r := rs[len(rs)-1]
		ns, name, _ := strings.Cut(k, "/")
		rest := strings.TrimPrefix(r.owner, "pod/")
		cid, ifn, _ := strings.Cut(rest, "/")
		out = append(out, Attachment{Namespace: ns, Name: name, ContainerID: cid, IfName: ifn, HostVeth: r.port,
			OFPort: r.pod.OFPort, IP: r.pod.IP.String(), MAC: r.pod.MAC.String(),
			IngressIsolated: r.pod.IngressIsolated, EgressIsolated: r.pod.EgressIsolated,
			EgressLimited: r.egressLimited, EgressMeter: r.pod.EgressMeter, FlowOwner: r.owner})
	}
	b.podMu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Attachment returns the attachment of one Pod.
func (b *Backend) Attachment(namespace, name string) (Attachment, bool) {
	for _, a := range b.Attachments() {
		if a.Namespace == namespace && a.Name == name {
			return a, true
		}
	}
	return Attachment{}, false
}
