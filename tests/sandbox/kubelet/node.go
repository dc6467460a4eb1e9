package kubelet

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// leaseDuration is the Lease's leaseDurationSeconds, the value the real
// kubelet uses (KEP-589: node heartbeats through Leases).
const leaseDuration = 40

// nodeStatus is the status the kubelet reports for its Node: fixed
// capacity, Ready and no pressure, the underlay address as InternalIP.
func (k *Kubelet) nodeStatus(now metav1.Time) corev1.NodeStatus {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
			LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res.DeepCopy(),
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "sandbox kubelet has sufficient memory"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "sandbox kubelet has no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "sandbox kubelet has sufficient PID"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "sandbox kubelet is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: k.cfg.NodeIP},
			{Type: corev1.NodeHostName, Address: k.cfg.NodeName},
		},
		NodeInfo: corev1.NodeSystemInfo{
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			KubeletVersion:          "v1.36.3",
			ContainerRuntimeVersion: "seine-sandbox://1",
			KernelVersion:           "sandbox",
			OSImage:                 "Seine sandbox",
		},
	}
}

// registerNode creates the Node object (or adopts an existing one) and
// writes its status.
func (k *Kubelet) registerNode(ctx context.Context) error {
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: k.cfg.NodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": k.cfg.NodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
		Status: k.nodeStatus(now),
	}
	nodes := k.client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", k.cfg.NodeName, err)
	}
	created.Status = mergeStatus(created.Status, k.nodeStatus(now))
	if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write status of node %s: %w", k.cfg.NodeName, err)
	}
	k.log.Info("node registered", zap.String("node_ip", k.cfg.NodeIP))
	return nil
}

// mergeStatus returns cur with our conditions, capacity, addresses and
// node info, keeping fields others own (e.g. images, volumes).
func mergeStatus(cur, ours corev1.NodeStatus) corev1.NodeStatus {
	cur.Capacity = ours.Capacity
	cur.Allocatable = ours.Allocatable
	cur.Addresses = ours.Addresses
	cur.NodeInfo = ours.NodeInfo
	var conds []corev1.NodeCondition
	for _, c := range ours.Conditions {
		for _, old := range cur.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		conds = append(conds, c)
	}
	cur.Conditions = conds
	return cur
}

// heartbeat renews the Lease and the Ready condition every interval until
// ctx ends. Failures are logged and retried after a second.
func (k *Kubelet) heartbeat(ctx context.Context, interval time.Duration) {
	for {
		next := interval
		if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("lease renewal failed", zap.Error(err))
			next = time.Second // e.g. kube-node-lease not created yet
		}
		if err := k.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("node status update failed", zap.Error(err))
			next = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

func (k *Kubelet) renewLease(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node for lease owner: %w", err)
		}
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      k.cfg.NodeName,
				Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(k.cfg.NodeName),
				LeaseDurationSeconds: ptr.To[int32](leaseDuration),
				RenewTime:            &now,
			},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create lease: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease: %w", err)
	}
	l.Spec.HolderIdentity = ptr.To(k.cfg.NodeName)
	l.Spec.LeaseDurationSeconds = ptr.To[int32](leaseDuration)
	l.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update lease: %w", err)
	}
	return nil
}

func (k *Kubelet) updateNodeStatus(ctx context.Context) error {
	nodes := k.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return k.registerNode(ctx)
	}
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	node.Status = mergeStatus(node.Status, k.nodeStatus(metav1.Now()))
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}
