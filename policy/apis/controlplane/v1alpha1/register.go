package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

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
