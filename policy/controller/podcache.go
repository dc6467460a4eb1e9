package controller

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/seine-net/seine/policy/compute"
)

// cachedPod is what the controller's Pod informer keeps of each Pod: what
// the model reads (compute.PodInfo) and the metadata the informer itself
// needs (namespace and name for its key, resourceVersion). A decoded Pod
// takes about 2 KB even with everything else cleared; this takes a few
// hundred bytes, and at 100,000 Pods the difference is most of the
// controller's memory.
type cachedPod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	info compute.PodInfo
}

// DeepCopyObject implements runtime.Object.
func (p *cachedPod) DeepCopyObject() runtime.Object {
	out := &cachedPod{TypeMeta: p.TypeMeta, info: p.info}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.info.Labels = maps.Clone(p.info.Labels)
	out.info.IPs = slices.Clone(p.info.IPs)
	out.info.Ports = slices.Clone(p.info.Ports)
	return out
}

// compactPod is the Pod informer's transform: a *corev1.Pod becomes a
// *cachedPod; anything else (already transformed) is kept.
func compactPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &cachedPod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		info:       compute.PodInfoOf(p),
	}, nil
}
