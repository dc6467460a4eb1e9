package config

import (
	"fmt"
	"path/filepath"
)

// TrafficEncapMode says how Pod traffic crosses between Nodes (the
// trafficEncapMode key). docs/design.md, "Traffic modes", draws the packet
// paths of each.
type TrafficEncapMode string

// The traffic modes.
const (
	// ModeEncap tunnels all Pod traffic between Nodes (the default).
	ModeEncap TrafficEncapMode = "encap"
	// ModeNoEncap never encapsulates: peers in this Node's transport
	// subnet get a host route to their podCIDR via their Node IP, peers in
	// other subnets rely on the underlay routing podCIDRs (a cloud route
	// controller, BGP). No tunnel port.
	ModeNoEncap TrafficEncapMode = "noEncap"
	// ModeHybrid routes to peers in this Node's transport subnet as
	// noEncap does and tunnels to the others.
	ModeHybrid TrafficEncapMode = "hybrid"
	// ModeNetworkPolicyOnly chains seine after a routed primary CNI that
	// owns Pod addresses and connectivity; seine enforces NetworkPolicy
	// and load-balances Services only.
	ModeNetworkPolicyOnly TrafficEncapMode = "networkPolicyOnly"
)

// Modes lists every traffic mode.
func Modes() []TrafficEncapMode {
	return []TrafficEncapMode{ModeEncap, ModeNoEncap, ModeHybrid, ModeNetworkPolicyOnly}
}

// Valid reports whether m is a known mode.
func (m TrafficEncapMode) Valid() bool {
	for _, k := range Modes() {
		if m == k {
			return true
		}
	}
	return false
}

// UsesTunnel reports whether the mode encapsulates some Pod traffic, and
// so needs the tunnel port (and, with the netdev datapath, the transport
// bridge).
func (m TrafficEncapMode) UsesTunnel() bool { return m == ModeEncap || m == ModeHybrid }

// OwnsPodNetwork reports whether seine gives Pods their addresses and
// connects them (every mode but networkPolicyOnly, where the primary CNI
// does).
func (m TrafficEncapMode) OwnsPodNetwork() bool { return m != ModeNetworkPolicyOnly }

// RoutesDirectly reports whether peers in this Node's transport subnet are
// reached by a host route via their Node IP instead of the tunnel.
func (m TrafficEncapMode) RoutesDirectly() bool { return m == ModeNoEncap || m == ModeHybrid }

// AllowNoEncapWithoutProxyEnv is the environment variable that lets the
// daemon start in a mode other than encap with the Service proxy turned
// off (value "true"). Those modes hand Service traffic to the host's
// routing, so without seine's proxy NetworkPolicy sees the addresses the
// host's kube-proxy chose, not the endpoints; the override is for
// clusters that accept that.
const AllowNoEncapWithoutProxyEnv = "SEINE_ALLOW_NO_ENCAP_WITHOUT_PROXY"

// validateMode checks trafficEncapMode and the keys whose meaning depends
// on it, reporting each problem through bad.
func (c Config) validateMode(bad func(key, format string, a ...any)) {
	m := c.TrafficEncapMode
	if !m.Valid() {
		bad("trafficEncapMode", "%q is not one of encap, noEncap, hybrid, networkPolicyOnly", string(m))
		return
	}
	if c.SNAT != nil {
		bad("snat", "the key was replaced by noSNAT (noSNAT: true turns Pod masquerading off, in noEncap and hybrid modes)")
	}
	if c.NoSNAT && m == ModeEncap {
		bad("noSNAT", "not allowed with trafficEncapMode encap: tunnelled Pod addresses are not routable outside the cluster, so Pod traffic to the outside must be masqueraded")
	}
	if m != ModeEncap && !c.ProxyEnabled() && !c.AllowNoEncapWithoutProxy {
		bad("proxy.enable", "false is not allowed with trafficEncapMode %s: the mode hands Service traffic to the host, so NetworkPolicy would see kube-proxy's choices instead of the endpoints (set %s=true to start anyway)",
			m, AllowNoEncapWithoutProxyEnv)
	}
	switch {
	case m == ModeNetworkPolicyOnly && c.PrimaryCNIConflist == "":
		bad("primaryCNIConflist", "required with trafficEncapMode networkPolicyOnly: the primary CNI's conflist that seine chains itself into")
	case c.PrimaryCNIConflist != "" && !filepath.IsAbs(c.PrimaryCNIConflist):
		bad("primaryCNIConflist", "%q must be an absolute path", c.PrimaryCNIConflist)
	}
}

// Warnings returns the accepted but doubtful settings, one sentence each
// naming its key, for the daemon to log at start.
func (c Config) Warnings() []string {
	var w []string
	if c.NoSNAT && c.TrafficEncapMode == ModeNetworkPolicyOnly {
		w = append(w, "noSNAT: has no effect with trafficEncapMode networkPolicyOnly: the primary CNI decides about masquerading")
	}
	if c.PrimaryCNIConflist != "" && c.TrafficEncapMode != ModeNetworkPolicyOnly {
		w = append(w, fmt.Sprintf("primaryCNIConflist: ignored with trafficEncapMode %s (used by networkPolicyOnly only)", c.TrafficEncapMode))
	}
	if c.TrafficEncapMode != ModeEncap && !c.ProxyEnabled() {
		w = append(w, fmt.Sprintf("proxy.enable: false with trafficEncapMode %s (allowed by %s): Service traffic is left to the host's kube-proxy, and NetworkPolicy sees its choices", c.TrafficEncapMode, AllowNoEncapWithoutProxyEnv))
	}
	if tw := c.TunnelWarning(); tw != "" {
		w = append(w, tw)
	}
	return w
}

// TunnelWarning warns about c's tunnel type, or is "": geneve and gre with
// the netdev datapath go through OVS's userspace tunnel port. The daemon
// also logs it when it chose the type itself (tunnelType empty).
func (c Config) TunnelWarning() string {
	if c.OVSDatapathType != DatapathNetdev || !c.TrafficEncapMode.UsesTunnel() ||
		(c.TunnelType != TunnelGeneve && c.TunnelType != TunnelGRE) {
		return ""
	}
	return fmt.Sprintf("tunnelType: %s with ovsDatapathType netdev goes through OVS's userspace tunnel port, which encapsulates one MTU-sized packet at a time: Pod traffic between Nodes runs at a fifth of vxlan's or less (docs/configuration.md)", c.TunnelType)
}
