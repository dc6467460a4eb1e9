// Package controlplane runs a real, single-node Kubernetes control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) for the
// Seine test sandbox. The components run as detached processes, optionally
// inside a named network namespace, so they outlive the CLI that started
// them; everything they need (certificates, kubeconfigs, etcd data, logs,
// pidfiles) lives under one state directory, which Stop removes.
//
// Layout of the state directory:
//
//	state.json              the Config and chosen ports (read by Load)
//	pki/                    ca.crt ca.key apiserver.crt/.key admin.crt/.key sa.key sa.pub
//	kubeconfig/             admin.kubeconfig (server https://ADVERTISE:PORT),
//	                        components.kubeconfig (server https://127.0.0.1:PORT)
//	etcd/                   etcd data directory
//	logs/NAME.log           stdout+stderr of each component
//	run/NAME.pid            pid of each component
package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults applied by Start to zero Config fields.
const (
	DefaultSecurePort       = 6443
	DefaultClusterCIDR      = "10.244.0.0/16"
	DefaultServiceCIDR      = "10.96.0.0/16"
	DefaultNodeCIDRMaskSize = 24
	// ServiceAccountIssuer is the "iss" claim of service account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
	// startTimeout caps Start even when ctx has no deadline.
	startTimeout = 3 * time.Minute
)

// Config describes the control plane to start.
type Config struct {
	// StateDir holds every file of the control plane, e.g.
	// /run/seine-sandbox/controlplane. Made absolute by Start. Required.
	StateDir string `json:"stateDir"`
	// BinDir holds etcd (also accepted under the names "v3" or "server"),
	// kube-apiserver, kube-controller-manager and kube-scheduler. Required.
	BinDir string `json:"binDir"`
	// NetNS is the name of a network namespace (/run/netns/NAME) to run
	// the components in via `ip netns exec NAME`; "" = the caller's.
	NetNS string `json:"netNS,omitempty"`
	// AdvertiseAddress is the IPv4 address kube-apiserver advertises (the
	// endpoint of the "kubernetes" Service) and the server of the admin
	// kubeconfig, e.g. 198.18.0.1. It must not be a loopback address.
	// Required.
	AdvertiseAddress string `json:"advertiseAddress"`
	// SecurePort is the kube-apiserver HTTPS port on 0.0.0.0; default 6443.
	SecurePort int `json:"securePort,omitempty"`
	// ExtraSANs are more IP addresses for the apiserver serving
	// certificate, e.g. a host-link address.
	ExtraSANs []string `json:"extraSANs,omitempty"`
	// ClusterCIDR is the pod address range nodes' podCIDRs are carved from
	// by kube-controller-manager; default 10.244.0.0/16.
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// NodeCIDRMaskSize is the prefix length of each node's podCIDR;
	// default 24.
	NodeCIDRMaskSize int `json:"nodeCIDRMaskSize,omitempty"`
	// ServiceCIDR is the ClusterIP range; default 10.96.0.0/16. Its first
	// address is the ClusterIP of the "kubernetes" Service.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
}

// ports are the loopback ports chosen at Start.
type ports struct {
	EtcdClient        int `json:"etcdClient"`
	EtcdPeer          int `json:"etcdPeer"`
	ControllerManager int `json:"controllerManager"`
	Scheduler         int `json:"scheduler"`
}

type state struct {
	Config Config `json:"config"`
	Ports  ports  `json:"ports"`
}

// ControlPlane is a started (or Loaded) control plane. It only holds paths
// and settings; the processes are independent of it.
type ControlPlane struct {
	cfg   Config
	ports ports
}

func (cfg *Config) applyDefaults() error {
	if cfg.StateDir == "" || cfg.BinDir == "" || cfg.AdvertiseAddress == "" {
		return errors.New("controlplane: StateDir, BinDir and AdvertiseAddress are required")
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("resolve state dir %q: %w", cfg.StateDir, err)
	}
	cfg.StateDir = abs
	if ip := net.ParseIP(cfg.AdvertiseAddress); ip == nil || ip.To4() == nil || ip.IsLoopback() {
		return fmt.Errorf("controlplane: advertise address %q must be a non-loopback IPv4 address", cfg.AdvertiseAddress)
	}
	for _, s := range cfg.ExtraSANs {
		if net.ParseIP(s) == nil {
			return fmt.Errorf("controlplane: extra SAN %q is not an IP address", s)
		}
	}
	if cfg.SecurePort == 0 {
		cfg.SecurePort = DefaultSecurePort
	}
	if cfg.ClusterCIDR == "" {
		cfg.ClusterCIDR = DefaultClusterCIDR
	}
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = DefaultServiceCIDR
	}
	if cfg.NodeCIDRMaskSize == 0 {
		cfg.NodeCIDRMaskSize = DefaultNodeCIDRMaskSize
	}
	for _, c := range []string{cfg.ClusterCIDR, cfg.ServiceCIDR} {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return fmt.Errorf("controlplane: bad CIDR %q: %w", c, err)
		}
	}
	return nil
}

func (cp *ControlPlane) path(elem ...string) string {
	return filepath.Join(append([]string{cp.cfg.StateDir}, elem...)...)
}

// Config returns the configuration with defaults applied.
func (cp *ControlPlane) Config() Config { return cp.cfg }

// StateDir returns the absolute state directory.
func (cp *ControlPlane) StateDir() string { return cp.cfg.StateDir }

// AdminKubeconfig returns the path of a kubeconfig with server
// https://ADVERTISE:PORT and an admin client certificate (group
// system:masters).
func (cp *ControlPlane) AdminKubeconfig() string { return cp.path("kubeconfig", "admin.kubeconfig") }

// CACertFile returns the path of the cluster CA certificate (PEM).
func (cp *ControlPlane) CACertFile() string { return cp.path("pki", "ca.crt") }

// LogFile returns the log path of a component: "etcd", "kube-apiserver",
// "kube-controller-manager" or "kube-scheduler".
func (cp *ControlPlane) LogFile(component string) string {
	return cp.path("logs", component+".log")
}

// Server returns the apiserver URL https://ADVERTISE:PORT.
func (cp *ControlPlane) Server() string {
	return "https://" + net.JoinHostPort(cp.cfg.AdvertiseAddress, strconv.Itoa(cp.cfg.SecurePort))
}

// Load reopens a control plane started under stateDir by reading its
// state.json. It does not check that the processes still run.
func Load(stateDir string) (*ControlPlane, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("resolve state dir %q: %w", stateDir, err)
	}
	b, err := os.ReadFile(filepath.Join(abs, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("load control plane: %w", err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(abs, "state.json"), err)
	}
	st.Config.StateDir = abs
	return &ControlPlane{cfg: st.Config, ports: st.Ports}, nil
}

// findBinary returns the path of the first of names present in dir.
func findBinary(dir string, names ...string) (string, error) {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("none of %v found as an executable in %s", names, dir)
}

// Start creates the state directory, generates a CA, the apiserver serving
// certificate, an admin client certificate, the service account key pair
// and kubeconfigs, then starts etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler as detached processes. It returns once /readyz of the
// apiserver answers "ok", the "default" Namespace exists and
// kube-controller-manager has created its "default" ServiceAccount. ctx
// bounds the whole wait, which is also capped at 3 minutes. Cancelling ctx
// after Start returned does not affect the processes.
//
// Start fails if StateDir already holds a state.json (call Stop first). If a
// component fails, Start kills the processes it started and returns an error
// naming the component with the tail of its log; the state directory is
// kept for inspection (Stop removes it).
func Start(ctx context.Context, cfg Config, log *zap.Logger) (*ControlPlane, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "state.json")); err == nil {
		return nil, fmt.Errorf("controlplane: %s already holds a control plane; Stop it first", cfg.StateDir)
	}
	bins := map[string]string{}
	for comp, names := range map[string][]string{
		"etcd":                    {"etcd", "v3", "server"},
		"kube-apiserver":          {"kube-apiserver"},
		"kube-controller-manager": {"kube-controller-manager"},
		"kube-scheduler":          {"kube-scheduler"},
	} {
		p, err := findBinary(cfg.BinDir, names...)
		if err != nil {
			return nil, fmt.Errorf("controlplane: binary of %s: %w", comp, err)
		}
		bins[comp] = p
	}
	for _, d := range []string{"pki", "kubeconfig", "etcd", "logs", "run"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create state dir: %w", err)
		}
	}
	pp, err := freeLoopbackPorts(cfg.NetNS, 4)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{cfg: cfg, ports: ports{EtcdClient: pp[0], EtcdPeer: pp[1], ControllerManager: pp[2], Scheduler: pp[3]}}
	if err := cp.writePKI(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(state{Config: cfg, Ports: cp.ports}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode state: %w", err)
	}
	if err := os.WriteFile(cp.path("state.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("write state: %w", err)
	}
	log = log.With(zap.String("state_dir", cfg.StateDir), zap.String("netns", cfg.NetNS))

	ok := false
	defer func() {
		if !ok {
			if err := stopProcesses(cfg.StateDir); err != nil {
				log.Warn("cleanup after failed start", zap.Error(err))
			}
		}
	}()

	var started []*process
	start := func(name string, args []string) error {
		p, err := startDetached(cfg.StateDir, cfg.NetNS, name, bins[name], args)
		if err != nil {
			return err
		}
		log.Info("component started", zap.String("component", name), zap.Int("pid", p.pid), zap.String("log", p.logPath))
		started = append(started, p)
		return nil
	}
	// wait polls cond every 250 ms until it returns true, an error, ctx
	// ends, or a started component exits.
	wait := func(what string, cond func(context.Context) (bool, error)) error {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		var last error
		for {
			for _, p := range started {
				select {
				case <-p.exited:
					return p.failure(fmt.Errorf("exited while waiting for %s: %v", what, p.waitErr))
				default:
				}
			}
			done, err := cond(ctx)
			if done {
				return nil
			}
			if err != nil {
				last = err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
			case <-t.C:
			}
		}
	}
	failed := func(name string, err error) error {
		for _, p := range started {
			if p.name == name {
				return p.failure(err)
			}
		}
		return err
	}

	t0 := time.Now()
	if err := start("etcd", cp.etcdArgs()); err != nil {
		return nil, err
	}
	httpc := &http.Client{Transport: &http.Transport{DialContext: dialFunc(cfg.NetNS)}, Timeout: 2 * time.Second}
	etcdHealth := fmt.Sprintf("http://127.0.0.1:%d/health", cp.ports.EtcdClient)
	if err := wait("etcd health", func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, etcdHealth, nil)
		resp, err := httpc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %s", resp.Status)
	}); err != nil {
		return nil, failed("etcd", err)
	}
	log.Info("etcd healthy", zap.Duration("elapsed", time.Since(t0)))

	if err := start("kube-apiserver", cp.apiserverArgs()); err != nil {
		return nil, err
	}
	// The components' kubeconfig points at 127.0.0.1, reachable inside
	// the namespace regardless of how AdvertiseAddress is routed.
	rc, err := cp.restConfig(cp.path("kubeconfig", "components.kubeconfig"))
	if err != nil {
		return nil, err
	}
	rc.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	if err := wait("kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, fmt.Errorf("%w: %s", err, body)
		}
		return string(body) == "ok", fmt.Errorf("readyz: %s", body)
	}); err != nil {
		return nil, failed("kube-apiserver", err)
	}
	log.Info("kube-apiserver ready", zap.Duration("elapsed", time.Since(t0)))

	if err := start("kube-controller-manager", cp.controllerManagerArgs()); err != nil {
		return nil, err
	}
	if err := start("kube-scheduler", cp.schedulerArgs()); err != nil {
		return nil, err
	}
	if err := wait("namespace default", func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err == nil, err
	}); err != nil {
		return nil, failed("kube-apiserver", err)
	}
	if err := wait("service account default/default", func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	}); err != nil {
		return nil, failed("kube-controller-manager", err)
	}
	log.Info("control plane ready", zap.Duration("elapsed", time.Since(t0)), zap.String("server", cp.Server()))
	ok = true
	return cp, nil
}

// RESTConfig returns a client configuration for the admin kubeconfig whose
// connections are made from inside Config.NetNS, so it works from a
// process in another network namespace.
func (cp *ControlPlane) RESTConfig() (*rest.Config, error) {
	return cp.restConfig(cp.AdminKubeconfig())
}

// ConfigFromKubeconfig loads the kubeconfig at path (e.g. one written by
// ServiceAccountKubeconfig) into a client configuration whose connections
// are made from inside Config.NetNS.
func (cp *ControlPlane) ConfigFromKubeconfig(path string) (*rest.Config, error) {
	return cp.restConfig(path)
}

func (cp *ControlPlane) restConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	if cp.cfg.NetNS != "" {
		rc.Dial = dialFunc(cp.cfg.NetNS)
	}
	rc.QPS = 100
	rc.Burst = 200
	return rc, nil
}

// clientset is a typed admin client dialing from inside Config.NetNS.
func (cp *ControlPlane) clientset() (*kubernetes.Clientset, *rest.Config, error) {
	rc, err := cp.RESTConfig()
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("admin client: %w", err)
	}
	return cs, rc, nil
}

// ensureNamespace creates namespace ns if it does not exist.
func ensureNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}
