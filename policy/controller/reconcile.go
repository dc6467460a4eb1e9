package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	cpv1alpha1 "github.com/seine-net/seine/policy/client/informers/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/compute"
)

// reconciler writes one kind.
type reconciler interface {
	informer() cache.SharedIndexInformer
	storedNames() []string
	reconcile(ctx context.Context, l *leading, k compute.Key, desired metav1.Object, ok bool) error
}

type object interface {
	metav1.Object
	runtime.Object
}

// kindClient is the typed client of one kind (the generated clients have
// exactly these methods).
type kindClient[T object] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}

type lister[T object] interface {
	Get(name string) (T, error)
	List(selector labels.Selector) ([]T, error)
}

// kindOps adapts one kind to the generic reconcile.
type kindOps[T object] struct {
	kind   compute.Kind
	client kindClient[T]
	inf    cache.SharedIndexInformer
	lister lister[T]
	// spec and status return the parts compared and copied.
	spec, status       func(T) any
	setSpec, setStatus func(dst, src T)
	copy               func(T) T
}

func (o *kindOps[T]) informer() cache.SharedIndexInformer { return o.inf }

func (o *kindOps[T]) storedNames() []string {
	objs, _ := o.lister.List(labels.Everything())
	out := make([]string, 0, len(objs))
	for _, x := range objs {
		out = append(out, x.GetName())
	}
	return out
}

// reconcile makes the stored object k equal to desired (or absent when
// !ok): one create, update (labels, spec and status together: the kinds
// have no status subresource) or delete, only when it differs. Metadata
// other than labels is never compared.
func (o *kindOps[T]) reconcile(ctx context.Context, l *leading, k compute.Key, desired metav1.Object, ok bool) error {
	m := l.c.metrics
	cached, err := o.lister.Get(k.Name)
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get %s from cache: %w", k, err)
	}
	stored, found := latest(l, k, cached, found)
	if !ok {
		if !found || !l.deleteDue(k) {
			return nil
		}
		uid := stored.GetUID()
		err := o.client.Delete(ctx, k.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s: %w", k, err)
		}
		m.writes.WithLabelValues(string(o.kind), "delete").Inc()
		l.wroteDelete(k, stored.GetResourceVersion())
		return nil
	}
	l.keepNow(k)
	d := desired.(T)
	if !found {
		created, err := o.client.Create(ctx, d, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create %s: %w", k, err)
		}
		m.writes.WithLabelValues(string(o.kind), "create").Inc()
		l.wrote(k, created)
	} else if !labelsEqual(stored.GetLabels(), d.GetLabels()) || !equality.Semantic.DeepEqual(o.spec(stored), o.spec(d)) ||
		!equality.Semantic.DeepEqual(o.status(stored), o.status(d)) {
		upd := o.copy(stored)
		upd.SetLabels(d.GetLabels())
		o.setSpec(upd, d)
		o.setStatus(upd, d)
		updated, err := o.client.Update(ctx, upd, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update %s: %w", k, err)
		}
		m.writes.WithLabelValues(string(o.kind), "update").Inc()
		l.wrote(k, updated)
	}
	return nil
}

func labelsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// newReconcilers returns the reconciler of every kind.
func newReconcilers(cp versioned.Interface, inf cpv1alpha1.Interface) map[compute.Kind]reconciler {
	c := cp.ControlplaneV1alpha1()
	return map[compute.Kind]reconciler{
		compute.KindAddressGroup: &kindOps[*v1alpha1.AddressGroup]{
			kind: compute.KindAddressGroup, client: c.AddressGroups(),
			inf: inf.AddressGroups().Informer(), lister: inf.AddressGroups().Lister(),
			spec:      func(x *v1alpha1.AddressGroup) any { return &x.Spec },
			status:    func(x *v1alpha1.AddressGroup) any { return &x.Status },
			setSpec:   func(d, s *v1alpha1.AddressGroup) { d.Spec = s.Spec },
			setStatus: func(d, s *v1alpha1.AddressGroup) { d.Status = s.Status },
			copy:      func(x *v1alpha1.AddressGroup) *v1alpha1.AddressGroup { return x.DeepCopy() },
		},
		compute.KindAppliedToGroup: &kindOps[*v1alpha1.AppliedToGroup]{
			kind: compute.KindAppliedToGroup, client: c.AppliedToGroups(),
			inf: inf.AppliedToGroups().Informer(), lister: inf.AppliedToGroups().Lister(),
			spec:      func(x *v1alpha1.AppliedToGroup) any { return &x.Spec },
			status:    func(x *v1alpha1.AppliedToGroup) any { return &x.Status },
			setSpec:   func(d, s *v1alpha1.AppliedToGroup) { d.Spec = s.Spec },
			setStatus: func(d, s *v1alpha1.AppliedToGroup) { d.Status = s.Status },
			copy:      func(x *v1alpha1.AppliedToGroup) *v1alpha1.AppliedToGroup { return x.DeepCopy() },
		},
		compute.KindNetworkPolicy: &kindOps[*v1alpha1.NetworkPolicy]{
			kind: compute.KindNetworkPolicy, client: c.NetworkPolicies(),
			inf: inf.NetworkPolicies().Informer(), lister: inf.NetworkPolicies().Lister(),
			spec:      func(x *v1alpha1.NetworkPolicy) any { return &x.Spec },
			status:    func(x *v1alpha1.NetworkPolicy) any { return &x.Status },
			setSpec:   func(d, s *v1alpha1.NetworkPolicy) { d.Spec = s.Spec },
			setStatus: func(d, s *v1alpha1.NetworkPolicy) { d.Status = s.Status },
			copy:      func(x *v1alpha1.NetworkPolicy) *v1alpha1.NetworkPolicy { return x.DeepCopy() },
		},
		compute.KindPodRealization: &kindOps[*v1alpha1.PodRealization]{
			kind: compute.KindPodRealization, client: c.PodRealizations(),
			inf: inf.PodRealizations().Informer(), lister: inf.PodRealizations().Lister(),
			spec:      func(x *v1alpha1.PodRealization) any { return &x.Spec },
			status:    func(x *v1alpha1.PodRealization) any { return &x.Status },
			setSpec:   func(d, s *v1alpha1.PodRealization) { d.Spec = s.Spec },
			setStatus: func(d, s *v1alpha1.PodRealization) { d.Status = s.Status },
			copy:      func(x *v1alpha1.PodRealization) *v1alpha1.PodRealization { return x.DeepCopy() },
		},
	}
}
