package kubelet

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// reasonSandboxFailed is the Event reason a real kubelet uses when CNI ADD
// fails while creating the Pod sandbox.
const reasonSandboxFailed = "FailedCreatePodSandBox"

func statusUpToDate(pod *corev1.Pod, rt *podRuntime) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP != rt.state.IP ||
		len(pod.Status.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setCondition replaces or appends a condition, keeping the transition
// time when the status does not change.
func setCondition(conds []corev1.PodCondition, c corev1.PodCondition) []corev1.PodCondition {
	for i := range conds {
		if conds[i].Type == c.Type {
			if conds[i].Status == c.Status {
				c.LastTransitionTime = conds[i].LastTransitionTime
			}
			conds[i] = c
			return conds
		}
	}
	return append(conds, c)
}

// writeRunningStatus reports the Pod Running and Ready with its IPs.
func (k *Kubelet) writeRunningStatus(ctx context.Context, pod *corev1.Pod, rt *podRuntime) error {
	now := metav1.Now()
	p := pod.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP = k.cfg.NodeIP
	p.Status.HostIPs = []corev1.HostIP{{IP: k.cfg.NodeIP}}
	p.Status.PodIP = rt.state.IP
	p.Status.PodIPs = nil
	for _, ip := range rt.state.IPs {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodScheduled,
		corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		p.Status.Conditions = setCondition(p.Status.Conditions,
			corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	p.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			ImageID:     c.Image,
			ContainerID: "seine-sandbox://" + rt.state.ContainerID,
			Ready:       true,
			Started:     ptr.To(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: *p.Status.StartTime}},
		})
	}
	if _, err := k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// recordSetupFailure reports a failed network setup as a Warning Event and
// as the PodReadyToStartContainers=False condition; errors doing so are
// only logged (the retry of the setup matters more).
func (k *Kubelet) recordSetupFailure(ctx context.Context, pod *corev1.Pod, cause error) {
	log := k.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name))
	now := metav1.NewTime(time.Now())
	msg := cause.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace,
			Name: pod.Name, UID: pod.UID},
		Reason:         reasonSandboxFailed,
		Message:        "Failed to create pod sandbox: " + msg,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "kubelet", Host: k.cfg.NodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if _, err := k.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		log.Warn("recording event failed", zap.Error(err))
	}
	p := pod.DeepCopy()
	p.Status.Phase = corev1.PodPending
	p.Status.Conditions = setCondition(p.Status.Conditions, corev1.PodCondition{
		Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse,
		Reason: reasonSandboxFailed, Message: msg, LastTransitionTime: now,
	})
	if _, err := k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		log.Warn("recording pod condition failed", zap.Error(err))
	}
}
