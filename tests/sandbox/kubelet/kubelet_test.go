package kubelet

import (
	"errors"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodNetNSName(t *testing.T) {
	if got := PodNetNSName("sbx", "5f3a1b2c-aaaa-bbbb"); got != "seine-sbx-pod-5f3a1b2c" {
		t.Errorf("PodNetNSName = %q", got)
	}
}

// TestRuntimeConf checks the CNI arguments are those kubelet passes
// (CNI_ARGS keys, eth0, portMappings from hostPorts only, bandwidth from
// the annotations).
func TestRuntimeConf(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "p1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 8080, Protocol: corev1.ProtocolTCP},
			{ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		}}}},
	}
	rt := runtimeConf(pod, "uid-1", "cid", "/run/netns/x")
	if rt.IfName != "eth0" || rt.NetNS != "/run/netns/x" || rt.ContainerID != "cid" {
		t.Errorf("runtime conf %+v", rt)
	}
	args := map[string]string{}
	for _, kv := range rt.Args {
		args[kv[0]] = kv[1]
	}
	want := map[string]string{"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "ns1", "K8S_POD_NAME": "p1",
		"K8S_POD_INFRA_CONTAINER_ID": "cid", "K8S_POD_UID": "uid-1"}
	for k, v := range want {
		if args[k] != v {
			t.Errorf("arg %s = %q, want %q", k, args[k], v)
		}
	}
	pm, ok := rt.CapabilityArgs["portMappings"].([]map[string]any)
	if !ok || len(pm) != 1 || pm[0]["hostPort"] != int32(8080) || pm[0]["containerPort"] != int32(80) || pm[0]["protocol"] != "tcp" {
		t.Errorf("portMappings %#v", rt.CapabilityArgs["portMappings"])
	}
	if _, ok := rt.CapabilityArgs["bandwidth"]; ok {
		t.Errorf("bandwidth without annotations: %#v", rt.CapabilityArgs["bandwidth"])
	}

	pod.Annotations = map[string]string{"kubernetes.io/egress-bandwidth": "10M"}
	rt = runtimeConf(pod, "uid-1", "cid", "/run/netns/x")
	bw, ok := rt.CapabilityArgs["bandwidth"].(map[string]any)
	if !ok || len(bw) != 2 || bw["egressRate"] != int64(10_000_000) || bw["egressBurst"] != uint64(1<<32-1) {
		t.Errorf("bandwidth %#v", rt.CapabilityArgs["bandwidth"])
	}
}

func TestPodStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := &PodState{Namespace: "a", Name: "b", UID: "u", Node: "n", NetNS: "x", ContainerID: "c", IP: "10.244.0.5"}
	if err := writePodState(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPodState(dir, "a", "b")
	if err != nil || got.IP != st.IP || got.NetNS != st.NetNS {
		t.Fatalf("read back %+v, %v", got, err)
	}
	all, err := ListPodStates(dir)
	if err != nil || len(all) != 1 {
		t.Fatalf("list: %v, %v", all, err)
	}
	if err := removePodState(dir, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPodState(dir, "a", "b"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after remove: %v", err)
	}
}
