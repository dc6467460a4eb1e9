package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group.
const GroupName = "controlplane.seine.io"

// SchemeGroupVersion is the group and version of this package's types.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource returns the GroupResource of a resource of this group.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder registers this package's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&AddressGroup{}, &AddressGroupList{},
		&AppliedToGroup{}, &AppliedToGroupList{},
		&NetworkPolicy{}, &NetworkPolicyList{},
		&PodRealization{}, &PodRealizationList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}

// NodeKey is the fixed-length key of a Node name used in span labels and
// object names: "n" and the first 40 hex digits of SHA-256(name). Node
// names may be up to 253 characters, label names only 63.
func NodeKey(node string) string {
	h := sha256.Sum256([]byte(node))
	return "n" + hex.EncodeToString(h[:20])
}

// SpanLabel is the label that puts an object in node's span.
func SpanLabel(node string) string { return SpanLabelPrefix + NodeKey(node) }

// PodRealizationSlicesCapability is what an agent lists in its AgentInfo's
// status.capabilities when it reads a Node's PodRealization in slices. The
// controller slices a Node's PodRealization only while the Node's agent
// lists it, so an agent of an earlier release, which reads the object
// "<NodeKey(node)>" alone, keeps finding every Pod during a rolling
// upgrade or a rollback.
const PodRealizationSlicesCapability = "PodRealizationSlices"

// PodRealizationName names slice i of node's PodRealization: NodeKey(node)
// for slice 0 (the name of the unsliced object too), "<NodeKey(node)>-<i>"
// for the others.
func PodRealizationName(nodeKey string, i int) string {
	if i == 0 {
		return nodeKey
	}
	return nodeKey + "-" + strconv.Itoa(i)
}

// PodRealizationSlice is the slice, 0 to slices-1, that holds the Pod
// namespace/name when a Node's Pods are in slices PodRealizations: the
// 32-bit FNV-1a hash of "<namespace>/<name>" modulo slices. slices is a
// power of two, so halving or doubling it moves a Pod only between slice
// i and slice i + slices/2. slices < 2 gives 0.
func PodRealizationSlice(namespace, name string, slices int) int {
	if slices < 2 {
		return 0
	}
	return int(PodHash(namespace, name) % uint32(slices))
}

// PodHash is the 32-bit FNV-1a hash of "<namespace>/<name>" that
// PodRealizationSlice takes modulo the slice count.
func PodHash(namespace, name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(namespace))
	h.Write([]byte{'/'})
	h.Write([]byte(name))
	return h.Sum32()
}
