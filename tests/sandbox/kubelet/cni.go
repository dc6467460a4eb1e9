package kubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// NetNSDir is where `ip netns` keeps named network namespaces.
const NetNSDir = "/run/netns"

// PodNetNSName is the name of the network namespace of the Pod with uid in
// sandbox name: "seine-<name>-pod-<first 8 characters of uid>".
func PodNetNSName(sandbox string, uid string) string {
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return "seine-" + sandbox + "-pod-" + uid
}

// newContainerID returns a random 64-hex-digit ID like a runtime's
// sandbox container ID.
func newContainerID() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random container id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// addNetNS creates the named network namespace with lo up, replacing a
// leftover of the same name.
func addNetNS(ctx context.Context, name string) error {
	if _, err := os.Stat(filepath.Join(NetNSDir, name)); err == nil {
		if err := delNetNS(ctx, name); err != nil {
			return err
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("set lo up in %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// delNetNS deletes the named network namespace; a missing one is not an
// error.
func delNetNS(ctx context.Context, name string) error {
	if _, err := os.Stat(filepath.Join(NetNSDir, name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// loadConfList loads the first *.conflist (in lexical order) of the CNI
// configuration directory, as kubelet/containerd do. The error says the
// network is not ready when there is none.
func (k *Kubelet) loadConfList() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(k.cfg.CNIConfDir, []string{".conflist"})
	if err != nil {
		return nil, fmt.Errorf("read CNI config dir %s: %w", k.cfg.CNIConfDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("network not ready: no .conflist in %s", k.cfg.CNIConfDir)
	}
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		return nil, fmt.Errorf("load CNI config %s: %w", files[0], err)
	}
	return list, nil
}

func (k *Kubelet) cniConfig() *libcni.CNIConfig {
	paths := []string{}
	if k.cfg.CNIBinDir != "" {
		paths = append(paths, k.cfg.CNIBinDir)
	}
	paths = append(paths, k.cfg.ExtraCNIPaths...)
	return libcni.NewCNIConfigWithCacheDir(paths, k.cfg.CNICacheDir, nil)
}

// runtimeConf is what kubelet's CNI caller passes for a Pod sandbox:
// CNI_ARGS with the K8S_* keys, the portMappings capability from the
// containers' hostPorts and the bandwidth capability from the Pod's
// kubernetes.io/{ingress,egress}-bandwidth annotations (rates in bits/s;
// like containerd, a burst of 2^32-1 bits when the Pod gives none).
func runtimeConf(pod *corev1.Pod, uid, containerID, netnsPath string) *libcni.RuntimeConf {
	var mappings []map[string]any
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			m := map[string]any{"hostPort": p.HostPort, "containerPort": p.ContainerPort, "protocol": proto}
			if p.HostIP != "" {
				m["hostIP"] = p.HostIP
			}
			mappings = append(mappings, m)
		}
	}
	rt := &libcni.RuntimeConf{
		ContainerID: containerID,
		NetNS:       netnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", containerID},
			{"K8S_POD_UID", uid},
		},
		CapabilityArgs: map[string]any{},
	}
	if len(mappings) > 0 {
		rt.CapabilityArgs["portMappings"] = mappings
	}
	bw := map[string]any{}
	for key, field := range map[string]string{"kubernetes.io/ingress-bandwidth": "ingress", "kubernetes.io/egress-bandwidth": "egress"} {
		v, ok := pod.Annotations[key]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Value() <= 0 {
			continue // kubelet refuses such a Pod; the sandbox shapes nothing
		}
		bw[field+"Rate"] = q.Value()
		bw[field+"Burst"] = uint64(math.MaxUint32)
	}
	if len(bw) > 0 {
		rt.CapabilityArgs["bandwidth"] = bw
	}
	return rt
}

// cniAdd runs CNI ADD and returns the Pod's IPs (first one first).
func (k *Kubelet) cniAdd(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) ([]string, error) {
	res, err := k.cniConfig().AddNetworkList(ctx, list, rt)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD (network %s): %w", list.Name, err)
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert CNI result: %w", err)
	}
	var ips []string
	for _, ip := range cur.IPs {
		// Only addresses on the Pod's interface (or without interface
		// index) count as Pod IPs.
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(cur.Interfaces) &&
			cur.Interfaces[*ip.Interface].Sandbox == "" {
			continue
		}
		ips = append(ips, ip.Address.IP.String())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD (network %s) returned no Pod IP: %s", list.Name, resultString(cur))
	}
	return ips, nil
}

func resultString(r cnitypes.Result) string {
	var b strings.Builder
	_ = r.PrintTo(&b)
	return b.String()
}

// cniDel runs CNI DEL. The configuration is the current one or, when the
// directory no longer has one, the one libcni cached at ADD time.
func (k *Kubelet) cniDel(ctx context.Context, rt *libcni.RuntimeConf) error {
	cfg := k.cniConfig()
	list, err := k.loadConfList()
	if err != nil {
		cached, _, cerr := k.cachedConfList(cfg, rt)
		if cerr != nil {
			return fmt.Errorf("CNI DEL: no configuration: %w", err)
		}
		list = cached
	}
	if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
		return fmt.Errorf("CNI DEL (network %s): %w", list.Name, err)
	}
	return nil
}

func (k *Kubelet) cachedConfList(cfg *libcni.CNIConfig, rt *libcni.RuntimeConf) (*libcni.NetworkConfigList, *libcni.RuntimeConf, error) {
	atts, err := cfg.GetCachedAttachments(rt.ContainerID)
	if err != nil || len(atts) == 0 {
		return nil, nil, fmt.Errorf("no cached CNI attachment for %s: %v", rt.ContainerID, err)
	}
	list, err := libcni.ConfListFromBytes(atts[0].Config)
	if err != nil {
		return nil, nil, fmt.Errorf("parse cached CNI config: %w", err)
	}
	return list, rt, nil
}
