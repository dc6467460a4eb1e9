package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels every computed object carries.
const (
	// SpanLabelPrefix prefixes one label per Node in an object's span:
	// "span.controlplane.seine.io/<NodeKey(node)>" with an empty value. An
	// agent lists and watches with the selector of its own key, so the API
	// server sends it only what its Node needs.
	SpanLabelPrefix = "span.controlplane.seine.io/"
	// GroupLabel holds the group key of AddressGroup slices and
	// AppliedToGroup partitions, so all parts of a group can be listed.
	GroupLabel = "controlplane.seine.io/group"
	// PolicyUIDLabel holds the UID of the source networking.k8s.io
	// NetworkPolicy of a computed NetworkPolicy.
	PolicyUIDLabel = "controlplane.seine.io/policy-uid"
)

// GroupSelector selects Pods the way a NetworkPolicy peer or its podSelector
// does (networking.k8s.io/v1 NetworkPolicyPeer): Pods matching PodSelector
// in Namespace when NamespaceSelector is nil, or in every namespace matching
// NamespaceSelector otherwise. A nil PodSelector selects every Pod.
type GroupSelector struct {
	// Namespace is set when NamespaceSelector is nil.
	Namespace string `json:"namespace,omitempty"`
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// NamedPort is a container port with a name, for resolving NetworkPolicy
// ports given by name (resolved per destination Pod and per protocol).
type NamedPort struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
}

// GroupMember is one Pod of a group.
type GroupMember struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// IPs of the Pod (status.podIPs); empty until the Pod has an address.
	// +optional
	IPs []string `json:"ips,omitempty"`
	// Ports are the Pod's named container ports.
	// +optional
	Ports []NamedPort `json:"ports,omitempty"`
}

// AddressGroup is one slice of the Pods a group selects, as peers of rules.
// A group larger than the slice size is split over several objects named
// "<group key>-<slice>"; a Pod always stays in the same slice, so one Pod
// change rewrites one object. Its span is the union of the spans of the
// policies that use the group.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,shortName=sag
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.metadata.labels.controlplane\.seine\.io/group`
// +kubebuilder:printcolumn:name="Members",type=integer,JSONPath=`.status.memberCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AddressGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AddressGroupSpec `json:"spec"`
	// +optional
	Status GroupStatus `json:"status,omitempty"`
}

// AddressGroupSpec is the content of an AddressGroup slice.
type AddressGroupSpec struct {
	Selector GroupSelector `json:"selector"`
	// Slice is the index of this slice within its group.
	Slice int32 `json:"slice"`
	// +optional
	Members []GroupMember `json:"members,omitempty"`
}

// GroupStatus is for operators (kubectl columns).
type GroupStatus struct {
	MemberCount int32 `json:"memberCount"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AddressGroupList is a list of AddressGroups.
type AddressGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressGroup `json:"items"`
}

// AppliedToGroup is the part of a group of target Pods that runs on one
// Node (named "<group key>-<NodeKey(node)>"); its span is that Node.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,shortName=satg
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.metadata.labels.controlplane\.seine\.io/group`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Members",type=integer,JSONPath=`.status.memberCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AppliedToGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AppliedToGroupSpec `json:"spec"`
	// +optional
	Status GroupStatus `json:"status,omitempty"`
}

// AppliedToGroupSpec is the content of one Node's part of a group.
type AppliedToGroupSpec struct {
	Selector GroupSelector `json:"selector"`
	NodeName string        `json:"nodeName"`
	// +optional
	Members []GroupMember `json:"members,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// AppliedToGroupList is a list of AppliedToGroups.
type AppliedToGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AppliedToGroup `json:"items"`
}

// Direction of a rule.
type Direction string

const (
	DirectionIn  Direction = "In"
	DirectionOut Direction = "Out"
)

// IPBlock is a NetworkPolicy ipBlock, as written.
type IPBlock struct {
	CIDR string `json:"cidr"`
	// +optional
	Except []string `json:"except,omitempty"`
}

// PolicyPort is a NetworkPolicy port, as written: Protocol defaults to TCP;
// a nil Port means every port; Port may be a name (resolved per Pod);
// EndPort makes Port..EndPort a range (numeric Port only).
type PolicyPort struct {
	Protocol string `json:"protocol"`
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`
	// +optional
	EndPort *int32 `json:"endPort,omitempty"`
}

// Rule is one ingress or egress rule. Peers are the union of the Pods of
// AddressGroups (group keys) and IPBlocks; with AllPeers set the rule
// matches every peer (the API's empty or missing from/to). An empty Ports
// list matches every port and protocol.
type Rule struct {
	Direction Direction `json:"direction"`
	// +optional
	AllPeers bool `json:"allPeers,omitempty"`
	// +optional
	AddressGroups []string `json:"addressGroups,omitempty"`
	// +optional
	IPBlocks []IPBlock `json:"ipBlocks,omitempty"`
	// +optional
	Ports []PolicyPort `json:"ports,omitempty"`
	// WithinIPBlocks, when set, keeps only the AddressGroups' members with
	// an address inside one of these blocks. It carries named ports
	// towards ipBlock peers: a named port is resolved on the destination
	// Pod, so the rule lists every Pod (with its named ports) and keeps
	// those inside the blocks.
	// +optional
	WithinIPBlocks []IPBlock `json:"withinIPBlocks,omitempty"`
}

// PolicyReference names the source networking.k8s.io/v1 NetworkPolicy.
type PolicyReference struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Generation is the source's metadata.generation this object was
	// computed from; agents report the generation they realized
	// (ops.seine.io AgentInfo), and the controller sums the reports into
	// the source's realization annotations.
	// +optional
	Generation int64 `json:"generation,omitempty"`
}

// NetworkPolicy is the computed form of one networking.k8s.io/v1
// NetworkPolicy (named "np-<source UID>"): the group that selects its
// target Pods, the directions for which those Pods become isolated, and its
// rules. Its span is every Node with at least one target Pod.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,shortName=snp
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source.name`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.source.namespace`
// +kubebuilder:printcolumn:name="Rules",type=integer,JSONPath=`.status.ruleCount`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.spanSize`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NetworkPolicySpec `json:"spec"`
	// +optional
	Status NetworkPolicyStatus `json:"status,omitempty"`
}

// NetworkPolicySpec is the computed policy.
type NetworkPolicySpec struct {
	Source PolicyReference `json:"source"`
	// AppliedToGroup is the group key of the target Pods; the agent reads
	// the AppliedToGroup of its own Node for it.
	AppliedToGroup string `json:"appliedToGroup"`
	// PolicyTypes are the directions ("Ingress", "Egress") for which the
	// target Pods are isolated, as the API defines them (explicit, or
	// implied by the rules present).
	PolicyTypes []string `json:"policyTypes"`
	// +optional
	Rules []Rule `json:"rules,omitempty"`
}

// NetworkPolicyStatus is for operators (kubectl columns).
type NetworkPolicyStatus struct {
	RuleCount int32 `json:"ruleCount"`
	SpanSize  int32 `json:"spanSize"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// NetworkPolicyList is a list of NetworkPolicies.
type NetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkPolicy `json:"items"`
}

// PodRealization acknowledges, per Node, the Pods whose policy objects the
// controller has written (span: that Node). For each Pod it records a
// digest of the policy state that applies to it; an agent holding the same
// state computes the same digest, which is how a CNI ADD knows the Pod's
// policies are in place before it returns.
//
// A Node's Pods are in one object named "<NodeKey(node)>", or, once the
// Node's agent reports PodRealizationSlicesCapability in its AgentInfo, in
// Spec.Slices objects: slice 0 keeps that name, slice i > 0 is named
// "<NodeKey(node)>-<i>" (PodRealizationName). A Pod's slice is
// PodRealizationSlice(namespace, name, Spec.Slices). Slicing keeps a
// change of one Pod's digest from rewriting the digests of every Pod on
// its Node. An agent looks a Pod up in every PodRealization of its Node,
// so it reads either layout; while the controller moves Pods between
// slices, a Pod may be in no slice or in two for a moment.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,shortName=spr
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Slice",type=integer,JSONPath=`.spec.slice`
// +kubebuilder:printcolumn:name="Slices",type=integer,JSONPath=`.spec.slices`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.podCount`
type PodRealization struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PodRealizationSpec `json:"spec"`
	// +optional
	Status PodRealizationStatus `json:"status,omitempty"`
}

// PodRealizationSpec maps Pods to policy digests.
type PodRealizationSpec struct {
	NodeName string `json:"nodeName"`
	// Slice is this object's slice of the Node's Pods, 0 to Slices-1.
	// +optional
	Slice int32 `json:"slice,omitempty"`
	// Slices is how many PodRealizations hold the Node's Pods; 0 means 1
	// (the layout before slicing, which agents without
	// PodRealizationSlicesCapability read).
	// +optional
	Slices int32 `json:"slices,omitempty"`
	// Pods maps "<namespace>/<name>/<uid>" to the digest of the policy
	// state applying to the Pod. The map is one field for the API server's
	// field management (x-kubernetes-map-type: atomic, KEP-555): the
	// controller is its only writer, and tracking each Pod's key made a
	// write of a Node with 1,000 Pods take 2.5 times as long.
	// +optional
	// +mapType=atomic
	Pods map[string]string `json:"pods,omitempty"`
}

// PodRealizationStatus is for operators.
type PodRealizationStatus struct {
	PodCount int32 `json:"podCount"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodRealizationList is a list of PodRealizations.
type PodRealizationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodRealization `json:"items"`
}
