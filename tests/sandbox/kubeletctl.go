package sandbox

import (
	"fmt"
	"path/filepath"
	"time"
)

// StopKubelet stops the sandbox kubelet of node (name or index) with
// SIGTERM (SIGKILL after 10 s). The Pods bound to the Node are then left
// alone, so a benchmark can run CNI commands for them itself; the Node's
// Lease stops being renewed.
func (c *Cluster) StopKubelet(node string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	if err := stopPidfile(filepath.Join(n.Dir, "kubelet.pid"), 10*time.Second); err != nil {
		return fmt.Errorf("stop kubelet on %s: %w", n.Name, err)
	}
	return nil
}
