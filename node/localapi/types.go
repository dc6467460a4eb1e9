// Package localapi is the daemon's local API: JSON over HTTP on a unix
// socket (config apiSocket, mode 0600: root only), the channel seinectl
// uses for what only the Node knows — its Pods' interfaces, its flows, its
// copy of the policy state, packet traces, its log level and a support
// bundle. The cluster-wide views (AgentInfo, ControllerInfo, computed
// policies, Traceflow) come from the Kubernetes API instead.
//
// Routes (all GET unless noted):
//
//	/v1/version                       Version
//	/v1/agentinfo                     ops.seine.io AgentInfoStatus, as the daemon computes it now
//	/v1/podinterfaces                 []PodInterface
//	/v1/networkpolicies               []AgentPolicy (the agent's computed NetworkPolicies)
//	/v1/appliedtogroups               []controlplane AppliedToGroup
//	/v1/addressgroups                 []controlplane AddressGroup
//	/v1/services                      []ServiceFrontend (the Service proxy's frontends)
//	/v1/ovsflows?pod=&networkpolicy=&service=&table=   []Flow
//	/v1/trace-packet (POST TraceRequest)      TraceResult
//	/v1/loglevel (GET; PUT LogLevel)          LogLevel
//	/v1/supportbundle                 application/gzip: a tar archive
//	/healthz, /readyz                 the probes (see node/health)
//	/debug/pprof/...                  net/http/pprof
//
// Errors are HTTP status codes with a JSON Error body.
package localapi

import (
	"time"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// DefaultSocket is the socket's default path.
const DefaultSocket = "/var/run/seine/seine.sock"

// Error is the body of a failed request.
type Error struct {
	Error string `json:"error"`
}

// Version describes the daemon and its Open vSwitch.
type Version struct {
	Node     string `json:"node"`
	Daemon   string `json:"daemon"`
	OVS      string `json:"ovs"`
	Datapath string `json:"datapath"`
}

// PodInterface is one Pod attached to the bridge.
type PodInterface struct {
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	ContainerID     string `json:"containerID"`
	IfName          string `json:"ifName"`
	HostVeth        string `json:"hostVeth"`
	OFPort          uint32 `json:"ofport"`
	IP              string `json:"ip"`
	MAC             string `json:"mac"`
	IngressIsolated bool   `json:"ingressIsolated"`
	EgressIsolated  bool   `json:"egressIsolated"`
	// EgressLimited: the Pod has an egress limit
	// (kubernetes.io/egress-bandwidth), which its own qdisc enforces.
	EgressLimited bool `json:"egressLimited,omitempty"`
	// EgressMeter is the id of the OpenFlow meter behind the Pod's egress
	// limit, absent without one.
	EgressMeter uint32 `json:"egressMeter,omitempty"`
}

// AgentPolicy is a computed NetworkPolicy as this Node's agent holds it.
type AgentPolicy struct {
	Policy *cpv1alpha1.NetworkPolicy `json:"policy"`
	// Installed: flows for its current spec are installed.
	Installed bool `json:"installed"`
	// Targets are the local Pods its flows cover.
	Targets []string `json:"targets,omitempty"`
	// Flows is the number of flows its translation wants.
	Flows int `json:"flows"`
}

// Flow states.
const (
	// FlowInstalled: desired by Seine and present in OVS.
	FlowInstalled = "installed"
	// FlowMissing: desired by Seine but absent from OVS.
	FlowMissing = "missing"
	// FlowUnknown: in OVS but not in Seine's desired state (learned
	// affinity flows, or leftovers).
	FlowUnknown = "unknown"
)

// Flow is one OpenFlow entry of the integration bridge.
type Flow struct {
	Table    string `json:"table"`
	TableID  uint8  `json:"tableID"`
	Priority uint16 `json:"priority"`
	Cookie   string `json:"cookie"`
	Match    string `json:"match"`
	// Actions in ovs-actions(7) syntax with table names; empty for
	// FlowUnknown entries.
	Actions string `json:"actions,omitempty"`
	// Owner names what the flow belongs to: "pipeline", "pod ns/name",
	// "node <name>", "policy ns/name", "service port <id>", ...
	Owner   string `json:"owner,omitempty"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	State   string `json:"state"`
}

// FlowQuery selects flows; empty fields select everything.
type FlowQuery struct {
	// Pod ("namespace/name") selects the Pod's own flows and every flow
	// matching its port, address or MAC.
	Pod string
	// NetworkPolicy ("namespace/name" of the source, or the computed
	// "np-<uid>") selects the policy's flows.
	NetworkPolicy string
	// Service ("namespace/name") selects the flows of the Service's
	// frontends.
	Service string
	// Table selects one table by name (or number).
	Table string
}

// ServiceFrontend is one frontend of a Service port as the Node's Service
// proxy programmed it (one select group and its flows).
type ServiceFrontend struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Port is the Service port's name (its number when unnamed) and
	// protocol, "http/TCP".
	Port string `json:"port"`
	// Kind is the traffic it takes: internal, nodeport, external,
	// external-pods, loadbalancer, loadbalancer-pods; a "/node" suffix
	// marks the Node's own connections under externalTrafficPolicy Local
	// (docs/design.md, "Service proxy").
	Kind string `json:"kind"`
	// ID is the group ID and the flows' owner ("svc/<ID>").
	ID uint32 `json:"id"`
	// Addresses are the VIPs with the port they answer on, "10.96.0.10:80".
	Addresses []string `json:"addresses"`
	// Aliases maps each alias among Addresses' IPs to the externalIP or
	// LoadBalancer IP it stands for (served while that IP is local).
	Aliases map[string]string `json:"aliases,omitempty"`
	// Action is balance, reject (no endpoint: the host refuses new
	// connections) or drop (a Local traffic policy without a local
	// endpoint).
	Action string `json:"action"`
	// Endpoints are "ip:port", with " (local)" for a Pod of this Node.
	Endpoints []string `json:"endpoints,omitempty"`
	// SNAT: new connections get a source of the Node's (the gateway IP,
	// or the Node IP where the endpoint is reached through the host), so
	// the answers come back through it (externalTrafficPolicy Cluster).
	SNAT bool `json:"snat,omitempty"`
	// AffinitySeconds is the ClientIP session affinity, 0 without.
	AffinitySeconds int `json:"affinitySeconds,omitempty"`
	// Sources limit the frontend to these sources (the Node's own
	// connections); SourceRanges admit only these (loadBalancerSourceRanges).
	Sources      []string `json:"sources,omitempty"`
	SourceRanges []string `json:"sourceRanges,omitempty"`
}

// TraceRequest asks for an ofproto/trace of a packet from a local Pod.
type TraceRequest struct {
	// Source is the sending Pod, "namespace/name", attached to this Node.
	Source string `json:"source"`
	// Destination is "namespace/name" of a Pod or an IPv4 address.
	Destination string `json:"destination"`
	// Flow adds ovs-ofctl(8) flow fields, e.g. "tcp,tcp_dst=80"; default
	// an ICMP echo request.
	Flow string `json:"flow,omitempty"`
}

// TraceResult is the outcome of a trace on this Node.
type TraceResult struct {
	Node string `json:"node"`
	// Flow is the flow traced (ovs-ofctl syntax).
	Flow string `json:"flow"`
	// Tables the packet passed, in order.
	Tables []string `json:"tables"`
	// Verdict is Delivered, Forwarded, ToHost or Dropped (the
	// ops.seine.io Trace* outcomes).
	Verdict string `json:"verdict"`
	// Detail names the Pod, the next Node, or why it was dropped.
	Detail string `json:"detail"`
	// DatapathActions of the last section of the trace.
	DatapathActions string `json:"datapathActions"`
	// Output is the full ofproto/trace text.
	Output string `json:"output"`
}

// LogLevel is the daemon's zap level: debug, info, warn or error.
type LogLevel struct {
	Level string `json:"level"`
}

// AgentInfo is the AgentInfo status the daemon computes now.
type AgentInfo = opsv1alpha1.AgentInfoStatus

// ReadTimeout bounds one request's handling, a support bundle included.
const ReadTimeout = 2 * time.Minute
