// Package sandbox assembles a multi-Node Kubernetes cluster on one machine
// from real parts, each started as in production, for Seine's end-to-end
// tests, `make sandbox` and the `sandbox` CLI:
//
//   - an underlay network namespace "seine-<name>-underlay" with one Linux
//     bridge per transport subnet s (br<s>, 198.18.s.0/24; one subnet
//     unless Options.Subnets says more) and a router between them
//     (198.18.s.254, plus 198.19.0.254/16 towards the external host);
//   - the control plane (package controlplane) in "seine-<name>-cp" at
//     198.18.0.1;
//   - Nodes "<name>-node-<i>" in "seine-<name>-node-<i>" at 198.18.s.(10+i),
//     split over the subnets in order, each with its own ovsdb-server and
//     ovs-vswitchd, the seine daemon (in the traffic mode Options.Mode)
//     and a minimal kubelet (package kubelet) that runs Pods as network
//     namespaces with echo servers;
//   - an external host "seine-<name>-ext" at 198.19.0.10/16 standing for the
//     Internet (no route to the Pod range);
//   - optionally a host veth "seine-<name>" (198.18.255.1/30 ↔ 198.18.255.2)
//     so kubectl on the host reaches the apiserver.
//
// Everything a sandbox owns is named after it (namespaces "seine-<name>-…",
// state under <StateRoot>/<name>), so Down finds it all, even after a crash.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/seine-net/seine/deploy"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox/controlplane"
	"github.com/seine-net/seine/tests/sandbox/kubelet"
)

// DefaultName is the sandbox name when none is given.
const DefaultName = "sbx"

// DefaultStateRoot is the parent of every sandbox's state directory.
const DefaultStateRoot = "/run/seine-sandbox"

// CNI modes.
const (
	// CNIModeSeine installs Seine (seine install-cni) and runs its daemon.
	CNIModeSeine = "seine"
	// CNIModeBridge uses Debian's bridge + host-local + portmap plugins
	// instead, to test the sandbox itself without Seine.
	CNIModeBridge = "bridge"
)

// Options configure Up.
type Options struct {
	// Name is the sandbox name (DNS-1123 label of at most 9 characters, so
	// that "seine-<name>" fits a 15-byte interface name); default "sbx".
	Name string
	// Nodes is the number of Nodes (1..200); default 1.
	Nodes int
	// Set holds overrides of the seine daemon configuration, key → YAML
	// scalar (e.g. "tunnelType" → "vxlan"), applied to every Node.
	Set map[string]string
	// SeineBinary is the seine executable; default $SEINE_BIN or "seine"
	// next to the running executable.
	SeineBinary string
	// SandboxBinary is the sandbox CLI (it provides the hidden kubelet
	// command); default $SEINE_SANDBOX_BIN, the running executable when it
	// is called "sandbox", or "sandbox" next to SeineBinary.
	SandboxBinary string
	// K8sBinDir holds the control-plane binaries; default $SEINE_K8S_BIN or
	// /root/.cache/seine/k8s-v1.36.3/bin.
	K8sBinDir string
	// StateRoot is the parent of the state directory; default
	// /run/seine-sandbox.
	StateRoot string
	// NodeCIDRMaskSize is the prefix length of each Node's podCIDR, as
	// kube-controller-manager allocates it; default 24.
	NodeCIDRMaskSize int
	// HostLink adds the host veth and a host kubeconfig.
	HostLink bool
	// CNIMode is CNIModeSeine (default) or CNIModeBridge.
	CNIMode string
	// Mode is seine's traffic mode (trafficEncapMode; default encap). In
	// networkPolicyOnly mode the Nodes' primary CNI is Debian's ptp with
	// host-local IPAM, seine chained after it (see modes.go).
	Mode config.TrafficEncapMode
	// Subnets is the number of transport subnets the Nodes are split over
	// (1..8, at most Nodes); default 1.
	Subnets int
	// Kubelet makes the Nodes real: the kubelet and containerd of `make
	// node-tools` in a mount namespace of each Node's own, and Seine
	// installed only by `kubectl apply` of its manifest (its image
	// imported into every Node's containerd). Requires CNIModeSeine.
	Kubelet bool
	// NodeBinDir holds the real Nodes' binaries and images/; default
	// $SEINE_NODE_BIN.
	NodeBinDir string
	// ImageArchive is Seine's image (`make image`); default
	// seine-image.tar next to SeineBinary.
	ImageArchive string
	// Log receives progress; default a no-op logger.
	Log *zap.Logger
}

// Node describes one sandbox Node.
type Node struct {
	// Name is the Node object's name, "<sandbox>-node-<i>".
	Name string `json:"name"`
	// Index is i (1-based).
	Index int `json:"index"`
	// NetNS is the Node's network namespace name.
	NetNS string `json:"netns"`
	// IP is the Node's underlay address (InternalIP).
	IP string `json:"ip"`
	// Subnet is the index of the Node's transport subnet (0-based).
	Subnet int `json:"subnet"`
	// Dir is the Node's state directory.
	Dir string `json:"dir"`
	// OVSRunDir holds db.sock, the OVS control sockets and <bridge>.mgmt.
	OVSRunDir string `json:"ovsRunDir"`
	// CNISocket is the seine daemon's CNI socket.
	CNISocket string `json:"cniSocket"`
	// APISocket is the seine daemon's local API socket (seinectl
	// --socket).
	APISocket string `json:"apiSocket"`
	// CNIBinDir and CNIConfDir are the Node's CNI directories.
	CNIBinDir  string `json:"cniBinDir"`
	CNIConfDir string `json:"cniConfDir"`
	// ConfigPath is the seine daemon configuration file.
	ConfigPath string `json:"configPath"`
	// LogPath is the seine daemon log; KubeletLogPath the kubelet's.
	LogPath        string `json:"logPath"`
	KubeletLogPath string `json:"kubeletLogPath"`
}

// state is what <state dir>/sandbox.json records.
type state struct {
	Name          string            `json:"name"`
	StateDir      string            `json:"stateDir"`
	CNIMode       string            `json:"cniMode"`
	Mode          string            `json:"mode,omitempty"`
	Subnets       int               `json:"subnets,omitempty"`
	HostLink      bool              `json:"hostLink"`
	SeineBinary   string            `json:"seineBinary,omitempty"`
	SandboxBinary string            `json:"sandboxBinary"`
	Set           map[string]string `json:"set,omitempty"`
	Nodes         []Node            `json:"nodes"`
	// Kubelet: real Nodes (see Options.Kubelet), with their binaries and
	// Seine's image archive.
	Kubelet      bool   `json:"kubelet,omitempty"`
	NodeBinDir   string `json:"nodeBinDir,omitempty"`
	ImageArchive string `json:"imageArchive,omitempty"`
	// Manifest is Seine's installation manifest rendered for the sandbox.
	Manifest string `json:"manifest,omitempty"`
	// Kubeconfig is <state>/kubeconfig: server on the host link when
	// HostLink, else the in-sandbox address (usable from any sandbox
	// namespace).
	Kubeconfig string `json:"kubeconfig"`
	// InternalKubeconfig is the admin kubeconfig with server 198.18.0.1.
	InternalKubeconfig string `json:"internalKubeconfig"`
}

// Cluster is a running (or loaded) sandbox.
type Cluster struct {
	st  state
	cp  *controlplane.ControlPlane
	log *zap.Logger

	mu     sync.Mutex
	client kubernetes.Interface
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidateName checks a sandbox name: a DNS-1123 label of 1..9 characters.
func ValidateName(name string) error {
	if len(name) > 9 || !nameRE.MatchString(name) {
		return fmt.Errorf("sandbox name %q: want 1..9 lowercase letters, digits or '-', starting and ending alphanumeric", name)
	}
	return nil
}

// StateDir is the state directory of sandbox name under stateRoot ("" =
// DefaultStateRoot).
func StateDir(name, stateRoot string) string {
	if stateRoot == "" {
		stateRoot = DefaultStateRoot
	}
	if name == "" {
		name = DefaultName
	}
	return filepath.Join(stateRoot, name)
}

func (o *Options) defaults() error {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if err := ValidateName(o.Name); err != nil {
		return err
	}
	if o.NodeCIDRMaskSize == 0 {
		o.NodeCIDRMaskSize = 24
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 1 || o.Nodes > 200 {
		return fmt.Errorf("nodes %d: want 1..200", o.Nodes)
	}
	if o.StateRoot == "" {
		o.StateRoot = DefaultStateRoot
	}
	abs, err := filepath.Abs(o.StateRoot)
	if err != nil {
		return fmt.Errorf("state root: %w", err)
	}
	o.StateRoot = abs
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.CNIMode == "" {
		o.CNIMode = CNIModeSeine
	}
	if o.CNIMode != CNIModeSeine && o.CNIMode != CNIModeBridge {
		return fmt.Errorf("CNI mode %q: want %q or %q", o.CNIMode, CNIModeSeine, CNIModeBridge)
	}
	if err := o.modeDefaults(); err != nil {
		return err
	}
	if o.K8sBinDir == "" {
		o.K8sBinDir = os.Getenv("SEINE_K8S_BIN")
	}
	if o.K8sBinDir == "" {
		o.K8sBinDir = "/root/.cache/seine/k8s-v1.36.3/bin"
	}
	exe, _ := os.Executable()
	if o.SeineBinary == "" {
		o.SeineBinary = os.Getenv("SEINE_BIN")
	}
	if o.SeineBinary == "" && exe != "" {
		o.SeineBinary = filepath.Join(filepath.Dir(exe), "seine")
	}
	if o.SandboxBinary == "" {
		o.SandboxBinary = os.Getenv("SEINE_SANDBOX_BIN")
	}
	if o.SandboxBinary == "" && exe != "" && filepath.Base(exe) == "sandbox" {
		o.SandboxBinary = exe
	}
	if o.SandboxBinary == "" && o.SeineBinary != "" {
		o.SandboxBinary = filepath.Join(filepath.Dir(o.SeineBinary), "sandbox")
	}
	if _, err := os.Stat(o.SandboxBinary); err != nil {
		return fmt.Errorf("sandbox binary %q (it runs the kubelets; set Options.SandboxBinary or $SEINE_SANDBOX_BIN): %w", o.SandboxBinary, err)
	}
	if o.CNIMode == CNIModeSeine {
		if _, err := os.Stat(o.SeineBinary); err != nil {
			return fmt.Errorf("seine binary %q (set Options.SeineBinary or $SEINE_BIN): %w", o.SeineBinary, err)
		}
	}
	if o.Kubelet {
		if o.CNIMode != CNIModeSeine {
			return fmt.Errorf("real kubelets run seine from its manifest: CNI mode %q is not supported with them", o.CNIMode)
		}
		if len(o.Set) > 0 {
			return errors.New("real kubelets read seine's configuration from the manifest's ConfigMap: --set is not supported with them")
		}
		if o.NodeBinDir == "" {
			o.NodeBinDir = os.Getenv("SEINE_NODE_BIN")
		}
		if o.ImageArchive == "" {
			o.ImageArchive = filepath.Join(filepath.Dir(o.SeineBinary), "seine-image.tar")
		}
		for _, f := range []string{filepath.Join(o.NodeBinDir, "kubelet"), filepath.Join(o.NodeBinDir, "images", "agnhost.tar"), o.ImageArchive} {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("real kubelets need `make node-tools image` (set $SEINE_NODE_BIN): %w", err)
			}
		}
	}
	for k := range o.Set {
		if k == "" || strings.ContainsAny(k, " =") {
			return fmt.Errorf("--set key %q is not a configuration key", k)
		}
	}
	return nil
}

func (c *Cluster) stateFile() string { return filepath.Join(c.st.StateDir, "sandbox.json") }

func (c *Cluster) save() error {
	b, err := json.MarshalIndent(c.st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode sandbox state: %w", err)
	}
	tmp := c.stateFile() + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write sandbox state: %w", err)
	}
	if err := os.Rename(tmp, c.stateFile()); err != nil {
		return fmt.Errorf("write sandbox state: %w", err)
	}
	return nil
}

// Up builds a sandbox: network, control plane, and Nodes that are Ready
// with podCIDRs (and, in seine mode, a running seine daemon whose CNI
// socket exists). It fails if a sandbox of that name exists. On failure it
// tears down what it made (Down) and returns the cause.
func Up(ctx context.Context, o Options) (_ *Cluster, err error) {
	if err := o.defaults(); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	dir := StateDir(o.Name, o.StateRoot)
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("sandbox up: %s exists: sandbox %q is up or was not torn down (run down)", dir, o.Name)
	}
	if left := listNetNS(o.Name); len(left) > 0 {
		return nil, fmt.Errorf("sandbox up: namespaces %v of sandbox %q exist (run down)", left, o.Name)
	}
	log := o.Log.With(zap.String("sandbox", o.Name))
	t0 := time.Now()
	if err := os.MkdirAll(filepath.Join(dir, "pods"), 0o755); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	c := &Cluster{log: log, st: state{
		Name: o.Name, StateDir: dir, CNIMode: o.CNIMode, Mode: string(o.Mode), Subnets: o.Subnets, HostLink: o.HostLink,
		SeineBinary: o.SeineBinary, SandboxBinary: o.SandboxBinary, Set: o.Set,
		Kubelet: o.Kubelet, NodeBinDir: o.NodeBinDir, ImageArchive: o.ImageArchive,
		Manifest:           filepath.Join(dir, "seine.yaml"),
		Kubeconfig:         filepath.Join(dir, "kubeconfig"),
		InternalKubeconfig: filepath.Join(dir, "admin.kubeconfig"),
	}}
	defer func() {
		if err != nil && os.Getenv("SEINE_SANDBOX_KEEP_ON_FAILURE") != "" {
			log.Warn("sandbox up failed; kept for debugging (SEINE_SANDBOX_KEEP_ON_FAILURE)", zap.Error(err))
			return
		}
		if err != nil {
			log.Warn("sandbox up failed, tearing down", zap.Error(err))
			if derr := Down(o.Name, o.StateRoot); derr != nil {
				log.Warn("teardown after failed up", zap.Error(derr))
			}
		}
	}()
	for i := 1; i <= o.Nodes; i++ {
		c.st.Nodes = append(c.st.Nodes, newNode(o.Name, dir, i, subnetOf(i, o.Nodes, o.Subnets)))
	}
	if err := c.save(); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}

	log.Info("building network", zap.Int("nodes", o.Nodes), zap.Int("subnets", o.Subnets), zap.String("mode", string(o.Mode)))
	if err := buildTopology(ctx, o.Name, o.Nodes, o.Subnets, o.HostLink); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}

	log.Info("starting control plane")
	cfg := controlplane.Config{
		StateDir: filepath.Join(dir, "cp"), BinDir: o.K8sBinDir, NetNS: cpNS(o.Name),
		AdvertiseAddress: controlPlaneIP, ClusterCIDR: ClusterCIDR, NodeCIDRMaskSize: o.NodeCIDRMaskSize,
		ServiceCIDR: ServiceCIDR,
	}
	if o.HostLink {
		cfg.ExtraSANs = []string{hostLinkCPIP}
	}
	cp, err := controlplane.Start(ctx, cfg, log.Named("controlplane"))
	if err != nil {
		return nil, fmt.Errorf("sandbox up: control plane: %w", err)
	}
	c.cp = cp
	server := "https://" + controlPlaneIP + ":6443"
	if err := cp.WriteAdminKubeconfig(c.st.InternalKubeconfig, server); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	if o.HostLink {
		server = "https://" + hostLinkCPIP + ":6443"
	}
	if err := cp.WriteAdminKubeconfig(c.st.Kubeconfig, server); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}

	if o.Kubelet {
		if err := c.upRealNodes(ctx); err != nil {
			return nil, fmt.Errorf("sandbox up: %w", err)
		}
		log.Info("sandbox up with real kubelets", zap.Duration("elapsed", time.Since(t0)), zap.String("kubeconfig", c.st.Kubeconfig))
		return c, nil
	}
	if o.CNIMode == CNIModeSeine {
		// Seine's installation manifest, rendered for this sandbox, without
		// its DaemonSet: the daemons run from the host binary, with the
		// manifest's Namespace, ServiceAccount, RBAC and CRDs.
		manifest := c.st.Manifest
		if err := writeManifest(manifest, deploy.Values{}); err != nil {
			return nil, fmt.Errorf("sandbox up: %w", err)
		}
		log.Info("applying seine's manifest without its DaemonSet", zap.String("file", manifest))
		if err := cp.ApplyExcept(ctx, []string{"DaemonSet"}, manifest); err != nil {
			return nil, fmt.Errorf("sandbox up: apply %s: %w", manifest, err)
		}
	}
	if err := c.save(); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}

	for i := range c.st.Nodes {
		if err := c.prepareNode(ctx, &c.st.Nodes[i]); err != nil {
			return nil, fmt.Errorf("sandbox up: node %s: %w", c.st.Nodes[i].Name, err)
		}
	}
	log.Info("waiting for nodes to register and get podCIDRs")
	cidrs, err := c.waitNodes(ctx, 90*time.Second, false)
	if err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	if err := c.routePodCIDRs(ctx, cidrs); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	for i := range c.st.Nodes {
		n := &c.st.Nodes[i]
		if o.CNIMode == CNIModeBridge {
			if err := writeBridgeConf(n, cidrs[n.Name]); err != nil {
				return nil, fmt.Errorf("sandbox up: node %s: %w", n.Name, err)
			}
			continue
		}
		if c.Mode() == config.ModeNetworkPolicyOnly {
			if err := c.installChained(ctx, n, cidrs[n.Name]); err != nil {
				return nil, fmt.Errorf("sandbox up: node %s: %w", n.Name, err)
			}
		}
		if err := c.startSeine(ctx, n, nil); err != nil {
			return nil, fmt.Errorf("sandbox up: node %s: %w", n.Name, err)
		}
	}
	if _, err := c.waitNodes(ctx, 60*time.Second, true); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	if err := c.save(); err != nil {
		return nil, fmt.Errorf("sandbox up: %w", err)
	}
	log.Info("sandbox up", zap.Duration("elapsed", time.Since(t0)), zap.String("kubeconfig", c.st.Kubeconfig))
	return c, nil
}

// waitNodes waits until every Node is registered with a podCIDR and, when
// ready, has Ready=True and a Lease; it returns the podCIDR of each Node.
func (c *Cluster) waitNodes(ctx context.Context, timeout time.Duration, ready bool) (map[string]string, error) {
	cidrs := map[string]string{}
	err := waitFor(ctx, timeout, 500*time.Millisecond, "nodes", func(ctx context.Context) (bool, error) {
		for _, n := range c.st.Nodes {
			if !pidfileAlive(filepath.Join(n.Dir, "kubelet.pid")) {
				return false, fmt.Errorf("kubelet of %s exited; log %s:\n%s", n.Name, n.KubeletLogPath, tail(n.KubeletLogPath, 20))
			}
			obj, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, fmt.Errorf("node %s: %w", n.Name, err)
			}
			if obj.Spec.PodCIDR == "" {
				return false, fmt.Errorf("node %s has no podCIDR yet", n.Name)
			}
			if ready && !nodeReady(obj) {
				return false, fmt.Errorf("node %s is not Ready", n.Name)
			}
			if ready {
				if _, err := c.Client().CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
					return false, fmt.Errorf("lease of node %s: %w", n.Name, err)
				}
			}
			cidrs[n.Name] = obj.Spec.PodCIDR
		}
		return true, nil
	})
	return cidrs, err
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Load opens the sandbox name under stateRoot ("" = defaults).
func Load(name, stateRoot string) (*Cluster, error) {
	dir := StateDir(name, stateRoot)
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox %q is not up (no %s): %w", filepath.Base(dir), dir, err)
		}
		return nil, fmt.Errorf("load sandbox: %w", err)
	}
	c := &Cluster{log: zap.NewNop()}
	if err := json.Unmarshal(b, &c.st); err != nil {
		return nil, fmt.Errorf("load sandbox: parse %s: %w", dir, err)
	}
	cp, err := controlplane.Load(filepath.Join(dir, "cp"))
	if err != nil {
		return nil, fmt.Errorf("load sandbox: %w", err)
	}
	c.cp = cp
	return c, nil
}

// SetLogger sets the logger of a loaded Cluster.
func (c *Cluster) SetLogger(log *zap.Logger) { c.log = log }

// Name is the sandbox name.
func (c *Cluster) Name() string { return c.st.Name }

// StateDir is the sandbox's state directory.
func (c *Cluster) StateDir() string { return c.st.StateDir }

// CNIMode is CNIModeSeine or CNIModeBridge.
func (c *Cluster) CNIMode() string { return c.st.CNIMode }

// Mode is the traffic mode the sandbox's seine daemons were started in.
func (c *Cluster) Mode() config.TrafficEncapMode {
	if c.st.Mode == "" {
		return config.ModeEncap
	}
	return config.TrafficEncapMode(c.st.Mode)
}

// Subnets is the number of transport subnets.
func (c *Cluster) Subnets() int { return max(c.st.Subnets, 1) }

// Kubeconfig is the path of <state>/kubeconfig: with the host link its
// server is https://198.18.255.2:6443 (usable from the host), otherwise
// https://198.18.0.1:6443 (usable from the sandbox namespaces only).
func (c *Cluster) Kubeconfig() string { return c.st.Kubeconfig }

// InternalKubeconfig is the admin kubeconfig for use inside the sandbox
// namespaces (server https://198.18.0.1:6443).
func (c *Cluster) InternalKubeconfig() string { return c.st.InternalKubeconfig }

// ControlPlane returns the control plane.
func (c *Cluster) ControlPlane() *controlplane.ControlPlane { return c.cp }

// BulkClient is an admin client, like Client, allowed qps requests a
// second (bursts of twice that), for creating thousands of objects; Client
// keeps client-go's default budget.
func (c *Cluster) BulkClient(qps float32) (kubernetes.Interface, error) {
	rc, err := c.cp.RESTConfig()
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = qps, int(2*qps)
	return kubernetes.NewForConfig(rc)
}

// Client is an admin client whose connections originate in the
// control-plane namespace, so it works from the host without host link.
func (c *Cluster) Client() kubernetes.Interface {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		return c.client
	}
	rc, err := c.cp.RESTConfig()
	if err == nil {
		c.client, err = kubernetes.NewForConfig(rc)
	}
	if err != nil {
		// Only a corrupt state directory gets here; a client that fails
		// every call reports it where it is used.
		c.log.Error("admin client", zap.Error(err))
		rc, _ = c.cp.ConfigFromKubeconfig(c.st.InternalKubeconfig)
		c.client = kubernetes.NewForConfigOrDie(rc)
	}
	return c.client
}

// SeineRESTConfig is a client configuration with the credentials the
// seine daemon of node (name or "<index>") runs with: the
// seine-system/seine ServiceAccount, its token bound to the Node.
// Connections originate in the control-plane namespace. Sandboxes with
// real kubelets have no such file (their seine Pods carry the kubelet's
// token).
func (c *Cluster) SeineRESTConfig(node string) (*rest.Config, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	return c.cp.ConfigFromKubeconfig(seineKubeconfig(&n))
}

// Nodes lists the sandbox's Nodes in index order.
func (c *Cluster) Nodes() []Node { return append([]Node(nil), c.st.Nodes...) }

// Node returns the Node named name (or "<index>").
func (c *Cluster) Node(name string) (Node, error) {
	for _, n := range c.st.Nodes {
		if n.Name == name || fmt.Sprint(n.Index) == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("sandbox %s has no node %q", c.st.Name, name)
}

// ExternalHost returns the external host's namespace name and address.
func (c *Cluster) ExternalHost() (netns, ip string) { return extNS(c.st.Name), externalIP }

// ControlPlaneNetNS is the control plane's namespace name.
func (c *Cluster) ControlPlaneNetNS() string { return cpNS(c.st.Name) }

// PodState returns the kubelet's record of a Pod (its netns, IP, Node).
func (c *Cluster) PodState(namespace, name string) (*kubelet.PodState, error) {
	return kubelet.ReadPodState(filepath.Join(c.st.StateDir, "pods"), namespace, name)
}

// ensureNamespace creates namespace ns if missing.
func (c *Cluster) ensureNamespace(ctx context.Context, ns string) error {
	_, err := c.Client().CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
