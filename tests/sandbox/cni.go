package sandbox

import (
	"context"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
)

// CNIClient calls a Node's CNI plugins through libcni the way kubelet's
// runtime does: from inside the Node's network namespace (the plugins it
// executes inherit it), with the Node's CNI bin dir and Debian's plugins on
// the path.
type CNIClient struct {
	node Node
	cni  *libcni.CNIConfig
	// List is the network configuration list used.
	List *libcni.NetworkConfigList
}

// CNI returns a client for node using conflist, or the Node's installed
// conflist when conflist is nil (10-seine.conflist; the primary's, seine
// chained in, in networkPolicyOnly mode).
func (c *Cluster) CNI(node string, conflist []byte) (*CNIClient, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	if conflist == nil {
		conflist, err = os.ReadFile(c.InstalledConflist(n))
		if err != nil {
			return nil, fmt.Errorf("installed conflist of %s: %w", n.Name, err)
		}
	}
	list, err := libcni.ConfListFromBytes(conflist)
	if err != nil {
		return nil, fmt.Errorf("parsing conflist: %w", err)
	}
	return &CNIClient{node: n, List: list,
		cni: libcni.NewCNIConfig([]string{n.CNIBinDir, "/usr/lib/cni"}, nil)}, nil
}

// RuntimeConf is the invocation of one attachment: container ID and netns
// path ("" when gone). It carries no Pod identity (no K8S_POD_NAME), as a
// runtime outside Kubernetes would call: there is no Pod object for the
// policy controller to acknowledge, so seine does not wait for
// NetworkPolicy realization (a Pod named by kubelet's CNI_ARGS must exist).
func RuntimeConf(containerID, netns string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID,
		NetNS:       netns,
		IfName:      "eth0",
		Args:        [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_INFRA_CONTAINER_ID", containerID}},
	}
}

func (cc *CNIClient) inNode(f func() error) error {
	nodeNS, err := ns.GetNS(netnsPath(cc.node.NetNS))
	if err != nil {
		return err
	}
	defer nodeNS.Close()
	return nodeNS.Do(func(ns.NetNS) error { return f() })
}

// Add runs CNI ADD.
func (cc *CNIClient) Add(ctx context.Context, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := cc.inNode(func() error {
		var err error
		res, err = cc.cni.AddNetworkList(ctx, cc.List, rt)
		return err
	})
	return res, err
}

// Del runs CNI DEL.
func (cc *CNIClient) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	return cc.inNode(func() error { return cc.cni.DelNetworkList(ctx, cc.List, rt) })
}

// Check runs CNI CHECK (the runtime passes the cached ADD result as
// prevResult).
func (cc *CNIClient) Check(ctx context.Context, rt *libcni.RuntimeConf) error {
	return cc.inNode(func() error { return cc.cni.CheckNetworkList(ctx, cc.List, rt) })
}

// Status runs CNI STATUS (spec 1.1.0 lists only).
func (cc *CNIClient) Status(ctx context.Context) error {
	return cc.inNode(func() error { return cc.cni.GetStatusNetworkList(ctx, cc.List) })
}

// GC runs CNI GC with the given attachments as the valid ones (spec 1.1.0
// lists only).
func (cc *CNIClient) GC(ctx context.Context, valid []types.GCAttachment) error {
	return cc.inNode(func() error {
		return cc.cni.GCNetworkList(ctx, cc.List, &libcni.GCArgs{ValidAttachments: valid})
	})
}
