package sandbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/datapath/rxbuf"
	"github.com/seine-net/seine/deploy"
)

// Real Nodes (Options.Kubelet): each Node runs the kubelet and containerd
// (with runc) built by `make node-tools`, as on a machine of its own. Next
// to its network namespace a Node gets a host name of its own (a UTS
// namespace: hostNetwork Pods see the Node's name, as on a real machine)
// and a private mount namespace, held by `sandbox node-init` (NodeInit),
// in which:
//
//   - /etc, /var and /opt are overlays whose upper directories live in the
//     Node's state directory, so the kubelet, containerd and the DaemonSet's
//     hostPath volumes write the Node's own /etc/cni/net.d, /opt/cni/bin,
//     /var/lib/seine, /var/log/pods, and nothing on the host;
//   - /var/lib/containerd and /var/lib/kubelet are bind mounts of plain
//     directories (containerd's overlay snapshots cannot sit on overlayfs);
//   - /run is a fresh tmpfs (so /run/netns, /run/containerd,
//     /var/run/openvswitch and /run/xtables.lock are the Node's own);
//   - /sys is a fresh sysfs of the Node's network namespace, with the
//     host's cgroup hierarchies moved back on top;
//   - the three sysctls the kubelet wants to differ from this host's
//     (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) read the
//     kubelet's values from bind-mounted files, so the kubelet, run with
//     protectKernelDefaults, changes nothing on the host;
//   - the whole tree is made rshared, as on a systemd host, so the
//     container runtime's HostToContainer mounts propagate.
//
// The Node's state directory is bind-mounted at nodeDirInNode, where its
// configuration files are read.
const nodeDirInNode = "/var/lib/seine-sandbox-node"

// kubeletSysctls are the values the kubelet's container manager requires
// with protectKernelDefaults (pkg/kubelet/cm, setupKernelTunables) that
// differ from this machine's defaults.
func kubeletSysctls() map[string]string {
	return map[string]string{
		"vm/overcommit_memory": "1",
		"kernel/panic":         "10",
		"kernel/panic_on_oops": "1",
	}
}

// realNodePaths are the host paths of a real Node's state.
type realNodePaths struct {
	dir string
}

func (p realNodePaths) overlay(name, part string) string {
	return filepath.Join(p.dir, "overlay", name, part)
}
func (p realNodePaths) containerdRoot() string { return filepath.Join(p.dir, "containerd") }
func (p realNodePaths) kubeletRoot() string    { return filepath.Join(p.dir, "kubelet") }
func (p realNodePaths) sysctlFile(key string) string {
	return filepath.Join(p.dir, "sysctl", strings.ReplaceAll(key, "/", "."))
}
func (p realNodePaths) readyFile() string   { return filepath.Join(p.dir, "node-init.ready") }
func (p realNodePaths) initPidfile() string { return filepath.Join(p.dir, "node-init.pid") }

// NodeInit sets up the mount namespace of a real Node whose state
// directory is dir, then writes its ready file and holds the namespace
// until ctx ends. It must run as the first process of a fresh, private
// mount namespace inside the Node's network namespace (`nsenter --net=...
// unshare --mount --propagation private -- sandbox node-init`).
func NodeInit(ctx context.Context, dir, hostname string, log *zap.Logger) error {
	p := realNodePaths{dir: dir}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("host name %s: %w", hostname, err)
	}
	mount := func(src, dst, fstype string, flags uintptr, data string) error {
		if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
			return fmt.Errorf("mount %s on %s (%s): %w", src, dst, fstype, err)
		}
		return nil
	}
	for _, d := range []string{"etc", "var", "opt"} {
		upper, work := p.overlay(d, "upper"), p.overlay(d, "work")
		opts := fmt.Sprintf("lowerdir=/%s,upperdir=%s,workdir=%s", d, upper, work)
		if err := mount("overlay", "/"+d, "overlay", 0, opts); err != nil {
			return err
		}
	}
	binds := [][2]string{
		{dir, nodeDirInNode},
		{p.containerdRoot(), "/var/lib/containerd"},
		{p.kubeletRoot(), "/var/lib/kubelet"},
	}
	for _, b := range binds {
		if err := os.MkdirAll(b[1], 0o755); err != nil {
			return err
		}
		if err := mount(b[0], b[1], "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for key := range kubeletSysctls() {
		if err := mount(p.sysctlFile(key), "/proc/sys/"+key, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	// A fresh sysfs shows the Node's own network devices; the cgroup
	// hierarchies under the old one are moved on top of it.
	cg := filepath.Join(nodeDirInNode, "cgroup-move")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return err
	}
	if err := mount("/sys/fs/cgroup", cg, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if err := mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return err
	}
	if err := mount(cg, "/sys/fs/cgroup", "", unix.MS_MOVE, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return err
	}
	if err := mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return err
	}
	// The host path of dir is under /run, hidden now: write through the
	// bind mount.
	if err := os.WriteFile(filepath.Join(nodeDirInNode, filepath.Base(p.readyFile())), []byte("ok\n"), 0o644); err != nil {
		return err
	}
	log.Info("node mount namespace ready", zap.String("dir", dir))
	<-ctx.Done()
	return nil
}

// cgroupHierarchies returns the mount points of the host's cgroup v1
// hierarchies (one per controller set, and name=systemd).
func cgroupHierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// ... mount point at field 5; after " - ": fstype source options.
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) >= 5 && len(g) >= 1 && g[0] == "cgroup" {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// createNodeCgroups creates the Node's cgroupRoot, /<node>, in every cgroup
// v1 hierarchy (the kubelet requires it to exist), with the cpuset of the
// root so tasks may join.
func createNodeCgroups(node string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, node)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// removeNodeCgroups kills every process left in the Node's cgroups (the
// containers of Pods, which live in network namespaces of their own) and
// removes the cgroups, deepest first.
func removeNodeCgroups(node string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var pids []int
	var dirs []string
	for _, h := range hs {
		root := filepath.Join(h, node)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			dirs = append(dirs, p)
			if b, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					var pid int
					if _, err := fmt.Sscanf(f, "%d", &pid); err == nil {
						pids = append(pids, pid)
					}
				}
			}
			return nil
		})
	}
	var errs []error
	if err := terminate(pids, 5*time.Second); err != nil {
		errs = append(errs, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 50; try++ {
			if err = unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

// ownNodeName matches the Node names of sandbox name.
func ownNodeName(name string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `-node-[0-9]+$`)
}

// nodeCgroupsOf returns the cgroupRoots of sandbox name's real Nodes that
// exist in the first cgroup hierarchy.
func nodeCgroupsOf(name string) []string {
	hs, err := cgroupHierarchies()
	if err != nil || len(hs) == 0 {
		return nil
	}
	re := ownNodeName(name)
	var out []string
	for _, h := range hs {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() && re.MatchString(e.Name()) && !slices.Contains(out, e.Name()) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// inNode runs argv in the real Node's network, mount and UTS namespaces
// (held by node-init).
func inNode(ctx context.Context, n Node, argv ...string) (string, error) {
	pid := readPid(realNodePaths{dir: n.Dir}.initPidfile())
	if pid == 0 {
		return "", fmt.Errorf("node %s: node-init is not running", n.Name)
	}
	full := append([]string{"nsenter", "-t", fmt.Sprint(pid), "-m", "-n", "-u", "--"}, argv...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on %s: %w: %s", strings.Join(argv, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ImageArchives are the images every real Node's containerd imports before
// its kubelet starts: Pods never pull (nothing here reaches a registry).
func (c *Cluster) imageArchives() []string {
	var out []string
	for _, img := range []string{"pause", "agnhost", "coredns", "busybox", "glibc-dns-testing", "nginx"} {
		out = append(out, filepath.Join(c.st.NodeBinDir, "images", img+".tar"))
	}
	return append(out, c.st.ImageArchive)
}

// prepareRealNode lays out n's state, creates its cgroupRoot, starts its
// node-init (mount namespace), containerd, imports the images and starts
// the kubelet.
func (c *Cluster) prepareRealNode(ctx context.Context, n *Node) error {
	// The host's part of `seine ovs run`, which cannot write it from the
	// Node's namespace (startOVS).
	if _, _, err := rxbuf.Ensure(rxbuf.DefaultMin); err != nil {
		return err
	}
	p := realNodePaths{dir: n.Dir}
	dirs := []string{p.containerdRoot(), p.kubeletRoot(), filepath.Join(n.Dir, "sysctl")}
	for _, d := range []string{"etc", "var", "opt"} {
		dirs = append(dirs, p.overlay(d, "upper"), p.overlay(d, "work"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for key, v := range kubeletSysctls() {
		if err := os.WriteFile(p.sysctlFile(key), []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	server := "https://" + controlPlaneIP + ":6443"
	if err := c.cp.WriteAdminKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), server); err != nil {
		return err
	}
	ca, err := os.ReadFile(c.cp.CACertFile())
	if err != nil {
		return err
	}
	files := map[string]string{
		"ca.crt":          string(ca),
		"containerd.toml": containerdConfig(n),
		"kubelet.yaml":    kubeletConfig(n),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(n.Dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := createNodeCgroups(n.Name); err != nil {
		return err
	}

	c.log.Info("starting node-init", zap.String("node", n.Name))
	if _, err := startDetached("", enterNsenter, filepath.Join(n.Dir, "node-init.log"), p.initPidfile(), nil,
		"nsenter", "--net="+netnsPath(n.NetNS), "--", "unshare", "--mount", "--uts", "--propagation", "private", "--",
		c.st.SandboxBinary, "node-init", "--dir", n.Dir, "--hostname", n.Name); err != nil {
		return fmt.Errorf("node-init: %w", err)
	}
	if err := waitFor(ctx, 30*time.Second, 50*time.Millisecond, "node-init of "+n.Name, func(context.Context) (bool, error) {
		if !pidfileAlive(p.initPidfile()) {
			return false, backoffStop{fmt.Errorf("node-init exited:\n%s", tail(filepath.Join(n.Dir, "node-init.log"), 20))}
		}
		_, err := os.Stat(p.readyFile())
		return err == nil, nil
	}); err != nil {
		return err
	}
	enter := []string{"nsenter", "-t", fmt.Sprint(readPid(p.initPidfile())), "-m", "-n", "-u", "--"}
	env := []string{"PATH=" + c.st.NodeBinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

	c.log.Info("starting containerd", zap.String("node", n.Name))
	if _, err := startDetached("", enterNsenter, filepath.Join(n.Dir, "containerd.log"), filepath.Join(n.Dir, "containerd.pid"), env,
		append(enter, filepath.Join(c.st.NodeBinDir, "containerd"), "--config", nodeDirInNode+"/containerd.toml")...); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	ctr := func(args ...string) (string, error) {
		return inNode(ctx, *n, append([]string{filepath.Join(c.st.NodeBinDir, "ctr"), "--namespace", "k8s.io"}, args...)...)
	}
	if err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "containerd of "+n.Name, func(context.Context) (bool, error) {
		if !pidfileAlive(filepath.Join(n.Dir, "containerd.pid")) {
			return false, backoffStop{fmt.Errorf("containerd exited:\n%s", tail(filepath.Join(n.Dir, "containerd.log"), 20))}
		}
		_, err := ctr("version")
		return err == nil, err
	}); err != nil {
		return err
	}
	for _, a := range c.imageArchives() {
		if _, err := ctr("images", "import", a); err != nil {
			return fmt.Errorf("import %s: %w", a, err)
		}
	}

	c.log.Info("starting kubelet", zap.String("node", n.Name))
	if _, err := startDetached("", enterNsenter, n.KubeletLogPath, filepath.Join(n.Dir, "kubelet.pid"), env,
		append(enter, filepath.Join(c.st.NodeBinDir, "kubelet"),
			"--config="+nodeDirInNode+"/kubelet.yaml",
			"--kubeconfig="+nodeDirInNode+"/kubelet.kubeconfig",
			"--hostname-override="+n.Name,
			"--node-ip="+n.IP,
			"--v=1")...); err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	return nil
}

// containerdConfig is a real Node's containerd configuration (containerd
// v2 configuration version 4): CRI with runc and cgroupfs, pause pinned,
// and the oom_score_adj restriction this machine needs (root here lacks
// CAP_SYS_RESOURCE, see docs/sandbox.md).
func containerdConfig(n *Node) string {
	return fmt.Sprintf(`version = 4
root = '/var/lib/containerd'
state = '/run/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10.2'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '%s'
    stream_server_port = '0'
  [plugins.'io.containerd.server.v1.grpc']
    address = '/run/containerd/containerd.sock'
`, n.IP)
}

// kubeletConfig is a real Node's KubeletConfiguration: cgroupfs on this
// host's cgroup v1 under the Node's own cgroupRoot, no host sysctl changes
// (protectKernelDefaults with the values bind-mounted by NodeInit), the
// limits of this machine (oomScoreAdj, maxOpenFiles), no evictions or image
// garbage collection over host-wide figures, and webhook authentication
// and authorization against the API server.
func kubeletConfig(n *Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /%s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
maxOpenFiles: 10000
protectKernelDefaults: true
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: ""
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, n.Name, n.IP, nodeDirInNode, ClusterDNS)
}

// upRealNodes brings up real Nodes and installs Seine on them the way a
// user does: `kubectl apply -f` of its manifest. It returns once every Node
// is Ready and Seine's DaemonSet is ready on each.
func (c *Cluster) upRealNodes(ctx context.Context) error {
	if err := writeManifest(c.st.Manifest, deploy.Values{}); err != nil {
		return err
	}
	for i := range c.st.Nodes {
		if err := c.prepareRealNode(ctx, &c.st.Nodes[i]); err != nil {
			return fmt.Errorf("node %s: %w", c.st.Nodes[i].Name, err)
		}
	}
	if err := c.save(); err != nil {
		return err
	}
	c.log.Info("waiting for the kubelets to register")
	cidrs, err := c.waitNodes(ctx, 90*time.Second, false)
	if err != nil {
		return err
	}
	// The control plane reaches Pods as on a cluster whose control-plane
	// hosts route to the Pod network: through each Node. The API server
	// proxies to Pods (pods/proxy, services/proxy), and the e2e suite,
	// run from there, reads its probes' results that way.
	for _, n := range c.st.Nodes {
		if _, err := run(ctx, nil, "ip", "-n", cpNS(c.st.Name), "route", "replace", cidrs[n.Name], "via", n.IP); err != nil {
			return fmt.Errorf("route to the Pods of %s: %w", n.Name, err)
		}
	}
	c.log.Info("installing seine: kubectl apply -f", zap.String("manifest", c.st.Manifest))
	if out, err := c.Kubectl(ctx, "apply", "-f", c.st.Manifest); err != nil {
		return fmt.Errorf("kubectl apply: %w", err)
	} else {
		c.log.Debug("kubectl apply", zap.String("output", out))
	}
	if err := c.WaitSeineDaemonSet(ctx, 3*time.Minute); err != nil {
		return err
	}
	return c.installClusterDNS(ctx)
}

// corednsManifest is the cluster DNS of real Nodes (manifests/coredns.yaml).
//
//go:embed manifests/coredns.yaml
var corednsManifest []byte

// ClusterDNS is the kube-dns Service address every real kubelet names.
const ClusterDNS = "10.96.0.10"

// installClusterDNS runs CoreDNS behind the kube-dns Service, a Pod like
// any other on Seine's network, and waits until it answers.
func (c *Cluster) installClusterDNS(ctx context.Context) error {
	path := filepath.Join(c.st.StateDir, "coredns.yaml")
	if err := os.WriteFile(path, corednsManifest, 0o644); err != nil {
		return err
	}
	c.log.Info("installing cluster DNS", zap.String("manifest", path))
	if _, err := c.Kubectl(ctx, "apply", "-f", path); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	if _, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=2m"); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	return nil
}

// WaitSeineDaemonSet waits until Seine's DaemonSet has an up-to-date,
// ready Pod on every Node, so has seine-ovs a ready one (up to date or not:
// it updates on delete only), and every Node is Ready (real kubelets
// only).
func (c *Cluster) WaitSeineDaemonSet(ctx context.Context, timeout time.Duration) error {
	err := waitFor(ctx, timeout, time.Second, "seine's DaemonSets", func(ctx context.Context) (bool, error) {
		for _, name := range []string{"seine-ovs", "seine"} {
			ds, err := c.Client().AppsV1().DaemonSets(SeineNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			st := ds.Status
			if st.ObservedGeneration < ds.Generation || st.DesiredNumberScheduled != int32(len(c.st.Nodes)) ||
				(name == "seine" && st.UpdatedNumberScheduled != st.DesiredNumberScheduled) || st.NumberReady != st.DesiredNumberScheduled {
				return false, fmt.Errorf("DaemonSet %s: %d desired, %d updated, %d ready", name, st.DesiredNumberScheduled,
					st.UpdatedNumberScheduled, st.NumberReady)
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	_, err = c.waitNodes(ctx, timeout, true)
	return err
}

// RealPodNetNS returns the path of a real Node's Pod's network namespace,
// /proc/<pid>/ns/net of one of its containers' processes, found in the
// kubelet's cgroups (cgroupfs driver, cgroupsPerQOS: <cgroupRoot>/kubepods/
// [burstable|besteffort/]pod<uid>/<container>/). The runtime's own path
// (/run/netns/cni-…) lives in the Node's mount namespace only.
func (c *Cluster) RealPodNetNS(pod *corev1.Pod) (string, error) {
	if !c.st.Kubelet {
		return "", errors.New("the sandbox has no real Nodes")
	}
	hs, err := cgroupHierarchies()
	if err != nil {
		return "", err
	}
	if pod.Spec.NodeName == "" {
		return "", fmt.Errorf("pod %s/%s: not scheduled", pod.Namespace, pod.Name)
	}
	uid := "pod" + string(pod.UID)
	for _, h := range hs { // the kubelet may leave named hierarchies out
		root := filepath.Join(h, pod.Spec.NodeName, "kubepods")
		for _, pattern := range []string{filepath.Join(root, uid, "*", "cgroup.procs"), filepath.Join(root, "*", uid, "*", "cgroup.procs")} {
			files, _ := filepath.Glob(pattern)
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					continue
				}
				if pid, _, _ := strings.Cut(string(b), "\n"); pid != "" {
					return filepath.Join("/proc", pid, "ns", "net"), nil
				}
			}
		}
	}
	return "", fmt.Errorf("pod %s/%s: no process in its cgroups (%s/kubepods)", pod.Namespace, pod.Name, pod.Spec.NodeName)
}

// RealNodes reports whether the sandbox runs real kubelets.
func (c *Cluster) RealNodes() bool { return c.st.Kubelet }

// Manifest is the path of Seine's manifest rendered for the sandbox.
func (c *Cluster) Manifest() string { return c.st.Manifest }

// Kubectl runs the sandbox's kubectl (v1.36, `make node-tools`) with the
// admin kubeconfig, from the control plane's namespace, and returns its
// combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	kubectl := filepath.Join(c.st.NodeBinDir, "kubectl")
	if c.st.NodeBinDir == "" {
		kubectl = "kubectl"
	}
	argv := append([]string{"nsenter", "--net=" + netnsPath(cpNS(c.st.Name)), "--", kubectl,
		"--kubeconfig", c.st.InternalKubeconfig}, args...)
	return run(ctx, nil, argv...)
}

// NodeCtr runs ctr against a real Node's containerd, in the k8s.io
// namespace (the CRI's images and containers).
func (c *Cluster) NodeCtr(ctx context.Context, node string, args ...string) ([]byte, error) {
	return c.NodeExec(ctx, node, append([]string{filepath.Join(c.st.NodeBinDir, "ctr"), "--namespace", "k8s.io"}, args...)...)
}
