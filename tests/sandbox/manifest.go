package sandbox

import (
	"fmt"
	"os"

	"github.com/seine-net/seine/deploy"
)

// SeineNamespace is the namespace of Seine's objects in the sandbox: the
// manifest's default.
const SeineNamespace = deploy.DefaultNamespace

// writeManifest renders Seine's installation manifest for this sandbox to
// path: the sandbox's Pod and Service ranges, the userspace datapath (the
// machine has no openvswitch module), the API server reached directly and
// seine replacing kube-proxy (the sandbox runs none). Non-empty fields of
// over replace those values (the image, for a DaemonSet install).
func writeManifest(path string, over deploy.Values) error {
	v := deploy.DefaultValues()
	v.ClusterCIDR = ClusterCIDR
	v.ServiceCIDR = ServiceCIDR
	v.OVSDatapathType = "netdev"
	v.KubeAPIServerOverride = "https://" + controlPlaneIP + ":6443"
	v.ProxyAll = true
	if over.Image != "" {
		v.Image = over.Image
	}
	if over.ImagePullPolicy != "" {
		v.ImagePullPolicy = over.ImagePullPolicy
	}
	b, err := deploy.Render(v)
	if err != nil {
		return fmt.Errorf("render seine's manifest: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write seine's manifest: %w", err)
	}
	return nil
}
