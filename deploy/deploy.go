// Package deploy renders Seine's installation manifest from its one source,
// seine.yaml.tmpl: the Namespace, ServiceAccount, RBAC, every
// CustomResourceDefinition of crds/ (controller-gen output), the ConfigMap
// holding the daemon's configuration (config.yaml.tmpl) and the DaemonSet.
//
// `make manifests` writes Render(DefaultValues()) to deploy/seine.yaml, and a
// test fails when that file is stale. The sandbox renders its own values
// (its API server address, the userspace datapath) the same way a user does
// with `go run ./deploy/render`.
package deploy

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path"
	"sort"
	"strings"
	"text/template"

	"k8s.io/apimachinery/pkg/util/validation"
)

//go:embed seine.yaml.tmpl config.yaml.tmpl crds/*.yaml
var sources embed.FS

// Image is the repository of Seine's image, and ImageTag the tag the
// committed manifest and `make image` use unless told otherwise. The tag is
// a version, never "latest" (which makes kubelets pull on every start).
const (
	ImageRepository = "ghcr.io/seine-net/seine"
	ImageTag        = "v0.1.0"
)

// PrimaryCNIConfDir is the host's CNI configuration directory, mounted
// into the install-cni and seine containers: in networkPolicyOnly mode
// the primary CNI's conflist must be there.
const PrimaryCNIConfDir = "/etc/cni/net.d"

// DefaultNamespace holds Seine's namespaced objects (and the controller's
// Lease) unless the values say otherwise.
const DefaultNamespace = "seine-system"

// LeaseName is the controller's Lease, and the ControllerInfo named after
// it (config leaderElection.name): the ConfigMap sets it, and the admission
// policy that lets only the leader write the computed policy state reads
// that ControllerInfo.
const LeaseName = "seine-controller"

// DefaultMetricsPort is the port of the daemon's /metrics, /healthz and
// /readyz (config metricsAddress).
const DefaultMetricsPort = 9345

// Values are the manifest's variables.
type Values struct {
	// Image is the seine image of every container, "repository:tag".
	Image string
	// ImagePullPolicy is IfNotPresent (default), Always or Never.
	ImagePullPolicy string
	// Namespace holds every namespaced object; default seine-system.
	Namespace string
	// ClusterCIDR is the cluster's Pod range (IPv4 CIDR).
	ClusterCIDR string
	// ServiceCIDR is the ClusterIP range (IPv4 CIDR).
	ServiceCIDR string
	// OVSDatapathType is system (kernel module) or netdev (userspace).
	OVSDatapathType string
	// KubeAPIServerOverride is the API server URL seine uses instead of the
	// in-cluster "kubernetes" Service; empty keeps in-cluster discovery.
	// Required in clusters without kube-proxy.
	KubeAPIServerOverride string
	// ProxyAll makes seine replace kube-proxy entirely (NodePorts,
	// externalIPs, LoadBalancer IPs, host traffic). Default false, which
	// fits a cluster that keeps kube-proxy. It needs
	// KubeAPIServerOverride.
	ProxyAll bool
	// TrafficEncapMode is the trafficEncapMode of every Node: encap
	// (default, also when empty), noEncap, hybrid or networkPolicyOnly.
	TrafficEncapMode string
	// PrimaryCNIConflist is, with networkPolicyOnly (and only then), the
	// primary CNI's conflist seine chains itself into: an absolute path
	// in PrimaryCNIConfDir, the host directory the manifest mounts.
	PrimaryCNIConflist string
	// WithoutDaemonSet leaves out the ConfigMap and the DaemonSet: the
	// cluster-wide objects only, for Nodes that run seine as a systemd
	// service (docs/install-bare-metal.md).
	WithoutDaemonSet bool
}

// DefaultValues are the values of the committed deploy/seine.yaml.
func DefaultValues() Values {
	return Values{
		Image:           ImageRepository + ":" + ImageTag,
		ImagePullPolicy: "IfNotPresent",
		Namespace:       DefaultNamespace,
		ClusterCIDR:     "10.244.0.0/16",
		ServiceCIDR:     "10.96.0.0/16",
		OVSDatapathType: "system",
	}
}

// Validate reports every bad value at once, each naming its variable.
func (v Values) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, a...)...))
	}
	if v.Image == "" || strings.ContainsAny(v.Image, " \t\n\"") {
		bad("image", "%q is not an image reference", v.Image)
	}
	switch v.ImagePullPolicy {
	case "IfNotPresent", "Always", "Never":
	default:
		bad("imagePullPolicy", "%q is not one of IfNotPresent, Always, Never", v.ImagePullPolicy)
	}
	for _, msg := range validation.IsDNS1123Label(v.Namespace) {
		bad("namespace", "%q: %s", v.Namespace, msg)
	}
	for key, c := range map[string]string{"clusterCIDR": v.ClusterCIDR, "serviceCIDR": v.ServiceCIDR} {
		if _, n, err := net.ParseCIDR(c); err != nil || n.IP.To4() == nil {
			bad(key, "%q is not an IPv4 CIDR", c)
		}
	}
	switch v.OVSDatapathType {
	case "system", "netdev":
	default:
		bad("ovsDatapathType", "%q is not one of system, netdev", v.OVSDatapathType)
	}
	if s := v.KubeAPIServerOverride; s != "" {
		if u, err := url.Parse(s); err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			bad("kubeAPIServerOverride", "%q is not an https://host[:port] URL", s)
		}
	}
	switch v.TrafficEncapMode {
	case "", "encap", "noEncap", "hybrid":
		if v.PrimaryCNIConflist != "" {
			bad("primaryCNIConflist", "only for trafficEncapMode networkPolicyOnly (--primary-cni-conflist needs --traffic-mode networkPolicyOnly)")
		}
	case "networkPolicyOnly":
		c := v.PrimaryCNIConflist
		if c == "" || path.Clean(c) != c || path.Dir(c) != PrimaryCNIConfDir || !strings.HasSuffix(c, ".conflist") {
			bad("primaryCNIConflist", "%q is not a .conflist file in %s, the directory the manifest mounts "+
				"(networkPolicyOnly needs --primary-cni-conflist)", c, PrimaryCNIConfDir)
		}
	default:
		bad("trafficEncapMode", "%q is not one of encap, noEncap, hybrid, networkPolicyOnly", v.TrafficEncapMode)
	}
	if v.ProxyAll && v.KubeAPIServerOverride == "" {
		bad("proxyAll", "needs kubeAPIServerOverride (--proxy-all needs --kube-apiserver): a cluster without "+
			"kube-proxy serves nothing at the in-cluster \"kubernetes\" Service address the daemon would dial")
	}
	return errors.Join(errs...)
}

// Render returns the manifest for v: a YAML stream of every object, in the
// order kubectl apply needs them (Namespace first, CRDs before nothing
// depends on them, the DaemonSet last).
func Render(v Values) ([]byte, error) {
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("manifest values: %w", err)
	}
	funcs := template.FuncMap{"indent": indent, "leaseName": func() string { return LeaseName }}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(sources, "seine.yaml.tmpl", "config.yaml.tmpl")
	if err != nil {
		return nil, fmt.Errorf("parsing the manifest templates: %w", err)
	}
	var cfg bytes.Buffer
	if err := tmpl.ExecuteTemplate(&cfg, "config.yaml.tmpl", v); err != nil {
		return nil, fmt.Errorf("rendering the configuration: %w", err)
	}
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(cfg.Bytes())
	data := struct {
		Values
		Config      string
		ConfigHash  string
		CRDs        []string
		MetricsPort int
	}{v, strings.TrimRight(cfg.String(), "\n"), hex.EncodeToString(sum[:8]), crds, DefaultMetricsPort}
	var out bytes.Buffer
	if err := tmpl.ExecuteTemplate(&out, "seine.yaml.tmpl", data); err != nil {
		return nil, fmt.Errorf("rendering the manifest: %w", err)
	}
	return out.Bytes(), nil
}

// CRDs returns the CustomResourceDefinition documents of crds/, sorted by
// file name, each starting with its "---" separator.
func CRDs() ([]string, error) {
	names, err := fs.Glob(sources, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, n := range names {
		b, err := sources.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", n, err)
		}
		doc := strings.TrimPrefix(strings.TrimSpace(string(b)), "---")
		out = append(out, "---\n# deploy/crds/"+path.Base(n)+" (controller-gen)\n"+strings.TrimSpace(doc))
	}
	return out, nil
}

// indent prefixes every non-empty line of s with n spaces.
func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "\n")
}
