package podnet

import (
	"slices"
	"strings"

	"github.com/seine-net/seine/datapath/pipeline"
)

// podRecord is what the backend keeps of an attached Pod: the flowsync
// owner of its flows and what they were built from.
type podRecord struct {
	owner string
	port  string // the OVS port (host veth)
	pod   pipeline.Pod
	// egressLimited: the Pod has an egress limit (its port records
	// seine.io/egress-bandwidth), with or without a meter behind it.
	egressLimited bool
}

// remember records an attachment of the Pod namespace/name (none when the
// runtime did not pass the name) and reports it to the policy hook
// (restored: found attached at start-up). A Pod may have more than one
// attachment at a time (a StatefulSet Pod deleted and created again on this
// Node while the first sandbox's ADD still runs): the records are kept in
// the order they were made, and the last one is the Pod's current
// attachment, the one the hook knows. The hook is called with podMu held,
// so that it learns of attachments in the order the records change (it
// must not call back into the Backend).
func (b *Backend) remember(namespace, name string, r podRecord, restored bool) {
	if name == "" {
		return
	}
	key := namespace + "/" + name
	b.podMu.Lock()
	defer b.podMu.Unlock()
	rs := slices.DeleteFunc(b.pods[key], func(o podRecord) bool { return o.owner == r.owner })
	b.pods[key] = append(rs, r)
	if p := b.cfg.Policy; p != nil {
		p.PodAttached(namespace, name, r.pod.OFPort, r.pod.IP, restored)
	}
}

// forget removes the record of the attachment with the given flowsync
// owner, if any, and tells the policy hook (with podMu held, as remember
// does): the Pod is detached when no other attachment of it is left, and
// when the removed one was current the latest one left becomes current
// again.
func (b *Backend) forget(owner string) {
	b.podMu.Lock()
	defer b.podMu.Unlock()
	p := b.cfg.Policy
	for k, rs := range b.pods {
		i := slices.IndexFunc(rs, func(r podRecord) bool { return r.owner == owner })
		if i < 0 {
			continue
		}
		wasCurrent := i == len(rs)-1
		rs = slices.Delete(rs, i, i+1)
		ns, name, _ := strings.Cut(k, "/")
		switch {
		case len(rs) == 0:
			delete(b.pods, k)
			if p != nil {
				p.PodDetached(ns, name)
			}
		case wasCurrent:
			b.pods[k] = rs
			if p != nil {
				// As restored: its flows carry the isolation it had,
				// which the policy agent checks again.
				now := rs[len(rs)-1]
				p.PodAttached(ns, name, now.pod.OFPort, now.pod.IP, true)
			}
		default:
			b.pods[k] = rs
		}
	}
}

// current returns the Pod's current attachment.
func (b *Backend) current(key string) (podRecord, bool) {
	b.podMu.Lock()
	defer b.podMu.Unlock()
	rs := b.pods[key]
	if len(rs) == 0 {
		return podRecord{}, false
	}
	return rs[len(rs)-1], true
}

// recorded reports whether the Pod's attachment owner is still recorded.
func (b *Backend) recorded(key, owner string) bool {
	b.podMu.Lock()
	defer b.podMu.Unlock()
	return slices.ContainsFunc(b.pods[key], func(r podRecord) bool { return r.owner == owner })
}

// updatePod stores pod in the record of the Pod's attachment owner, and
// reports whether that attachment is still recorded (not detached).
func (b *Backend) updatePod(key, owner string, pod pipeline.Pod) bool {
	b.podMu.Lock()
	defer b.podMu.Unlock()
	rs := b.pods[key]
	i := slices.IndexFunc(rs, func(r podRecord) bool { return r.owner == owner })
	if i < 0 {
		return false
	}
	rs[i].pod = pod
	return true
}
