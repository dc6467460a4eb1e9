package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/seine-net/seine/node/cmd"
	"github.com/seine-net/seine/node/cni/install"
	"github.com/seine-net/seine/node/config"
)

// TestCommittedManifestIsCurrent fails when deploy/seine.yaml differs from
// what its template renders: run `make manifests`.
func TestCommittedManifestIsCurrent(t *testing.T) {
	want, err := Render(DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("seine.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/seine.yaml is stale: run `make manifests` and commit the result")
	}
}

// documents splits a manifest into its non-empty documents.
func documents(t *testing.T, manifest []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
}

func stripComments(b []byte) []byte {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// TestManifestObjects decodes every object strictly (unknown or duplicate
// fields fail) and checks what the DaemonSet promises: the image and
// namespace of the values everywhere, probes on the daemon's health port,
// host network and the host's DNS resolver, node-critical priority,
// tolerating every taint, and a ConfigMap the daemon itself accepts.
func TestManifestObjects(t *testing.T) {
	v := DefaultValues()
	v.Image = "registry.example/seine:v9"
	v.Namespace = "net"
	v.OVSDatapathType = "netdev"
	v.KubeAPIServerOverride = "https://198.18.0.1:6443"
	v.ProxyAll = true
	v.ClusterCIDR = "10.245.0.0/16"
	m, err := Render(v)
	if err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	kinds := map[string]int{}
	dss := map[string]*appsv1.DaemonSet{}
	var cm *corev1.ConfigMap
	vaps := map[string]*admissionregistrationv1.ValidatingAdmissionPolicy{}
	bindings := map[string]*admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	for _, d := range documents(t, m) {
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(d, &u.Object); err != nil {
			t.Fatalf("document %q: %v", d, err)
		}
		kinds[u.GetKind()]++
		if u.GetKind() == "CustomResourceDefinition" {
			if u.GetAPIVersion() != "apiextensions.k8s.io/v1" || !strings.HasSuffix(u.GetName(), ".seine.io") {
				t.Errorf("CRD %s/%s", u.GetAPIVersion(), u.GetName())
			}
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode(d, nil, nil)
		if err != nil {
			t.Fatalf("strict decoding %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if ns := u.GetNamespace(); u.GetKind() != "Namespace" && !clusterScoped(obj) && ns != v.Namespace {
			t.Errorf("%s %s is in namespace %q, want %q", u.GetKind(), u.GetName(), ns, v.Namespace)
		}
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			dss[o.Name] = o
		case *corev1.ConfigMap:
			cm = o
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			vaps[o.Name] = o
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			bindings[o.Name] = o
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"} {
		if kinds[k] != 1 {
			t.Errorf("%d objects of kind %s, want 1", kinds[k], k)
		}
	}
	// seine, and Open vSwitch apart so that it outlives seine's updates.
	if kinds["DaemonSet"] != 2 {
		t.Errorf("%d DaemonSets, want 2 (seine, seine-ovs)", kinds["DaemonSet"])
	}
	// The daemon's, and the two aggregated into the default user roles.
	if kinds["ClusterRole"] != 3 {
		t.Errorf("%d ClusterRoles, want 3 (seine, seine-view, seine-traceflow)", kinds["ClusterRole"])
	}
	crds, _ := filepath.Glob("crds/*.yaml")
	if kinds["CustomResourceDefinition"] != len(crds) || len(crds) == 0 {
		t.Errorf("%d CRDs in the manifest, %d in deploy/crds", kinds["CustomResourceDefinition"], len(crds))
	}
	ds, ovsDS := dss["seine"], dss["seine-ovs"]
	if ds == nil || ovsDS == nil || cm == nil {
		t.Fatal("no DaemonSet seine or seine-ovs, or no ConfigMap")
	}

	// The ConfigMap is a configuration the daemon accepts, with the values.
	cfg := loadConfigMap(t, *cm)
	if cfg.ClusterCIDR != v.ClusterCIDR || cfg.OVSDatapathType != "netdev" || !cfg.ProxyAllEnabled() ||
		cfg.KubeAPIServerOverride != v.KubeAPIServerOverride || cfg.LeaderElection.Namespace != v.Namespace {
		t.Errorf("configuration does not carry the values: %+v", cfg)
	}

	// The admission policies apply to the daemon's ServiceAccount in this
	// namespace, each is bound and denies, and the leader's reads the
	// ControllerInfo named after the daemon's Lease.
	sa := "'system:serviceaccount:" + v.Namespace + ":seine'"
	if len(vaps) != 2 || len(bindings) != 2 {
		t.Errorf("admission policies %d, bindings %d: want 2 of each", len(vaps), len(bindings))
	}
	for _, name := range []string{"seine-node-identity", "seine-leader-writes"} {
		p, b := vaps[name], bindings[name]
		if p == nil || b == nil {
			t.Fatalf("admission policy %s or its binding missing", name)
		}
		if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, sa) {
			t.Errorf("policy %s does not match the ServiceAccount %s: %+v", name, sa, p.Spec.MatchConditions)
		}
		if b.Spec.PolicyName != name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
			t.Errorf("binding %s: policy %q, actions %v", name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
	}
	if ref := bindings["seine-leader-writes"].Spec.ParamRef; ref == nil || ref.Name != cfg.LeaderElection.Name ||
		ref.ParameterNotFoundAction == nil || *ref.ParameterNotFoundAction != admissionregistrationv1.DenyAction {
		t.Errorf("seine-leader-writes reads %+v, the ControllerInfo is %s", ref, cfg.LeaderElection.Name)
	}
	if pk := vaps["seine-leader-writes"].Spec.ParamKind; pk == nil || pk.Kind != "ControllerInfo" || pk.APIVersion != "ops.seine.io/v1alpha1" {
		t.Errorf("seine-leader-writes parameter kind %+v, want ops.seine.io/v1alpha1 ControllerInfo", pk)
	}

	for _, d := range []*appsv1.DaemonSet{ds, ovsDS} {
		spec := d.Spec.Template.Spec
		if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" {
			t.Errorf("%s: hostNetwork %v, priorityClassName %q", d.Name, spec.HostNetwork, spec.PriorityClassName)
		}
		// Cluster DNS needs the network these Pods bring up: the daemon
		// resolves names (a kubeAPIServerOverride host) with the host's
		// resolver only.
		if spec.DNSPolicy != corev1.DNSDefault {
			t.Errorf("%s: dnsPolicy %q, want %q (the host's resolver)", d.Name, spec.DNSPolicy, corev1.DNSDefault)
		}
		if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
			t.Errorf("%s: tolerations %+v do not tolerate every taint", d.Name, spec.Tolerations)
		}
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if c.Image != v.Image {
				t.Errorf("container %s runs %s, want %s", c.Name, c.Image, v.Image)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("container %s has no resource requests", c.Name)
			}
			// Each writes host paths (install-cni the CNI directories) or
			// devices: an SELinux enforcing host lets only a privileged
			// container (spc_t) do that.
			if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
				t.Errorf("container %s is not privileged", c.Name)
			}
		}
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 1 {
		t.Errorf("seine update strategy %+v", ds.Spec.UpdateStrategy)
	}
	// Updating Seine must not restart the datapath: Open vSwitch is
	// replaced only when an operator deletes its Pod.
	if ovsDS.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("seine-ovs update strategy %+v, want OnDelete", ovsDS.Spec.UpdateStrategy)
	}
	if sel := ovsDS.Spec.Selector.MatchLabels; sel["app.kubernetes.io/name"] == ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] {
		t.Errorf("the two DaemonSets select the same Pods (%v)", sel)
	}
	spec, ovsSpec := ds.Spec.Template.Spec, ovsDS.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "install-cni" || spec.InitContainers[0].RestartPolicy != nil {
		t.Errorf("seine init containers %v: want install-cni", containerNames(spec.InitContainers))
	}
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "seine" {
		t.Errorf("seine containers %v, want seine", containerNames(spec.Containers))
	}
	if len(ovsSpec.InitContainers) != 0 || len(ovsSpec.Containers) != 1 || ovsSpec.Containers[0].Name != "openvswitch" {
		t.Errorf("seine-ovs containers %v, init %v: want openvswitch alone", containerNames(ovsSpec.Containers), containerNames(ovsSpec.InitContainers))
	}
	if a := ovsSpec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("seine-ovs mounts an API token it does not need")
	}
	seine, ovs := spec.Containers[0], ovsSpec.Containers[0]
	// The daemon's stop (shutdownGrace in node/agent: 25 s) fits its
	// grace period; Open vSwitch's waits for the daemon (30 s), hands
	// the transport back (30 s) and stops its two daemons (20 s, 10 s).
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 25 {
		t.Errorf("seine terminationGracePeriodSeconds %v: less than the daemon's stop", g)
	}
	if g := ovsSpec.TerminationGracePeriodSeconds; g == nil || *g < 30+30+30 {
		t.Errorf("seine-ovs terminationGracePeriodSeconds %v: less than OVS's stop", g)
	}
	if ovs.StartupProbe == nil || ovs.StartupProbe.Exec == nil {
		t.Errorf("openvswitch startup probe %+v", ovs.StartupProbe)
	}
	if seine.ReadinessProbe == nil || seine.ReadinessProbe.HTTPGet == nil || seine.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		seine.ReadinessProbe.HTTPGet.Port.IntValue() != DefaultMetricsPort {
		t.Errorf("seine readiness probe %+v", seine.ReadinessProbe)
	}
	if seine.LivenessProbe == nil || seine.LivenessProbe.HTTPGet == nil || seine.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("seine liveness probe %+v", seine.LivenessProbe)
	}
	if ovs.LivenessProbe == nil || ovs.LivenessProbe.Exec == nil {
		t.Errorf("openvswitch liveness probe %+v", ovs.LivenessProbe)
	}
	if !strings.HasSuffix(cfg.MetricsAddress, ":"+strconv.Itoa(DefaultMetricsPort)) {
		t.Errorf("metrics address %s is not on the probes' port %d", cfg.MetricsAddress, DefaultMetricsPort)
	}
}

// TestManifestTiesConfigKeys: the configuration keys docs/configuration.md
// calls "set by the manifest" agree with the rest of it: the CNI socket is
// where install-cni's conflist points and on the host, the OVS run
// directory, the data directory and the local API socket's are the host's
// and shared by the seine and openvswitch containers.
func TestManifestTiesConfigKeys(t *testing.T) {
	dss, cfg := renderDaemonSets(t, DefaultValues())
	ds, ovsDS := dss["seine"], dss["seine-ovs"]
	spec := ds.Spec.Template.Spec
	seine, ovs, initc := container(t, spec, "seine"), container(t, ovsDS.Spec.Template.Spec, "openvswitch"), container(t, spec, "install-cni")
	fromHost := func(c corev1.Container, dir string) bool {
		return hostMount(ds, c, dir) == dir || hostMount(ovsDS, c, dir) == dir
	}
	// install-cni writes the socket of the configuration it reads (or of
	// its --cni-socket).
	socket := install.DefaultOptions().SocketPath
	for _, a := range initc.Command {
		if strings.HasPrefix(a, "--config=") {
			socket = cfg.CNISocket
		}
	}
	for _, a := range initc.Command {
		if v, ok := strings.CutPrefix(a, "--cni-socket="); ok {
			socket = v
		}
	}
	if cfg.CNISocket != socket || !fromHost(seine, filepath.Dir(cfg.CNISocket)) {
		t.Errorf("cniSocket %s: install-cni writes %s into the conflist; the host's directory is mounted: %v",
			cfg.CNISocket, socket, fromHost(seine, filepath.Dir(cfg.CNISocket)))
	}
	// Open vSwitch waits, stopping, while the daemon answers on its local
	// API socket.
	for key, dir := range map[string]string{"ovsRunDir": cfg.OVSRunDir, "dataDir": cfg.DataDir, "apiSocket": filepath.Dir(cfg.APISocket)} {
		if !fromHost(seine, dir) || !fromHost(ovs, dir) {
			t.Errorf("%s %s is not the host's directory in both containers", key, dir)
		}
	}
}

// renderDaemonSets renders v and returns its DaemonSets by name and the
// configuration its ConfigMap gives the daemon (config.Load).
func renderDaemonSets(t *testing.T, v Values) (map[string]appsv1.DaemonSet, config.Config) {
	t.Helper()
	m, err := Render(v)
	if err != nil {
		t.Fatal(err)
	}
	dss := map[string]appsv1.DaemonSet{}
	var cm corev1.ConfigMap
	for _, d := range documents(t, m) {
		switch {
		case bytes.Contains(d, []byte("\nkind: DaemonSet\n")):
			var ds appsv1.DaemonSet
			err = utilyaml.UnmarshalStrict(d, &ds)
			dss[ds.Name] = ds
		case bytes.Contains(d, []byte("\nkind: ConfigMap\n")):
			err = utilyaml.UnmarshalStrict(d, &cm)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dss, loadConfigMap(t, cm)
}

// loadConfigMap returns the configuration the daemon reads from cm
// (config.Load, with NODE_NAME set), failing the test if it refuses it.
func loadConfigMap(t *testing.T, cm corev1.ConfigMap) config.Config {
	t.Helper()
	f := filepath.Join(t.TempDir(), "seine.yaml")
	if err := os.WriteFile(f, []byte(cm.Data["seine.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "n1")
	cfg, err := config.Load(f, nil)
	if err != nil {
		t.Fatalf("the ConfigMap's configuration: %v", err)
	}
	return cfg
}

// container returns the container (or init container) of spec named
// name, failing the test if there is none.
func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func containerNames(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// hostMount returns the host path container c sees at dir (a hostPath
// volume mounted there), or "".
func hostMount(ds appsv1.DaemonSet, c corev1.Container, dir string) string {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.HostPath != nil {
				return v.HostPath.Path
			}
		}
	}
	return ""
}

// TestNetworkPolicyOnlyManifest: rendered for networkPolicyOnly, the
// configuration names the mode and the primary's conflist; install-cni
// reads that configuration (so it chains seine into the conflist, which
// it sees under its host root, instead of writing seine's own), and the
// daemon sees the conflist at its host path, to keep itself in it.
func TestNetworkPolicyOnlyManifest(t *testing.T) {
	v := DefaultValues()
	v.TrafficEncapMode, v.PrimaryCNIConflist = "networkPolicyOnly", "/etc/cni/net.d/10-aws.conflist"
	dss, cfg := renderDaemonSets(t, v)
	ds := dss["seine"]
	if cfg.TrafficEncapMode != config.ModeNetworkPolicyOnly || cfg.PrimaryCNIConflist != v.PrimaryCNIConflist {
		t.Errorf("configuration: mode %q, primaryCNIConflist %q", cfg.TrafficEncapMode, cfg.PrimaryCNIConflist)
	}
	spec := ds.Spec.Template.Spec
	initc := container(t, spec, "install-cni")
	root := ""
	var configFile string
	for _, a := range initc.Command {
		if r, ok := strings.CutPrefix(a, "--host-root="); ok {
			root = r
		}
		if f, ok := strings.CutPrefix(a, "--config="); ok {
			configFile = f
		}
	}
	if configFile == "" || !slices.ContainsFunc(initc.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "config" && m.MountPath == filepath.Dir(configFile)
	}) {
		t.Errorf("install-cni does not read the ConfigMap's configuration: command %v, mounts %+v", initc.Command, initc.VolumeMounts)
	}
	if got := hostMount(ds, initc, filepath.Join(root, PrimaryCNIConfDir)); got != PrimaryCNIConfDir {
		t.Errorf("install-cni sees %s at %s, want the host's %s", got, filepath.Join(root, PrimaryCNIConfDir), PrimaryCNIConfDir)
	}
	for _, c := range spec.Containers {
		if c.Name == "seine" && hostMount(ds, c, PrimaryCNIConfDir) != PrimaryCNIConfDir {
			t.Errorf("the seine container does not see the host's %s", PrimaryCNIConfDir)
		}
	}

	for _, tc := range []struct{ mode, conflist, want string }{
		{"networkPolicyOnly", "", "primaryCNIConflist"},
		{"networkPolicyOnly", "/opt/cni/10-x.conflist", "/etc/cni/net.d"},
		{"networkPolicyOnly", "/etc/cni/net.d/../x.conflist", "primaryCNIConflist"},
		{"encap", "/etc/cni/net.d/10-x.conflist", "--traffic-mode networkPolicyOnly"},
		{"routed", "", "trafficEncapMode"},
	} {
		v := DefaultValues()
		v.TrafficEncapMode, v.PrimaryCNIConflist = tc.mode, tc.conflist
		if _, err := Render(v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("mode %q, conflist %q: %v, want an error naming %s", tc.mode, tc.conflist, err, tc.want)
		}
	}
}

func clusterScoped(o runtime.Object) bool {
	switch o.(type) {
	case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.Namespace,
		*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		return true
	}
	return false
}

// TestValuesValidate names each bad variable.
func TestValuesValidate(t *testing.T) {
	v := DefaultValues()
	v.Image = ""
	v.ClusterCIDR = "10.0.0.0/33"
	v.OVSDatapathType = "dpdk"
	v.KubeAPIServerOverride = "http://x"
	v.ImagePullPolicy = "Sometimes"
	v.Namespace = "Bad_NS"
	_, err := Render(v)
	if err == nil {
		t.Fatal("bad values rendered")
	}
	for _, key := range []string{"image:", "clusterCIDR", "ovsDatapathType", "kubeAPIServerOverride", "imagePullPolicy", "namespace"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %s", err, key)
		}
	}
}

// TestProxyAllNeedsAPIServer: without kube-proxy the in-cluster
// "kubernetes" Service address answers nothing until seine runs, so
// --proxy-all alone would render a daemon that never reaches the API
// server.
func TestProxyAllNeedsAPIServer(t *testing.T) {
	v := DefaultValues()
	v.ProxyAll = true
	_, err := Render(v)
	if err == nil {
		t.Fatal("proxyAll without kubeAPIServerOverride rendered")
	}
	for _, want := range []string{"proxyAll", "kubeAPIServerOverride", "--proxy-all", "--kube-apiserver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	v.KubeAPIServerOverride = "https://198.18.0.1:6443"
	if _, err := Render(v); err != nil {
		t.Errorf("proxyAll with kubeAPIServerOverride: %v", err)
	}
}

// TestWithoutDaemonSet renders the cluster-wide objects only.
func TestWithoutDaemonSet(t *testing.T) {
	v := DefaultValues()
	v.WithoutDaemonSet = true
	m, err := Render(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range documents(t, m) {
		if k := string(d); strings.Contains(k, "\nkind: DaemonSet") || strings.Contains(k, "\nkind: ConfigMap") {
			t.Errorf("document %q rendered without the DaemonSet", d[:min(len(d), 80)])
		}
	}
	if !bytes.Contains(m, []byte("kind: ClusterRole\n")) || !bytes.Contains(m, []byte("kind: CustomResourceDefinition")) {
		t.Error("RBAC or CRDs missing")
	}
}

// TestSystemdUnitVerifies runs `systemd-analyze verify` on deploy/seine.service
// in a scratch root holding this machine's system units and an executable
// at the unit's binary path, and checks that the unit's seine command lines
// name commands and flags that exist.
func TestSystemdUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	unit, err := os.ReadFile("seine.service")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy system units: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/seine"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/seine.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, "seine.service").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	app := cmd.NewApp()
	for _, line := range strings.Split(string(unit), "\n") {
		_, argv, ok := strings.Cut(line, "=/usr/local/bin/seine ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		args := strings.Fields(argv)
		c := app.Command(args[0])
		if c == nil {
			t.Errorf("%s: no command %q", line, args[0])
			continue
		}
		for _, a := range args[1:] {
			if name, ok := strings.CutPrefix(a, "--"); ok && !hasFlag(c.Flags, strings.SplitN(name, "=", 2)[0]) {
				t.Errorf("%s: command %s has no flag --%s", line, args[0], name)
			}
		}
	}
}

func hasFlag(flags []cli.Flag, name string) bool {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}
