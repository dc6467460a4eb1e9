package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"sigs.k8s.io/yaml"

	"github.com/seine-net/seine/datapath/rxbuf"
	"github.com/seine-net/seine/node/config"
)

// ovsSchema is where Debian's openvswitch-common installs the schema.
const ovsSchema = "/usr/share/openvswitch/vswitch.ovsschema"

// newNode lays out Node i's paths under the state directory, its address
// in transport subnet s. Paths stay short: unix socket paths are limited
// to 107 bytes.
func newNode(sandbox, stateDir string, i, s int) Node {
	dir := filepath.Join(stateDir, fmt.Sprintf("n%d", i))
	return Node{
		Name:           fmt.Sprintf("%s-node-%d", sandbox, i),
		Index:          i,
		NetNS:          nodeNS(sandbox, i),
		IP:             nodeIP(s, i),
		Subnet:         s,
		Dir:            dir,
		OVSRunDir:      filepath.Join(dir, "ovs"),
		CNISocket:      filepath.Join(dir, "cni.sock"),
		APISocket:      filepath.Join(dir, "api.sock"),
		CNIBinDir:      filepath.Join(dir, "cni", "bin"),
		CNIConfDir:     filepath.Join(dir, "cni", "net.d"),
		ConfigPath:     filepath.Join(dir, "seine.yaml"),
		LogPath:        filepath.Join(dir, "seine.log"),
		KubeletLogPath: filepath.Join(dir, "kubelet.log"),
	}
}

// prepareNode creates the Node's directories, installs the CNI plugin (in
// seine mode, also starts OVS) and starts the kubelet.
func (c *Cluster) prepareNode(ctx context.Context, n *Node) error {
	for _, d := range []string{n.OVSRunDir, n.CNIBinDir, n.CNIConfDir, filepath.Join(n.Dir, "cni", "cache"),
		filepath.Join(n.Dir, "seine"), filepath.Join(n.Dir, "ipam")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if c.st.CNIMode == CNIModeSeine && c.Mode() != config.ModeNetworkPolicyOnly {
		c.log.Info("installing seine CNI plugin", zap.String("node", n.Name))
		if _, err := run(ctx, nil, c.st.SeineBinary, "install-cni", "--cni-bin-dir", n.CNIBinDir,
			"--cni-conf-dir", n.CNIConfDir, "--cni-socket", n.CNISocket, "--plugin-dir", n.CNIBinDir, "--plugin-dir", "/usr/lib/cni"); err != nil {
			return fmt.Errorf("install CNI: %w", err)
		}
	}
	if c.st.CNIMode == CNIModeSeine {
		c.log.Info("starting Open vSwitch", zap.String("node", n.Name))
		if err := startOVS(ctx, n); err != nil {
			return err
		}
	}
	return c.startKubelet(n)
}

// startOVS starts the Node's ovsdb-server and ovs-vswitchd (userspace
// datapath) inside its namespace with every runtime file in OVSRunDir.
// ovs-vswitchd starts with userspace TSO on (seine's default for the
// netdev datapath, which the daemon only reads at start), as a Node's
// Open vSwitch does once seine has written the setting. It first raises
// this host's net.core.rmem_default as `seine ovs run` does on a Node
// (datapath/rxbuf): the setting is the initial network namespace's, which
// neither the Node's ovs-vswitchd nor its seine daemon can write from the
// Node's namespace, and the sandbox is their host.
func startOVS(ctx context.Context, n *Node) error {
	if _, _, err := rxbuf.Ensure(rxbuf.DefaultMin); err != nil {
		return err
	}
	d := n.OVSRunDir
	env := []string{"OVS_RUNDIR=" + d, "OVS_DBDIR=" + d, "OVS_LOGDIR=" + d}
	db := filepath.Join(d, "conf.db")
	sock := filepath.Join(d, "db.sock")
	steps := [][]string{
		{"ovsdb-tool", "create", db, ovsSchema},
		{"ip", "netns", "exec", n.NetNS, "ovsdb-server", db, "--remote=punix:" + sock,
			"--unixctl=" + filepath.Join(d, "ovsdb-server.ctl"),
			"--pidfile=" + filepath.Join(d, "ovsdb-server.pid"),
			"--log-file=" + filepath.Join(d, "ovsdb-server.log"), "--detach"},
		{"ovs-vsctl", "--db=unix:" + sock, "--no-wait", "init", "--",
			"set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true"},
		vswitchdArgv(n),
	}
	for _, argv := range steps {
		if _, err := run(ctx, env, argv...); err != nil {
			return fmt.Errorf("start OVS: %w", err)
		}
	}
	return nil
}

// vswitchdArgv is the command that starts n's ovs-vswitchd (detached).
func vswitchdArgv(n *Node) []string {
	d := n.OVSRunDir
	return []string{"ip", "netns", "exec", n.NetNS, "ovs-vswitchd", "unix:" + filepath.Join(d, "db.sock"),
		"--unixctl=" + filepath.Join(d, "ovs-vswitchd.ctl"),
		"--pidfile=" + filepath.Join(d, "ovs-vswitchd.pid"),
		"--log-file=" + filepath.Join(d, "ovs-vswitchd.log"),
		"--disable-system", "--detach"}
}

// RestartVSwitchd stops node's ovs-vswitchd with SIGTERM (SIGKILL after
// 10 s), as a package upgrade or a container restart does, and starts it
// again from the same database; the seine daemon keeps running and must
// notice on its own. Only in the sandbox's own CNI mode with processes
// (not real Nodes, where OVS runs in the DaemonSet's Pod).
func (c *Cluster) RestartVSwitchd(ctx context.Context, node string) error {
	return c.RestartVSwitchdWithEnv(ctx, node, nil)
}

// RestartVSwitchdWithEnv is RestartVSwitchd with env (KEY=value entries,
// e.g. LD_PRELOAD) added to the new ovs-vswitchd's environment.
func (c *Cluster) RestartVSwitchdWithEnv(ctx context.Context, node string, env []string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	if c.st.Kubelet || c.st.CNIMode != CNIModeSeine {
		return fmt.Errorf("restart ovs-vswitchd on %s: the sandbox does not run it", n.Name)
	}
	if err := stopPidfile(filepath.Join(n.OVSRunDir, "ovs-vswitchd.pid"), 10*time.Second); err != nil {
		return fmt.Errorf("restart ovs-vswitchd on %s: %w", n.Name, err)
	}
	d := n.OVSRunDir
	if _, err := run(ctx, append([]string{"OVS_RUNDIR=" + d, "OVS_DBDIR=" + d, "OVS_LOGDIR=" + d}, env...), vswitchdArgv(&n)...); err != nil {
		return fmt.Errorf("restart ovs-vswitchd on %s: %w", n.Name, err)
	}
	return nil
}

// startKubelet starts `sandbox kubelet` for n inside its namespace.
func (c *Cluster) startKubelet(n *Node) error {
	argv := []string{c.st.SandboxBinary, "kubelet",
		"--name", c.st.Name,
		"--node", n.Name,
		"--node-ip", n.IP,
		"--kubeconfig", c.st.InternalKubeconfig,
		"--cni-bin-dir", n.CNIBinDir,
		"--cni-conf-dir", n.CNIConfDir,
		"--cni-cache-dir", filepath.Join(n.Dir, "cni", "cache"),
		"--pod-state-dir", filepath.Join(c.st.StateDir, "pods"),
	}
	c.log.Info("starting kubelet", zap.String("node", n.Name))
	if _, err := startDetached(n.NetNS, enterNsenter, n.KubeletLogPath, filepath.Join(n.Dir, "kubelet.pid"), nil, argv...); err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	return nil
}

// writeBridgeConf writes the bridge-mode conflist for n: Debian's bridge
// plugin (gateway on cni0) with host-local IPAM over the Node's podCIDR
// (state kept in the Node's directory), then portmap.
func writeBridgeConf(n *Node, podCIDR string) error {
	b, err := hostLocalConflist("sandbox-bridge", map[string]any{
		"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
	}, podCIDR, *n)
	if err != nil {
		return err
	}
	return writeConflist(filepath.Join(n.CNIConfDir, "10-sandbox-bridge.conflist"), b)
}

// hostLocalConflist is a conflist of Debian's plugins: primary with
// host-local IPAM over podCIDR (state in the Node's directory, a default
// route via the gateway), then portmap.
func hostLocalConflist(name string, primary map[string]any, podCIDR string, n Node) ([]byte, error) {
	primary["ipam"] = map[string]any{
		"type":    "host-local",
		"ranges":  []any{[]any{map[string]any{"subnet": podCIDR}}},
		"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
		"dataDir": filepath.Join(n.Dir, "ipam"),
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       name,
		"plugins": []any{
			primary,
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode conflist %s: %w", name, err)
	}
	return append(b, '\n'), nil
}

// writeConflist replaces the file at p with b atomically.
func writeConflist(p string, b []byte) error {
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// seineKubeconfig is where n's daemon finds its credentials: the
// seine-system/seine ServiceAccount with a token bound to the Node n.
func seineKubeconfig(n *Node) string { return filepath.Join(n.Dir, "seine.kubeconfig") }

// seineConfig is the daemon configuration of n with overrides applied in
// order: the sandbox's Set, then set. Values are parsed as YAML scalars.
func (c *Cluster) seineConfig(n *Node, set map[string]string) ([]byte, error) {
	cfg := map[string]any{
		"nodeName":           n.Name,
		"kubeconfig":         seineKubeconfig(n),
		"ovsRunDir":          n.OVSRunDir,
		"ovsDatapathType":    "netdev",
		"transportInterface": "eth0",
		"clusterCIDR":        ClusterCIDR,
		"serviceCIDR":        ServiceCIDR,
		"cniSocket":          n.CNISocket,
		"apiSocket":          n.APISocket,
		"dataDir":            filepath.Join(n.Dir, "seine"),
		"logLevel":           "info",
		"trafficEncapMode":   string(c.Mode()),
	}
	if c.Mode() == config.ModeNetworkPolicyOnly {
		cfg["primaryCNIConflist"] = primaryConflist(n)
	}
	for _, m := range []map[string]string{c.st.Set, set} {
		for k, v := range m {
			var val any
			if err := yaml.Unmarshal([]byte(v), &val); err != nil {
				return nil, fmt.Errorf("--set %s=%s: value is not YAML: %w", k, v, err)
			}
			cfg[k] = val
		}
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode seine config: %w", err)
	}
	return b, nil
}

// startSeine writes n's configuration and starts `seine node` (with env
// added to its environment), then waits for its CNI socket.
func (c *Cluster) startSeine(ctx context.Context, n *Node, set map[string]string, env ...string) error {
	if c.st.CNIMode != CNIModeSeine {
		return fmt.Errorf("sandbox %s runs CNI mode %q, not seine", c.st.Name, c.st.CNIMode)
	}
	pidPath := filepath.Join(n.Dir, "seine.pid")
	if pidfileAlive(pidPath) {
		return fmt.Errorf("seine on %s is already running (pid %d)", n.Name, readPid(pidPath))
	}
	// A fresh token bound to the Node, as a seine Pod's would be: the
	// manifest's admission policies tell the instances apart by it.
	if err := c.cp.ServiceAccountKubeconfig(ctx, SeineNamespace, "seine", n.Name, seineKubeconfig(n)); err != nil {
		return fmt.Errorf("seine kubeconfig: %w", err)
	}
	b, err := c.seineConfig(n, set)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.ConfigPath, b, 0o644); err != nil {
		return fmt.Errorf("write seine config: %w", err)
	}
	_ = os.Remove(n.CNISocket) // a stale socket must not count as ready
	c.log.Info("starting seine", zap.String("node", n.Name), zap.String("config", n.ConfigPath))
	pid, err := startDetached(n.NetNS, enterIPNetNS, n.LogPath, pidPath, env, c.st.SeineBinary, "node", "--config", n.ConfigPath)
	if err != nil {
		return fmt.Errorf("seine: %w", err)
	}
	err = waitFor(ctx, 60*time.Second, 200*time.Millisecond, "seine CNI socket "+n.CNISocket, func(context.Context) (bool, error) {
		if !alive(pid) {
			return false, backoffStop{errors.New("seine exited; log:\n" + tail(n.LogPath, 30))}
		}
		_, err := os.Stat(n.CNISocket)
		return err == nil, nil
	})
	if err != nil && alive(pid) {
		return fmt.Errorf("%w; seine log:\n%s", err, tail(n.LogPath, 30))
	}
	return err
}

// StopSeine stops the seine daemon of node (name or index) with SIGTERM
// (SIGKILL after 10 s).
func (c *Cluster) StopSeine(node string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	if err := stopPidfile(filepath.Join(n.Dir, "seine.pid"), 10*time.Second); err != nil {
		return fmt.Errorf("stop seine on %s: %w", n.Name, err)
	}
	return nil
}

// StartSeine starts the seine daemon of node again, with set (key → YAML
// scalar) merged over the sandbox's configuration and env ("KEY=value")
// added to its environment, and waits for its CNI socket. It fails if the
// daemon is running.
func (c *Cluster) StartSeine(ctx context.Context, node string, set map[string]string, env ...string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	if err := c.startSeine(ctx, &n, set, env...); err != nil {
		return fmt.Errorf("start seine on %s: %w", n.Name, err)
	}
	return nil
}

// NodeProcesses reports which of the Node's processes are alive, by name:
// "kubelet", "seine", "ovsdb-server", "ovs-vswitchd" (only those the CNI
// mode uses); on a real Node "node-init", "containerd" and "kubelet" (seine
// and OVS run in its DaemonSet's Pod).
func (c *Cluster) NodeProcesses(n Node) map[string]bool {
	out := map[string]bool{"kubelet": pidfileAlive(filepath.Join(n.Dir, "kubelet.pid"))}
	if c.st.Kubelet {
		for _, p := range []string{"node-init", "containerd"} {
			out[p] = pidfileAlive(filepath.Join(n.Dir, p+".pid"))
		}
		return out
	}
	if c.st.CNIMode == CNIModeSeine {
		out["seine"] = pidfileAlive(filepath.Join(n.Dir, "seine.pid"))
		for _, p := range []string{"ovsdb-server", "ovs-vswitchd"} {
			out[p] = pidfileAlive(filepath.Join(n.OVSRunDir, p+".pid"))
		}
	}
	return out
}

// ControlPlaneProcesses reports the liveness of the control-plane
// components by their pidfiles.
func (c *Cluster) ControlPlaneProcesses() map[string]bool {
	out := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(c.st.StateDir, "cp", "run", "*.pid"))
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), ".pid")] = pidfileAlive(f)
	}
	return out
}
