// Package config holds the configuration of the seine node daemon: its YAML
// file format, defaults, validation and command-line overrides. Every option
// is documented, with its default, in docs/configuration.md.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/datapath/rxbuf"
	"github.com/seine-net/seine/node/nfconntrack"
)

// Datapath types of an OVS bridge (ovs-vswitchd.conf.db(5), Bridge table,
// datapath_type column).
const (
	DatapathSystem = "system"
	DatapathNetdev = "netdev"
)

// Tunnel types.
const (
	TunnelGeneve = "geneve"
	TunnelVXLAN  = "vxlan"
	TunnelGRE    = "gre"
)

// Config is the node daemon's configuration. Field names are the YAML keys.
type Config struct {
	// NodeName is this Node's name in Kubernetes. Default: $NODE_NAME, else
	// the host name.
	NodeName string `json:"nodeName,omitempty"`
	// Kubeconfig is a kubeconfig file; empty means in-cluster configuration.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// KubeAPIServerOverride is the API server URL ("https://host:port") the
	// daemon uses instead of the in-cluster "kubernetes" Service address.
	// In-cluster credentials (the ServiceAccount token and CA) are kept.
	// Clusters without kube-proxy need it: nothing serves that ClusterIP
	// before seine's own proxy runs. With Kubeconfig, it replaces the
	// kubeconfig's server. Default empty.
	KubeAPIServerOverride string `json:"kubeAPIServerOverride,omitempty"`

	// OVSRunDir is the directory holding OVSDB's db.sock and the bridges'
	// <bridge>.mgmt OpenFlow sockets. Default /var/run/openvswitch.
	OVSRunDir string `json:"ovsRunDir,omitempty"`
	// OVSDatapathType is "system" (kernel module, default) or "netdev"
	// (userspace datapath, for hosts without the openvswitch module).
	OVSDatapathType string `json:"ovsDatapathType,omitempty"`
	// BridgeName is the integration bridge. Default br-int.
	BridgeName string `json:"bridgeName,omitempty"`
	// GatewayName is the internal port holding the first IP of the podCIDR.
	// Default seine-gw0.
	GatewayName string `json:"gatewayName,omitempty"`
	// TunnelName is the flow-based tunnel port. Default seine-tun0.
	TunnelName string `json:"tunnelName,omitempty"`
	// TunnelType is geneve, vxlan or gre. Empty (the default): the type
	// this Node used before (its tunnel port, else its AgentInfo), else
	// the one the other Nodes use (their AgentInfos), else vxlan with
	// netdev and geneve with system (tunnel.PickType), so a default never
	// splits a running cluster.
	TunnelType string `json:"tunnelType,omitempty"`
	// TransportInterface carries tunnel traffic between Nodes. Default: the
	// interface that holds the Node's InternalIP.
	TransportInterface string `json:"transportInterface,omitempty"`
	// TransportBridge is the OVS bridge that, with the netdev datapath, takes
	// over TransportInterface and its addresses so that OVS's userspace
	// tunnels can reach peers. Default br-phy. Unused with "system".
	TransportBridge string `json:"transportBridge,omitempty"`
	// UserspaceTSO, with the netdev datapath, sets ovs-vswitchd's
	// other_config:userspace-tso-enable, so TCP segments up to 64 KiB cross
	// the bridge whole and Pods keep their checksum offload. Default true.
	// ovs-vswitchd reads it at start only. Unused with "system".
	UserspaceTSO *bool `json:"userspaceTSO,omitempty"`
	// NetdevReceiveBuffer, with the netdev datapath, is the least value in
	// bytes that `seine ovs run` (before it starts ovs-vswitchd) and the
	// daemon keep in the host's net.core.rmem_default, the receive buffer
	// of the AF_PACKET sockets through which ovs-vswitchd reads its ports
	// (datapath/rxbuf). They raise it, never lower it; 0 leaves it alone.
	// Default 4194304 (4 MiB). Unused with "system".
	NetdevReceiveBuffer *int `json:"netdevReceiveBuffer,omitempty"`
	// NATChecksum, with the netdev datapath and userspace TSO, is how a
	// packet that OVS NATed with a partial checksum is made right before
	// it leaves the Node: NATChecksumRewrite (the default) or
	// NATChecksumDetour. Unused with "system" or without userspace TSO.
	NATChecksum string `json:"natChecksum,omitempty"`

	// ClusterCIDR is the cluster's Pod CIDR; traffic from Pods to anything
	// outside it (and outside the Node IPs) is masqueraded. Default
	// 10.244.0.0/16.
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// ServiceCIDR is the ClusterIP range. Default 10.96.0.0/16.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// MTU of Pod interfaces, the gateway, the tunnel and the Pods' routes.
	// 0: Pod interfaces take the transport interface's MTU, and in the
	// modes that tunnel the gateway, the tunnel and the Pods' routes
	// through the gateway take that MTU less the tunnel overhead.
	MTU int `json:"mtu,omitempty"`
	// TrafficEncapMode is encap (default), noEncap, hybrid or
	// networkPolicyOnly (see TrafficEncapMode).
	TrafficEncapMode TrafficEncapMode `json:"trafficEncapMode,omitempty"`
	// NoSNAT turns off the masquerading of Pod traffic leaving the cluster
	// (noEncap and hybrid, where the underlay can route Pod addresses).
	NoSNAT bool `json:"noSNAT,omitempty"`
	// SNAT is the removed predecessor of NoSNAT; setting it is an error
	// that names its replacement.
	SNAT *bool `json:"snat,omitempty"`
	// PrimaryCNIConflist is, with networkPolicyOnly, the absolute path of
	// the primary CNI's conflist: seine keeps itself chained in it.
	PrimaryCNIConflist string `json:"primaryCNIConflist,omitempty"`
	// AllowNoEncapWithoutProxy is set from the environment variable
	// AllowNoEncapWithoutProxyEnv, never from the file.
	AllowNoEncapWithoutProxy bool `json:"-"`

	// CNISocket is the unix socket the CNI plugin talks to. Default
	// /var/run/seine/cni.sock.
	CNISocket string `json:"cniSocket,omitempty"`
	// DataDir keeps state that must survive restarts (IP allocations).
	// Default /var/lib/seine.
	DataDir string `json:"dataDir,omitempty"`
	// APISocket is the unix socket of the local API seinectl talks to
	// (mode 0600: root only). Default /var/run/seine/seine.sock.
	APISocket string `json:"apiSocket,omitempty"`
	// MetricsAddress serves /metrics, /healthz and /readyz (host:port); an
	// empty host means the Node's InternalIP, "" disables. Default :9345.
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `json:"logLevel,omitempty"`

	// NetworkPolicy configures NetworkPolicy enforcement.
	NetworkPolicy NetworkPolicyConfig `json:"networkPolicy,omitempty"`
	// LeaderElection configures the Lease the embedded policy controller
	// instances compete for.
	LeaderElection LeaderElectionConfig `json:"leaderElection,omitempty"`
	// Proxy configures the Service proxy in OVS.
	Proxy ProxyConfig `json:"proxy,omitempty"`
}

// ProxyConfig configures Seine's Service proxy (node/proxy).
type ProxyConfig struct {
	// Enable programs Services into OVS. Default true; when false, ClusterIP
	// traffic leaves through the gateway for kube-proxy on the host.
	Enable *bool `json:"enable,omitempty"`
	// SkipServices lists "namespace/name" of Services the proxy leaves alone.
	SkipServices []string `json:"skipServices,omitempty"`
	// ProxyAll also handles NodePort, externalIPs and LoadBalancer
	// ingress IPs, and traffic from the host to ClusterIPs, so that the
	// cluster needs no kube-proxy. Default true (with proxy.enable).
	ProxyAll *bool `json:"proxyAll,omitempty"`
	// NodePortAddresses are IPv4 CIDRs: NodePorts answer on the local
	// addresses inside them. Empty: the Node's transport address only.
	NodePortAddresses []string `json:"nodePortAddresses,omitempty"`
	// HealthzBindAddress serves kube-proxy's health check (/healthz and
	// /livez, host:port) with proxyAll, for the cloud load balancers that
	// probe it; "" disables. Default 0.0.0.0:10256, kube-proxy's.
	HealthzBindAddress string `json:"healthzBindAddress,omitempty"`
	// LocalVIPAliasCIDR is the link-local range (inside 169.254.0.0/16,
	// /18 to /30) the host takes aliases from for externalIPs and
	// LoadBalancer IPs that are local addresses of the Node (kube-vip),
	// one per IP, with proxyAll; the Node routes it into the bridge, so
	// nothing else on the Node may use it. Default 169.254.192.0/18.
	LocalVIPAliasCIDR string `json:"localVIPAliasCIDR,omitempty"`
	// Conntrack tunes the kernel's connection tracker as kube-proxy does,
	// with proxyAll only (beside kube-proxy, kube-proxy tunes it).
	Conntrack ConntrackConfig `json:"conntrack"`
}

// ConntrackConfig sizes and times the kernel's connection tracker
// (node/nfconntrack); the keys and defaults are kube-proxy's
// (KubeProxyConntrackConfiguration). A zero maxPerCore or timeout leaves
// its setting as the host has it; timeouts are whole seconds, at most
// 2,147,483 (what every kernel accepts).
type ConntrackConfig struct {
	// MaxPerCore raises nf_conntrack_max to this many entries per online
	// CPU, at least Min and at most 1,048,576; it is never lowered.
	// Default 32768.
	MaxPerCore int32 `json:"maxPerCore"`
	// Min is the least nf_conntrack_max MaxPerCore asks for (0: no
	// floor), at most 1,048,576. Default 131072.
	Min int32 `json:"min"`
	// TCPEstablishedTimeout sets nf_conntrack_tcp_timeout_established.
	// Default 24h.
	TCPEstablishedTimeout metav1.Duration `json:"tcpEstablishedTimeout"`
	// TCPCloseWaitTimeout sets nf_conntrack_tcp_timeout_close_wait.
	// Default 1h.
	TCPCloseWaitTimeout metav1.Duration `json:"tcpCloseWaitTimeout"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1. Default false.
	TCPBeLiberal bool `json:"tcpBeLiberal,omitempty"`
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout and
	// nf_conntrack_udp_timeout_stream. Default 0.
	UDPTimeout       metav1.Duration `json:"udpTimeout,omitempty"`
	UDPStreamTimeout metav1.Duration `json:"udpStreamTimeout,omitempty"`
}

// validLocalVIPAliases checks a proxy.localVIPAliasCIDR: an IPv4 CIDR,
// /18 to /30 (each /17 of 169.254.0.0/16 holds a reserved address), inside
// 169.254.0.0/16 (RFC 3927), holding none of pipeline.ReservedLinkLocal.
func validLocalVIPAliases(s string) error {
	_, n, err := net.ParseCIDR(s)
	if err != nil || n.IP.To4() == nil {
		return fmt.Errorf("%q is not an IPv4 CIDR", s)
	}
	_, linkLocal, _ := net.ParseCIDR("169.254.0.0/16")
	if ones, _ := n.Mask.Size(); !linkLocal.Contains(n.IP) || ones < 18 || ones > 30 {
		return fmt.Errorf("%s is not a /18 to /30 inside 169.254.0.0/16", n)
	}
	for _, ip := range pipeline.ReservedLinkLocal() {
		if n.Contains(ip) {
			return fmt.Errorf("%s holds %s, which seine or the cloud's metadata service uses", n, ip)
		}
	}
	return nil
}

// LocalVIPAliases returns proxy.localVIPAliasCIDR parsed (nil when it is
// not valid: Validate says why).
func (c Config) LocalVIPAliases() *net.IPNet {
	if validLocalVIPAliases(c.Proxy.LocalVIPAliasCIDR) != nil {
		return nil
	}
	_, n, _ := net.ParseCIDR(c.Proxy.LocalVIPAliasCIDR)
	return n
}

// ProxyEnabled reports whether the Service proxy runs.
func (c Config) ProxyEnabled() bool { return c.Proxy.Enable == nil || *c.Proxy.Enable }

// ProxyAllEnabled reports whether the proxy also replaces kube-proxy for
// NodePort, externalIPs, LoadBalancer IPs and host traffic.
func (c Config) ProxyAllEnabled() bool {
	return c.ProxyEnabled() && (c.Proxy.ProxyAll == nil || *c.Proxy.ProxyAll)
}

// NodePortCIDRs parses proxy.nodePortAddresses (validated by Validate).
func (c Config) NodePortCIDRs() []*net.IPNet {
	var out []*net.IPNet
	for _, s := range c.Proxy.NodePortAddresses {
		if _, n, err := net.ParseCIDR(s); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// NetworkPolicyConfig configures NetworkPolicy enforcement.
type NetworkPolicyConfig struct {
	// Enable turns enforcement (and the embedded controller) on. Default true.
	Enable *bool `json:"enable,omitempty"`
	// RealizeTimeout bounds how long a CNI ADD waits for the new Pod's
	// policies to be in place; past it the ADD fails with "try again
	// later" rather than start an unprotected Pod. Default 10s.
	RealizeTimeout metav1.Duration `json:"realizeTimeout,omitempty"`
	// AddressGroupSliceSize is the most Pods one AddressGroup object holds.
	// Default 500.
	AddressGroupSliceSize int `json:"addressGroupSliceSize,omitempty"`
	// ControllerWorkers is how many writes the leader's controller has in
	// flight at once. Default 8.
	ControllerWorkers int `json:"controllerWorkers,omitempty"`
	// ControllerQPS and ControllerBurst rate-limit the controller's writes
	// of computed objects (client-go token bucket: requests per second,
	// bucket size), separately from the rest of the daemon's API calls.
	// Defaults 500 and 1000.
	ControllerQPS   float32 `json:"controllerQPS,omitempty"`
	ControllerBurst int     `json:"controllerBurst,omitempty"`
}

// LeaderElectionConfig configures the controller's Lease (client-go
// tools/leaderelection semantics).
type LeaderElectionConfig struct {
	// Namespace of the Lease. Default seine-system (the manifest's
	// namespace).
	Namespace string `json:"namespace,omitempty"`
	// Name of the Lease. Default seine-controller.
	Name string `json:"name,omitempty"`
	// LeaseDuration is how long a lease is valid. Default 15s.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// RenewDeadline is how long the leader retries renewing before giving
	// up. Default 10s.
	RenewDeadline metav1.Duration `json:"renewDeadline,omitempty"`
	// RetryPeriod is the wait between attempts. Default 2s.
	RetryPeriod metav1.Duration `json:"retryPeriod,omitempty"`
}

// PolicyEnabled reports whether NetworkPolicy enforcement is on.
func (c Config) PolicyEnabled() bool {
	return c.NetworkPolicy.Enable == nil || *c.NetworkPolicy.Enable
}

// Default returns the configuration with every default filled in.
func Default() Config {
	t := true
	rcvbuf := rxbuf.DefaultMin
	return Config{
		OVSRunDir:           "/var/run/openvswitch",
		OVSDatapathType:     DatapathSystem,
		BridgeName:          "br-int",
		GatewayName:         "seine-gw0",
		TunnelName:          "seine-tun0",
		TransportBridge:     "br-phy",
		UserspaceTSO:        &t,
		NetdevReceiveBuffer: &rcvbuf,
		ClusterCIDR:         "10.244.0.0/16",
		ServiceCIDR:         "10.96.0.0/16",
		TrafficEncapMode:    ModeEncap,
		CNISocket:           "/var/run/seine/cni.sock",
		DataDir:             "/var/lib/seine",
		APISocket:           "/var/run/seine/seine.sock",
		MetricsAddress:      ":9345",
		LogLevel:            "info",
		Proxy: ProxyConfig{
			HealthzBindAddress: "0.0.0.0:10256",
			LocalVIPAliasCIDR:  pipeline.DefaultLocalVIPAliasCIDR,
			Conntrack: ConntrackConfig{
				MaxPerCore:            nfconntrack.DefaultMaxPerCore,
				Min:                   nfconntrack.DefaultMin,
				TCPEstablishedTimeout: metav1.Duration{Duration: nfconntrack.DefaultTCPEstablishedTimeout},
				TCPCloseWaitTimeout:   metav1.Duration{Duration: nfconntrack.DefaultTCPCloseWaitTimeout},
			},
		},
		NetworkPolicy: NetworkPolicyConfig{
			Enable:                &t,
			RealizeTimeout:        metav1.Duration{Duration: 10 * time.Second},
			AddressGroupSliceSize: 500,
			ControllerWorkers:     8,
			ControllerQPS:         500,
			ControllerBurst:       1000,
		},
		LeaderElection: LeaderElectionConfig{
			Namespace:     "seine-system",
			Name:          "seine-controller",
			LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
			RenewDeadline: metav1.Duration{Duration: 10 * time.Second},
			RetryPeriod:   metav1.Duration{Duration: 2 * time.Second},
		},
	}
}

// Load reads the YAML file at path (if path is not empty) over the defaults,
// applies the key=value overrides (YAML keys, "a.b" for nested ones; values
// parsed as YAML)
// and validates the result. Unknown keys are an error, so a typo cannot
// silently fall back to a default.
func Load(path string, overrides []string) (Config, error) {
	doc := map[string]any{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("reading config file: %w", err)
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		if doc == nil {
			doc = map[string]any{}
		}
	}
	for _, o := range overrides {
		k, v, ok := strings.Cut(o, "=")
		if !ok || k == "" {
			return Config{}, fmt.Errorf("override %q: want key=value", o)
		}
		var val any
		if err := yaml.Unmarshal([]byte(v), &val); err != nil {
			val = v
		}
		// "a.b=v" sets key b of the mapping a.
		m := doc
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = val
	}
	merged, err := yaml.Marshal(doc)
	if err != nil {
		return Config{}, err
	}
	c := Default()
	if err := yaml.UnmarshalStrict(merged, &c); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	if c.NodeName == "" {
		c.NodeName = os.Getenv("NODE_NAME")
	}
	c.AllowNoEncapWithoutProxy = os.Getenv(AllowNoEncapWithoutProxyEnv) == "true"
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return Config{}, fmt.Errorf("nodeName not set and no host name: %w", err)
		}
		c.NodeName = h
	}
	return c, c.Validate()
}

// Validate checks every option and returns all problems at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, a...)...))
	}
	switch c.OVSDatapathType {
	case DatapathSystem, DatapathNetdev:
	default:
		bad("ovsDatapathType", "%q is not one of system, netdev", c.OVSDatapathType)
	}
	switch c.NATChecksum {
	case "", NATChecksumRewrite, NATChecksumDetour:
	default:
		bad("natChecksum", "%q is not one of %s, %s", c.NATChecksum, NATChecksumRewrite, NATChecksumDetour)
	}
	switch c.TunnelType {
	case "", TunnelGeneve, TunnelVXLAN, TunnelGRE:
	default:
		bad("tunnelType", "%q is not one of geneve, vxlan, gre (or empty: chosen at start)", c.TunnelType)
	}
	if c.NetdevReceiveBuffer != nil && *c.NetdevReceiveBuffer < 0 {
		bad("netdevReceiveBuffer", "%d bytes is negative (0 leaves net.core.rmem_default alone)", *c.NetdevReceiveBuffer)
	}
	var ranges []*net.IPNet
	for _, kv := range [][2]string{{"clusterCIDR", c.ClusterCIDR}, {"serviceCIDR", c.ServiceCIDR}} {
		if _, n, err := net.ParseCIDR(kv[1]); err != nil || n.IP.To4() == nil {
			bad(kv[0], "%q is not an IPv4 CIDR", kv[1])
		} else {
			ranges = append(ranges, n)
		}
	}
	if len(ranges) == 2 && (ranges[0].Contains(ranges[1].IP) || ranges[1].Contains(ranges[0].IP)) {
		bad("serviceCIDR", "%s overlaps clusterCIDR %s", ranges[1], ranges[0])
	}
	for _, kv := range [][2]string{{"bridgeName", c.BridgeName}, {"gatewayName", c.GatewayName},
		{"tunnelName", c.TunnelName}, {"transportBridge", c.TransportBridge}} {
		if !validIfName(kv[1]) {
			bad(kv[0], "%q is not a valid interface name (1-15 characters, not . or .., no '/', ':' or white space)", kv[1])
		}
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 9216) {
		bad("mtu", "%d is outside 576..9216", c.MTU)
	}
	if c.CNISocket == "" || !filepath.IsAbs(c.CNISocket) {
		bad("cniSocket", "%q must be an absolute path", c.CNISocket)
	}
	if c.APISocket == "" || !filepath.IsAbs(c.APISocket) {
		bad("apiSocket", "%q must be an absolute path", c.APISocket)
	}
	if c.MetricsAddress != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddress); err != nil || port == "" {
			bad("metricsAddress", "%q is not host:port (an empty host means the Node's address)", c.MetricsAddress)
		}
	}
	if a := c.Proxy.HealthzBindAddress; a != "" {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			bad("proxy.healthzBindAddress", "%q is not host:port (\"\" disables it)", a)
		}
	}
	if err := validLocalVIPAliases(c.Proxy.LocalVIPAliasCIDR); err != nil {
		bad("proxy.localVIPAliasCIDR", "%v", err)
	}
	ct := c.Proxy.Conntrack
	if ct.MaxPerCore < 0 {
		bad("proxy.conntrack.maxPerCore", "%d is negative", ct.MaxPerCore)
	}
	if ct.Min < 0 || ct.Min > nfconntrack.MaxCap {
		bad("proxy.conntrack.min", "%d is not 0..%d", ct.Min, nfconntrack.MaxCap)
	}
	for _, t := range []struct {
		key string
		d   time.Duration
	}{
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout.Duration}, {"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout.Duration},
		{"udpTimeout", ct.UDPTimeout.Duration}, {"udpStreamTimeout", ct.UDPStreamTimeout.Duration},
	} {
		if t.d < 0 || t.d%time.Second != 0 || t.d > nfconntrack.MaxTimeout*time.Second {
			bad("proxy.conntrack."+t.key, "%s is not 0 (leave the host's) or whole seconds up to %ds", t.d, nfconntrack.MaxTimeout)
		}
	}
	if c.DataDir == "" || !filepath.IsAbs(c.DataDir) {
		bad("dataDir", "%q must be an absolute path", c.DataDir)
	}
	le := c.LeaderElection
	if le.LeaseDuration.Duration <= le.RenewDeadline.Duration || le.RenewDeadline.Duration <= le.RetryPeriod.Duration || le.RetryPeriod.Duration <= 0 {
		bad("leaderElection", "want leaseDuration > renewDeadline > retryPeriod > 0, got %s, %s, %s",
			le.LeaseDuration.Duration, le.RenewDeadline.Duration, le.RetryPeriod.Duration)
	}
	if c.NetworkPolicy.RealizeTimeout.Duration <= 0 {
		bad("networkPolicy.realizeTimeout", "must be positive")
	}
	for _, s := range c.Proxy.SkipServices {
		if ns, name, ok := strings.Cut(s, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			bad("proxy.skipServices", "%q is not namespace/name", s)
		}
	}
	for _, s := range c.Proxy.NodePortAddresses {
		if _, n, err := net.ParseCIDR(s); err != nil || n.IP.To4() == nil {
			bad("proxy.nodePortAddresses", "%q is not an IPv4 CIDR", s)
		}
	}
	if c.NetworkPolicy.AddressGroupSliceSize < 1 {
		bad("networkPolicy.addressGroupSliceSize", "must be at least 1")
	}
	if c.NetworkPolicy.ControllerWorkers < 1 {
		bad("networkPolicy.controllerWorkers", "must be at least 1")
	}
	if c.NetworkPolicy.ControllerQPS <= 0 || c.NetworkPolicy.ControllerBurst < 1 {
		bad("networkPolicy.controllerQPS", "want controllerQPS > 0 and controllerBurst ≥ 1, got %g and %d",
			c.NetworkPolicy.ControllerQPS, c.NetworkPolicy.ControllerBurst)
	}
	if s := c.KubeAPIServerOverride; s != "" {
		if u, err := url.Parse(s); err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			bad("kubeAPIServerOverride", "%q is not an https://host[:port] URL", s)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("logLevel", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	c.validateMode(bad)
	return errors.Join(errs...)
}

// Values of NATChecksum (docs/configuration.md, "NAT of offloaded
// packets").
const (
	// NATChecksumRewrite: a tc program (datapath/csumseed) on each device
	// through which packets leave the bridge writes a partial checksum's
	// pseudo-header seed anew from the packet's headers. Where the kernel
	// refuses the program, the Node falls back to NATChecksumDetour.
	NATChecksumRewrite = "rewrite"
	// NATChecksumDetour: NATed packets that leave the Node are restored,
	// sent through the segmentation port for the kernel to checksum (and
	// segment) them, and NATed again (pipeline.NATChecksumDetour).
	NATChecksumDetour = "detour"
)

// NATChecksumMode is NATChecksum with its default filled in.
func (c Config) NATChecksumMode() string {
	if c.NATChecksum == "" {
		return NATChecksumRewrite
	}
	return c.NATChecksum
}

// UserspaceTSOEnabled reports whether the netdev datapath should run with
// userspace TSO.
func (c Config) UserspaceTSOEnabled() bool { return c.UserspaceTSO == nil || *c.UserspaceTSO }

// NetdevReceiveBufferMin is the least net.core.rmem_default, in bytes, to
// keep with the netdev datapath: 0 when the datapath is "system" or the
// configuration says to leave the sysctl alone.
func (c Config) NetdevReceiveBufferMin() int {
	if c.OVSDatapathType != DatapathNetdev {
		return 0
	}
	if c.NetdevReceiveBuffer == nil {
		return rxbuf.DefaultMin
	}
	return *c.NetdevReceiveBuffer
}

// SNATEnabled reports whether seine masquerades Pod traffic leaving the
// cluster: not with noSNAT, and never in networkPolicyOnly mode, where the
// primary CNI owns Pod connectivity.
func (c Config) SNATEnabled() bool {
	return !c.NoSNAT && c.TrafficEncapMode.OwnsPodNetwork()
}

// OVSDBEndpoint is the libovsdb endpoint of the local OVSDB server.
func (c Config) OVSDBEndpoint() string { return "unix:" + filepath.Join(c.OVSRunDir, "db.sock") }

// BridgeMgmtSocket is the OpenFlow management socket of the bridge.
func (c Config) BridgeMgmtSocket() string {
	return filepath.Join(c.OVSRunDir, c.BridgeName+".mgmt")
}

// validIfName reports whether the kernel accepts name for a network
// device (net/core/dev.c, dev_valid_name): 1 to 15 bytes, neither "." nor
// "..", without '/', ':' or white space.
func validIfName(name string) bool {
	return name != "" && len(name) <= 15 && name != "." && name != ".." &&
		!strings.ContainsAny(name, "/: \t\n\v\f\r")
}
