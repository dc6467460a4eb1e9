package controller

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/compute"
)

// TestCompactPod keeps what the model reads of a Pod, under the Pod's
// informer key, and nothing that a deep copy shares.
func TestCompactPod(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1", ResourceVersion: "42",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"big": "x"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}, {ContainerPort: 81}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}}},
	}
	out, err := compactPod(p)
	if err != nil {
		t.Fatal(err)
	}
	cp, ok := out.(*cachedPod)
	if !ok {
		t.Fatalf("transform gave %T", out)
	}
	want := compute.PodInfo{Namespace: "ns", Name: "web", UID: "u1", Labels: map[string]string{"app": "web"},
		NodeName: "n1", Active: true, IPs: []string{"10.244.0.5"},
		Ports: []v1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 80}}}
	if !reflect.DeepEqual(cp.info, want) {
		t.Errorf("info %+v, want %+v", cp.info, want)
	}
	if key, err := cache.MetaNamespaceKeyFunc(cp); err != nil || key != "ns/web" || cp.GetResourceVersion() != "42" {
		t.Errorf("key %q (%v), resourceVersion %q", key, err, cp.GetResourceVersion())
	}
	if again, _ := compactPod(cp); again != cp {
		t.Error("an already compact Pod was transformed again")
	}
	c := cp.DeepCopyObject().(*cachedPod)
	c.info.Labels["app"] = "db"
	c.info.IPs[0] = "x"
	if cp.info.Labels["app"] != "web" || cp.info.IPs[0] != "10.244.0.5" {
		t.Error("deep copy shares labels or IPs")
	}
}
