package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// fieldManager is the server-side apply field manager of Apply.
const fieldManager = "seine-sandbox"

// applyTimeout bounds how long Apply keeps retrying objects whose kind or
// namespace does not exist yet (e.g. a custom resource whose CRD is applied
// in the same call and not yet established).
const applyTimeout = 60 * time.Second

// readManifests decodes every non-empty YAML (or JSON) document of the
// files, in order. Documents of kind "List" are expanded into their items.
func readManifests(files ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("open manifest: %w", err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(fh, 4096)
		for i := 0; ; i++ {
			var m map[string]interface{}
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fh.Close()
				return nil, fmt.Errorf("decode document %d of %s: %w", i, f, err)
			}
			if len(m) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			if u.IsList() {
				err := u.EachListItem(func(o runtime.Object) error {
					objs = append(objs, o.(*unstructured.Unstructured))
					return nil
				})
				if err != nil {
					fh.Close()
					return nil, fmt.Errorf("expand list in document %d of %s: %w", i, f, err)
				}
				continue
			}
			if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
				fh.Close()
				return nil, fmt.Errorf("document %d of %s lacks apiVersion, kind or metadata.name", i, f)
			}
			objs = append(objs, u)
		}
		fh.Close()
	}
	return objs, nil
}

// Apply creates or updates every object in the multi-document YAML files
// with server-side apply (field manager "seine-sandbox", conflicts forced),
// resolving kinds to resources through API discovery. Namespaced objects
// without a namespace go to "default". Objects that fail because their kind
// or namespace is not known yet are retried, after re-running discovery,
// until they succeed or 60 s (or ctx) pass; any other error (e.g. a
// validation failure) ends Apply after the current pass, so a file may hold a CRD and
// its custom resources, or a Namespace after objects in it. The error lists
// every object that could not be applied.
func (cp *ControlPlane) Apply(ctx context.Context, files ...string) error {
	return cp.ApplyExcept(ctx, nil, files...)
}

// ApplyExcept is Apply leaving out the objects of the listed kinds (e.g. a
// DaemonSet, for a sandbox that runs its daemons itself).
func (cp *ControlPlane) ApplyExcept(ctx context.Context, skipKinds []string, files ...string) error {
	all, err := readManifests(files...)
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	for _, o := range all {
		if !slices.Contains(skipKinds, o.GetKind()) {
			objs = append(objs, o)
		}
	}
	_, rc, err := cp.clientset()
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	deadline := time.Now().Add(applyTimeout)
	pending := objs
	for {
		var failed []*unstructured.Unstructured
		var errs []error
		permanent := false
		for _, o := range pending {
			if err := applyOne(ctx, mapper, dyn, o); err != nil {
				failed = append(failed, o)
				errs = append(errs, err)
				permanent = permanent || !retriable(err)
			}
		}
		if len(failed) == 0 {
			return nil
		}
		if permanent || ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("apply %s: %w", strings.Join(files, ", "), errors.Join(errs...))
		}
		pending = failed
		mapper.Reset()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// retriable reports whether an apply error may go away once other objects
// of the same call exist: an unknown kind (CRD not yet established) or a
// missing namespace, or a transient server condition.
func retriable(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

// applyOne server-side applies a single object.
func applyOne(ctx context.Context, mapper meta.RESTMapper, dyn dynamic.Interface, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	desc := fmt.Sprintf("%s %s", gvk.Kind, o.GetName())
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: resolve kind: %w", desc, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		desc = fmt.Sprintf("%s %s/%s", gvk.Kind, ns, o.GetName())
		ri = dyn.Resource(m.Resource).Namespace(ns)
		o = o.DeepCopy()
		o.SetNamespace(ns)
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("%s: %w", desc, err)
	}
	return nil
}
