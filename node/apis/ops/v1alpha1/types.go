package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of an AgentInfo (metav1.Condition, status True/False).
const (
	// AgentOVSConnected: the daemon's OVSDB and OpenFlow connections to
	// its Node's Open vSwitch are up.
	AgentOVSConnected = "OVSConnected"
	// AgentAPIConnected: the daemon's last write to the Kubernetes API
	// server succeeded. It is True whenever written: the first write after
	// failed ones has reason Reconnected and names the last error; while
	// the API server does not answer, the heartbeat goes stale.
	AgentAPIConnected = "APIConnected"
	// AgentPoliciesRealized: every NetworkPolicy object the agent holds
	// is installed as flows (the agent synced, its last installation
	// succeeded, and no policy waited longer than its RealizeTimeout for
	// its AppliedToGroup).
	AgentPoliciesRealized = "PoliciesRealized"
	// AgentReady: the daemon's /readyz checks pass (OVS connected,
	// pipeline installed, Pods restored, policies realized, CNI serving).
	AgentReady = "Ready"
)

// AgentInfo is the runtime state of one Node's seine daemon, written by
// that daemon (named after the Node, owned by the Node object so that it
// goes away with it) every minute and whenever a figure changes.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:path=agentinfos,scope=Cluster,shortName=sai,categories=seine
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.version`
// +kubebuilder:printcolumn:name="OVS",type=string,JSONPath=`.status.ovs.version`
// +kubebuilder:printcolumn:name="Datapath",type=string,JSONPath=`.status.ovs.datapathType`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.trafficMode`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.podCount`
// +kubebuilder:printcolumn:name="Flows",type=integer,JSONPath=`.status.flowCount`
// +kubebuilder:printcolumn:name="Policies",type=integer,JSONPath=`.status.networkPolicyCount`
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.lastHeartbeatTime`
// +kubebuilder:printcolumn:name="Tunnel",type=string,JSONPath=`.status.tunnelType`,priority=1
// +kubebuilder:printcolumn:name="Node-IP",type=string,JSONPath=`.status.nodeIP`,priority=1
// +kubebuilder:printcolumn:name="Pod-CIDR",type=string,JSONPath=`.status.podCIDR`,priority=1
type AgentInfo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status AgentInfoStatus `json:"status,omitempty"`
}

// OVSInfo describes the Node's Open vSwitch.
type OVSInfo struct {
	// Version of ovs-vswitchd, e.g. "3.1.0".
	// +optional
	Version string `json:"version,omitempty"`
	// DatapathType is "system" (kernel) or "netdev" (userspace).
	// +optional
	DatapathType string `json:"datapathType,omitempty"`
	// Bridge is the integration bridge.
	// +optional
	Bridge string `json:"bridge,omitempty"`
}

// TableFlows counts the flows of one pipeline table.
type TableFlows struct {
	// Table is the table's name in the pipeline (datapath/pipeline).
	Table string `json:"table"`
	// ID is the OpenFlow table number.
	ID int32 `json:"id"`
	// Flows is the number of flow entries Seine keeps in the table.
	Flows int32 `json:"flows"`
}

// AgentInfoStatus is what the daemon reports.
type AgentInfoStatus struct {
	// Version of the seine binary.
	// +optional
	Version string `json:"version,omitempty"`
	// Capabilities name what this daemon can read that an earlier release
	// could not, so the policy controller uses a newer layout for this Node
	// only once its daemon lists it, and stops when a rollback's daemon no
	// longer does: "PodRealizationSlices" (a PodRealization in slices,
	// controlplane v1alpha1.PodRealizationSlicesCapability).
	// +optional
	// +listType=set
	Capabilities []string `json:"capabilities,omitempty"`
	// StartTime is when this daemon process started.
	// +optional
	StartTime metav1.Time `json:"startTime,omitempty"`
	// LastHeartbeatTime is when the daemon last wrote the object (at
	// least every minute while it can reach the API server).
	// +optional
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// OVS is the Node's Open vSwitch.
	// +optional
	OVS OVSInfo `json:"ovs,omitempty"`
	// TunnelType is geneve, vxlan or gre.
	// +optional
	TunnelType string `json:"tunnelType,omitempty"`
	// TrafficMode is the Node's trafficEncapMode: encap, noEncap, hybrid
	// or networkPolicyOnly (docs/configuration.md).
	// +optional
	TrafficMode string `json:"trafficMode,omitempty"`
	// NodeIP is the Node's transport address; PodCIDR its Pod range.
	// +optional
	NodeIP string `json:"nodeIP,omitempty"`
	// +optional
	PodCIDR string `json:"podCIDR,omitempty"`
	// PodCount is the number of Pods attached to the bridge.
	// +optional
	PodCount int32 `json:"podCount"`
	// FlowCount is the number of flow entries Seine keeps installed.
	// +optional
	FlowCount int32 `json:"flowCount"`
	// FlowTables counts them per table, in pipeline order.
	// +optional
	FlowTables []TableFlows `json:"flowTables,omitempty"`
	// NetworkPolicyCount is the number of computed NetworkPolicies the
	// Node's agent holds (those with a target Pod on this Node).
	// +optional
	NetworkPolicyCount int32 `json:"networkPolicyCount"`
	// PeerCount is the number of peer Nodes programmed.
	// +optional
	PeerCount int32 `json:"peerCount"`
	// RealizedPolicies maps the name of each computed NetworkPolicy
	// ("np-<uid>") whose flows are installed to the generation of its
	// source networking.k8s.io NetworkPolicy they implement. The policy
	// controller counts them into the source's realization annotations.
	// +optional
	RealizedPolicies map[string]int64 `json:"realizedPolicies,omitempty"`
	// Conditions: OVSConnected, APIConnected, PoliciesRealized, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AgentInfoList is a list of AgentInfos.
type AgentInfoList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AgentInfo `json:"items"`
}

// ControllerInfo is the state of the leader-elected policy controller,
// written by the current leader when it takes over, every minute, and
// within a check period (5 s) of a change of its figures. It is named after the controller's
// Lease ("seine-controller" by default).
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:path=controllerinfos,scope=Cluster,shortName=sci,categories=seine
// +kubebuilder:printcolumn:name="Leader",type=string,JSONPath=`.status.leader`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.status.leaderSince`
// +kubebuilder:printcolumn:name="Policies",type=integer,JSONPath=`.status.computed.networkPolicies`
// +kubebuilder:printcolumn:name="AppliedTo",type=integer,JSONPath=`.status.computed.appliedToGroups`
// +kubebuilder:printcolumn:name="Address",type=integer,JSONPath=`.status.computed.addressGroups`
// +kubebuilder:printcolumn:name="Last-Computation",type=string,JSONPath=`.status.lastComputation.duration`
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.lastHeartbeatTime`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.version`,priority=1
// +kubebuilder:printcolumn:name="Initial-Sync",type=string,JSONPath=`.status.initialSyncDuration`,priority=1
type ControllerInfo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status ControllerInfoStatus `json:"status,omitempty"`
}

// SourceCounts counts the Kubernetes objects the controller computes from.
type SourceCounts struct {
	// +optional
	Namespaces int32 `json:"namespaces"`
	// +optional
	Pods int32 `json:"pods"`
	// +optional
	NetworkPolicies int32 `json:"networkPolicies"`
	// +optional
	Nodes int32 `json:"nodes"`
}

// ComputedCounts counts the controlplane.seine.io objects it keeps.
type ComputedCounts struct {
	// +optional
	NetworkPolicies int32 `json:"networkPolicies"`
	// +optional
	AppliedToGroups int32 `json:"appliedToGroups"`
	// +optional
	AddressGroups int32 `json:"addressGroups"`
	// +optional
	PodRealizations int32 `json:"podRealizations"`
}

// Computation is one round of the controller's work: from the first
// change it received after being idle until every object the round
// dirtied was written (or found equal) and its queue was empty again.
type Computation struct {
	// FinishedAt is when the round ended.
	FinishedAt metav1.Time `json:"finishedAt"`
	// Duration of the round.
	Duration metav1.Duration `json:"duration"`
	// Objects reconciled in the round.
	Objects int32 `json:"objects"`
}

// ControllerInfoStatus is what the leader reports.
type ControllerInfoStatus struct {
	// Leader is the identity (Node name) of the instance holding the
	// Lease.
	// +optional
	Leader string `json:"leader,omitempty"`
	// LeaderSince is when it started leading.
	// +optional
	LeaderSince metav1.Time `json:"leaderSince,omitempty"`
	// LastHeartbeatTime is when the leader last wrote the object.
	// +optional
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// Version of the leader's seine binary.
	// +optional
	Version string `json:"version,omitempty"`
	// Sources counts the objects computed from.
	// +optional
	Sources SourceCounts `json:"sources,omitempty"`
	// Computed counts the computed objects stored.
	// +optional
	Computed ComputedCounts `json:"computed,omitempty"`
	// QueueDepth is the number of objects waiting to be reconciled.
	// +optional
	QueueDepth int32 `json:"queueDepth"`
	// InitialSyncDuration is how long the leader took, at the start of
	// its term, to compute and write everything (zero until done).
	// +optional
	InitialSyncDuration metav1.Duration `json:"initialSyncDuration,omitempty"`
	// LastComputation is the most recent finished round.
	// +optional
	LastComputation *Computation `json:"lastComputation,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ControllerInfoList is a list of ControllerInfos.
type ControllerInfoList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ControllerInfo `json:"items"`
}

// Traceflow protocols.
const (
	ProtocolICMP = "ICMP"
	ProtocolTCP  = "TCP"
	ProtocolUDP  = "UDP"
)

// Traceflow phases.
const (
	// TraceflowRunning: the source Node accepted the trace and injected
	// (or is about to inject) the packet.
	TraceflowRunning = "Running"
	// TraceflowSucceeded: the packet's fate is known (see Status.Result).
	TraceflowSucceeded = "Succeeded"
	// TraceflowFailed: the trace could not run or did not finish in time
	// (Status.Reason says why).
	TraceflowFailed = "Failed"
)

// Outcomes of a traced packet on one Node (TraceflowNode.Action) and
// overall (TraceflowStatus.Result).
const (
	// TraceDelivered: output to the destination Pod's port.
	TraceDelivered = "Delivered"
	// TraceForwarded: output into the tunnel towards another Node.
	TraceForwarded = "Forwarded"
	// TraceToHost: output to the gateway, i.e. handed to the Node's
	// network stack (a Node address, or a destination outside the
	// cluster).
	TraceToHost = "ToHost"
	// TraceDropped: no table passed it on.
	TraceDropped = "Dropped"
)

// Traceflow injects one real packet at a source Pod's port, marked so
// that every table of every Node it crosses reports it, and records where
// it went: the tables it passed on each Node and whether it was
// delivered, forwarded, handed to the host or dropped. Create one with
// `seinectl traceflow` or kubectl; the source Pod's Node runs it.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,shortName=stf,categories=seine
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.status.packet.srcIP`
// +kubebuilder:printcolumn:name="Destination",type=string,JSONPath=`.status.packet.dstIP`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Result",type=string,JSONPath=`.status.result`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Traceflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TraceflowSpec `json:"spec"`
	// +optional
	Status TraceflowStatus `json:"status,omitempty"`
}

// TraceflowSource is the Pod the packet is injected from.
type TraceflowSource struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
}

// TraceflowDestination is a Pod, or an IPv4 address (a Pod's, a Service's
// ClusterIP, a Node's or one outside the cluster). Exactly one of Pod and
// IP is set.
//
// +kubebuilder:validation:XValidation:rule="has(self.pod) != has(self.ip)",message="set exactly one of pod and ip"
type TraceflowDestination struct {
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +optional
	Pod string `json:"pod,omitempty"`
	// +optional
	IP string `json:"ip,omitempty"`
}

// TraceflowPacket is what to send.
type TraceflowPacket struct {
	// Protocol is ICMP (an echo request, the default), TCP (a SYN) or UDP.
	// +optional
	// +kubebuilder:validation:Enum=ICMP;TCP;UDP
	Protocol string `json:"protocol,omitempty"`
	// DstPort is the TCP or UDP destination port (required for those).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	DstPort int32 `json:"dstPort"`
	// SrcPort is the TCP or UDP source port; 0 picks one.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	SrcPort int32 `json:"srcPort"`
}

// TraceflowSpec is the trace to run.
type TraceflowSpec struct {
	Source      TraceflowSource      `json:"source"`
	Destination TraceflowDestination `json:"destination"`
	// +optional
	Packet TraceflowPacket `json:"packet,omitempty"`
	// TimeoutSeconds bounds the whole trace; 0 (the default) means 10.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds int32 `json:"timeoutSeconds"`
}

// TracedPacket is the packet as injected.
type TracedPacket struct {
	SrcIP    string `json:"srcIP"`
	DstIP    string `json:"dstIP"`
	Protocol string `json:"protocol"`
	// +optional
	SrcPort int32 `json:"srcPort"`
	// +optional
	DstPort int32 `json:"dstPort"`
}

// TraceflowNode is what one Node saw of the packet.
type TraceflowNode struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Tables are the pipeline tables the packet passed, in order.
	Tables []string `json:"tables"`
	// Action is Delivered, Forwarded, ToHost or Dropped.
	Action string `json:"action"`
	// Detail names the Pod it was delivered to, the Node it was
	// forwarded to, or the table that dropped it and why.
	// +optional
	Detail string `json:"detail,omitempty"`
	// NextNode is the Node a Forwarded packet was sent to.
	// +optional
	NextNode string `json:"nextNode,omitempty"`
}

// TraceflowStatus is written by the Nodes the packet crossed.
type TraceflowStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
	// Reason explains a Failed phase.
	// +optional
	Reason string `json:"reason,omitempty"`
	// SourceNode is the Node that injected the packet.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// Tag marks the packet: the source Node's trace number, carried to
	// other Nodes in the tunnel key.
	// +optional
	Tag int32 `json:"tag"`
	// StartTime is when the source Node accepted the trace.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// Packet is the packet injected.
	// +optional
	Packet *TracedPacket `json:"packet,omitempty"`
	// Nodes are the Nodes' reports, in the order the packet crossed them.
	// +optional
	Nodes []TraceflowNode `json:"nodes,omitempty"`
	// Result is the last Node's Action once the phase is Succeeded.
	// +optional
	Result string `json:"result,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// TraceflowList is a list of Traceflows.
type TraceflowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Traceflow `json:"items"`
}
