package kubelet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// PodState is what the kubelet records about one running Pod in
// <PodStateDir>/<namespace>_<name>.json, for the sandbox CLI and for its
// own restart (a restarted kubelet tears down Pods whose objects are gone).
type PodState struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	Node      string    `json:"node"`
	// NetNS is the name of the Pod's network namespace (under /run/netns);
	// empty for hostNetwork Pods, which share the Node's namespace.
	NetNS string `json:"netns,omitempty"`
	// ContainerID is the 64-hex-digit ID passed to CNI as CNI_CONTAINERID.
	ContainerID string `json:"containerID"`
	// IP is the Pod's first IP address from the CNI result.
	IP  string   `json:"ip"`
	IPs []string `json:"ips,omitempty"`
	// Ports are the container ports served, as "80/TCP".
	Ports []string `json:"ports,omitempty"`
	// HostNetwork is true for Pods running in the Node's namespace.
	HostNetwork bool `json:"hostNetwork,omitempty"`
}

// PodStateFile is the path of the state file of namespace/name in dir.
func PodStateFile(dir, namespace, name string) string {
	return filepath.Join(dir, namespace+"_"+name+".json")
}

// ReadPodState reads the state file of namespace/name; the error wraps
// os.ErrNotExist when the kubelet has no record of that Pod.
func ReadPodState(dir, namespace, name string) (*PodState, error) {
	b, err := os.ReadFile(PodStateFile(dir, namespace, name))
	if err != nil {
		return nil, fmt.Errorf("read pod state %s/%s: %w", namespace, name, err)
	}
	var st PodState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse pod state %s/%s: %w", namespace, name, err)
	}
	return &st, nil
}

// ListPodStates returns all state files in dir (any Node); unreadable files
// are skipped. A missing dir yields no states and no error.
func ListPodStates(dir string) ([]*PodState, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pod states: %w", err)
	}
	var out []*PodState
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var st PodState
		if json.Unmarshal(b, &st) == nil && st.Name != "" {
			out = append(out, &st)
		}
	}
	return out, nil
}

// writePodState writes st atomically (temporary file + rename).
func writePodState(dir string, st *PodState) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create pod state dir: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode pod state: %w", err)
	}
	final := PodStateFile(dir, st.Namespace, st.Name)
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("write pod state: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write pod state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write pod state: %w", err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write pod state: %w", err)
	}
	return nil
}

func removePodState(dir, namespace, name string) error {
	err := os.Remove(PodStateFile(dir, namespace, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pod state: %w", err)
	}
	return nil
}
