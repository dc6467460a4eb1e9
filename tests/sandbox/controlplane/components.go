package controlplane

import (
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"time"
)

// firstServiceIP returns the first usable address of cidr (network + 1),
// which kube-apiserver assigns to the "kubernetes" Service.
func firstServiceIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("parse service CIDR %q: %w", cidr, err)
	}
	v := new(big.Int).SetBytes(n.IP)
	v.Add(v, big.NewInt(1))
	b := v.Bytes()
	ip := make(net.IP, len(n.IP))
	copy(ip[len(ip)-len(b):], b)
	return ip, nil
}

// writePKI generates and writes the CA, the apiserver serving certificate,
// the admin client certificate, the service account keys and the two
// kubeconfigs.
func (cp *ControlPlane) writePKI() error {
	now := time.Now()
	ca, err := newCA("seine-sandbox-ca", now)
	if err != nil {
		return err
	}
	if err := ca.writeFiles(cp.path("pki", "ca.crt"), cp.path("pki", "ca.key")); err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	svcIP, err := firstServiceIP(cp.cfg.ServiceCIDR)
	if err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(cp.cfg.AdvertiseAddress), svcIP}
	for _, s := range cp.cfg.ExtraSANs {
		ips = append(ips, net.ParseIP(s))
	}
	serving, err := ca.sign(leafSpec{
		commonName: "kube-apiserver",
		usage:      x509.ExtKeyUsageServerAuth,
		ips:        ips,
		dnsNames: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local", "localhost"},
	}, now)
	if err != nil {
		return err
	}
	if err := serving.writeFiles(cp.path("pki", "apiserver.crt"), cp.path("pki", "apiserver.key")); err != nil {
		return fmt.Errorf("apiserver certificate: %w", err)
	}
	// Kubernetes maps a client certificate's CN to the user name and O to
	// groups; system:masters is bound to cluster-admin and bypasses RBAC.
	admin, err := ca.sign(leafSpec{
		commonName:   "seine-sandbox-admin",
		organization: []string{"system:masters"},
		usage:        x509.ExtKeyUsageClientAuth,
	}, now)
	if err != nil {
		return err
	}
	if err := admin.writeFiles(cp.path("pki", "admin.crt"), cp.path("pki", "admin.key")); err != nil {
		return fmt.Errorf("admin certificate: %w", err)
	}
	if err := writeServiceAccountKeys(cp.path("pki", "sa.key"), cp.path("pki", "sa.pub")); err != nil {
		return err
	}
	if err := cp.WriteAdminKubeconfig(cp.AdminKubeconfig(), cp.Server()); err != nil {
		return err
	}
	local := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cp.cfg.SecurePort))
	return cp.WriteAdminKubeconfig(cp.path("kubeconfig", "components.kubeconfig"), local)
}

func (cp *ControlPlane) etcdArgs() []string {
	client := fmt.Sprintf("http://127.0.0.1:%d", cp.ports.EtcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", cp.ports.EtcdPeer)
	return []string{
		"--name=sandbox",
		"--data-dir=" + cp.path("etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=sandbox=" + peer,
		"--initial-cluster-state=new",
		// Sandbox data is thrown away; skipping fsync makes the
		// apiserver's many bootstrap writes much faster.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
		"--log-outputs=stderr",
	}
}

func (cp *ControlPlane) apiserverArgs() []string {
	return []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", cp.ports.EtcdClient),
		fmt.Sprintf("--secure-port=%d", cp.cfg.SecurePort),
		"--bind-address=0.0.0.0",
		"--advertise-address=" + cp.cfg.AdvertiseAddress,
		"--service-cluster-ip-range=" + cp.cfg.ServiceCIDR,
		"--client-ca-file=" + cp.path("pki", "ca.crt"),
		"--tls-cert-file=" + cp.path("pki", "apiserver.crt"),
		"--tls-private-key-file=" + cp.path("pki", "apiserver.key"),
		"--kubelet-client-certificate=" + cp.path("pki", "admin.crt"),
		"--kubelet-client-key=" + cp.path("pki", "admin.key"),
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + cp.path("pki", "sa.pub"),
		"--service-account-signing-key-file=" + cp.path("pki", "sa.key"),
		"--api-audiences=" + ServiceAccountIssuer,
		"--authorization-mode=Node,RBAC",
		// Real kubelets (logs, exec, port-forward) are reached by address:
		// the sandbox has no DNS for Node names.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir=" + cp.path("pki"),
	}
}

func (cp *ControlPlane) controllerManagerArgs() []string {
	kc := cp.path("kubeconfig", "components.kubeconfig")
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--controllers=*",
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + cp.cfg.ClusterCIDR,
		fmt.Sprintf("--node-cidr-mask-size=%d", cp.cfg.NodeCIDRMaskSize),
		"--service-cluster-ip-range=" + cp.cfg.ServiceCIDR,
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + cp.path("pki", "sa.key"),
		"--root-ca-file=" + cp.path("pki", "ca.crt"),
		"--cluster-signing-cert-file=" + cp.path("pki", "ca.crt"),
		"--cluster-signing-key-file=" + cp.path("pki", "ca.key"),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", cp.ports.ControllerManager),
		"--cert-dir=" + cp.path("pki", "kube-controller-manager"),
		"--node-monitor-grace-period=20s",
		"--profiling=false",
	}
}

func (cp *ControlPlane) schedulerArgs() []string {
	kc := cp.path("kubeconfig", "components.kubeconfig")
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", cp.ports.Scheduler),
		"--cert-dir=" + cp.path("pki", "kube-scheduler"),
		"--profiling=false",
	}
}
