package proxy

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"

	"github.com/seine-net/seine/datapath/pipeline"
)

// LabelServiceProxyName marks a Service handled by another proxy
// (KEP-2447 / kube-proxy's --service-proxy-name convention): Seine leaves
// any Service carrying it alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// PortState is the desired datapath state of one Service port, before an
// ID is assigned.
type PortState struct {
	// Key identifies the port within the Node: "ns/name/portName/PROTO".
	Key  string
	Port pipeline.ServicePort // ID left 0
	// Serving are the endpoints serving the Service port (ready, or
	// serving and terminating), whatever the traffic policy and topology
	// hints choose of them: connections to these are not stale.
	Serving []pipeline.ServiceEndpoint
	// ClusterIPs are the Service's ClusterIPs, on its internal frontends
	// (nil on the others): the host rejects connections to them on ports
	// that no Service port defines, as kube-proxy does.
	ClusterIPs []net.IP
	// AffinityOf (ClientIP affinity only) is the Key of the frontend whose
	// ID keys the affinity of this one (pipeline.ServicePort.AffinityID):
	// the internal frontend of the same Service port, so that all of the
	// port's frontends remember a client together, as kube-proxy does.
	AffinityOf string
	// Aliases are the aliases of an external frontend's externalIPs and
	// LoadBalancer IPs by IP (see MapLocalVIPAliases), set by the Proxier
	// as it installs the frontend, which then lists them among its VIPs
	// too; Translate leaves it nil.
	Aliases map[string]net.IP
}

// Ignored reports why the proxy leaves svc alone ("" when it handles it):
// headless and ExternalName Services, Services listed in skip (a set of
// "namespace/name"), and Services labelled for another proxy.
func Ignored(svc *corev1.Service, skip map[string]bool) string {
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return "ExternalName"
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return "headless"
	case skip[svc.Namespace+"/"+svc.Name]:
		return "in proxy.skipServices"
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return "labelled " + LabelServiceProxyName
	}
	return ""
}

func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return 6, true
	case corev1.ProtocolUDP:
		return 17, true
	case corev1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

// Scope is what Translate needs to know about the Node it translates for.
type Scope struct {
	// NodeName decides which endpoints are local.
	NodeName string
	// ProxyAll adds the external frontends: NodePort (for type NodePort
	// and LoadBalancer), externalIPs and LoadBalancer ingress IPs.
	ProxyAll bool
	// HostIPs are the addresses the Node's own connections come from (its
	// InternalIP, its gateway IP): to a Service whose
	// externalTrafficPolicy is Local they go to every endpoint.
	HostIPs []net.IP
	// Zone is the Node's topology.kubernetes.io/zone label ("" when it
	// has none), for the EndpointSlice zone hints.
	Zone string
}

// Translate computes the desired state of every port of svc from its
// EndpointSlices (IPv4 only), as seen from the Node scope.NodeName. Each
// Service port gives up to nine frontends, each its own PortState (the
// four below, the two of loadBalancerSourceRanges, and under
// externalTrafficPolicy Local a "/node" twin of each external one, see
// the endpoint rules):
//
//   - the internal one (key "ns/name/port/PROTO"): the ClusterIPs, and the
//     externalIPs and LoadBalancer IPs for traffic from Pods;
//   - under internalTrafficPolicy Local, key suffix "/external-pods": the
//     externalIPs and LoadBalancer IPs for traffic from Pods, which
//     kube-proxy sends to the endpoints cluster-wide whatever the
//     policies (the ClusterIPs alone follow internalTrafficPolicy);
//   - with ProxyAll and a nodePort, key suffix "/nodeport": NodePortVIP
//     on the nodePort, for what the host DNATs there;
//   - with ProxyAll and externalIPs or LoadBalancer ingress IPs (except
//     ipMode Proxy, KEP-1860), key suffix "/external": those IPs for
//     traffic routed in by the host.
//
// A LoadBalancer Service with loadBalancerSourceRanges (sourceRanges) has
// its LoadBalancer IPs in neither the internal nor the "/external"
// frontend but in two of their own that admit the ranges only and drop
// the other new connections: key suffix "/loadbalancer-pods" for traffic
// from Pods, and with ProxyAll "/loadbalancer" for traffic routed in by
// the host (and its "/node" twin).
//
// Endpoint rules:
//
//   - new connections go to ready endpoints; when none is ready, to the
//     serving and terminating ones (KEP-1669 ProxyTerminatingEndpoints);
//   - the endpoint port is the EndpointSlice port of the same name and
//     protocol, so named targetPorts arrive already resolved;
//   - internalTrafficPolicy Local keeps only endpoints on the Node for the
//     internal frontend and drops connections when there is none
//     (Kubernetes documents that the traffic is dropped then);
//     externalTrafficPolicy Local does the same for the external
//     frontends and keeps the client's source address, Cluster SNATs it;
//     the Node's own connections (from scope.HostIPs), and its Pods'
//     that the host hands back (pipeline.ServicePort.LocalPods), to an
//     external frontend with Local go to every endpoint, as kube-proxy's
//     "short-circuit" does: a frontend of their own, key suffix "/node",
//     which keeps their source too;
//   - a frontend with no endpoint at all is rejected;
//   - the only UDP port of a Service takes the IP fragments sent to its
//     ClusterIPs (pipeline.ServicePort.FragmentVIPs); with several UDP
//     ports a fragment names none of them, and large datagrams to such a
//     Service need the kernel datapath;
//   - sessionAffinity ClientIP sets AffinitySeconds (default 10800 s,
//     capped at 65535, the width of OpenFlow's hard_timeout) and, on
//     every frontend of the port, AffinityOf: the internal frontend's
//     key, so a client keeps its endpoint across the port's addresses;
//   - the frontends that send to endpoints cluster-wide follow the
//     EndpointSlice hints (KEP-2433 topology aware routing, KEP-3015
//     trafficDistribution), see nearest; the Local policies ignore them.
//
// The result is sorted by Key.
func Translate(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, scope Scope) ([]PortState, error) {
	vips := ipv4s(svc.Spec.ClusterIPs)
	if len(vips) == 0 {
		vips = ipv4s([]string{svc.Spec.ClusterIP})
	}
	if len(vips) == 0 {
		return nil, nil
	}
	external := ipv4s(svc.Spec.ExternalIPs)
	var lbIPs []net.IP
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			lbIPs = append(lbIPs, ipv4s([]string{in.IP})...)
		}
	}
	// The LoadBalancer IPs of a Service with loadBalancerSourceRanges get
	// frontends of their own, which admit those ranges only; otherwise
	// they join the externalIPs.
	ranges := sourceRanges(svc, lbIPs, scope.HostIPs)
	if len(ranges) == 0 {
		external = append(external, lbIPs...)
	} else {
		// An externalIP that is also a LoadBalancer IP is the latter's:
		// the ranges apply to it.
		external = slices.DeleteFunc(external, func(ip net.IP) bool { return containsIP(lbIPs, ip) })
	}
	var affinity uint16
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		t := int32(corev1.DefaultClientIPServiceAffinitySeconds)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t = *c.ClientIP.TimeoutSeconds
		}
		affinity = uint16(min(max(t, 1), 65535))
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externalLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	udpPorts := 0
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolUDP {
			udpPorts++
		}
	}
	var out []PortState
	for _, p := range svc.Spec.Ports {
		proto, ok := protoNumber(p.Protocol)
		if !ok {
			return nil, fmt.Errorf("service %s/%s port %q: unsupported protocol %q", svc.Namespace, svc.Name, p.Name, p.Protocol)
		}
		ready, serving := endpointsFor(epSlices, p.Name, p.Protocol, scope.NodeName)
		near := nearest(ready, scope.NodeName, scope.Zone)
		alive := append(plain(ready), plain(serving)...)
		key := svc.Namespace + "/" + svc.Name + "/" + p.Name + "/" + string(protoOrTCP(p.Protocol))
		if p.Name == "" {
			key = svc.Namespace + "/" + svc.Name + "/" + strconv.Itoa(int(p.Port)) + "/" + string(protoOrTCP(p.Protocol))
		}
		first := len(out)
		// Every frontend of the port remembers its clients under the
		// internal frontend's ID.
		shareAffinity := func() {
			for i := first; i < len(out) && affinity > 0; i++ {
				out[i].AffinityOf = key
			}
		}
		base := pipeline.ServicePort{Protocol: proto, AffinitySeconds: affinity}
		// From Pods, externalIPs and LoadBalancer IPs go to the endpoints
		// cluster-wide whatever the traffic policies, as under
		// kube-proxy (its external chain short-circuits Pod traffic to
		// the cluster endpoints): only the ClusterIPs follow
		// internalTrafficPolicy.
		fromPods := base
		fromPods.Port = uint16(p.Port)
		choose(&fromPods, near, serving, false)
		in := fromPods
		in.VIPs = append(append([]net.IP{}, vips...), external...)
		if internalLocal {
			in = base
			in.VIPs, in.Port = append([]net.IP{}, vips...), uint16(p.Port)
			choose(&in, ready, serving, true)
		}
		if p.Protocol == corev1.ProtocolUDP && udpPorts == 1 {
			in.FragmentVIPs = vips
		}
		out = append(out, PortState{Key: key, Port: in, Serving: alive, ClusterIPs: vips})
		if internalLocal && len(external) > 0 {
			ep := fromPods
			ep.VIPs = external
			out = append(out, PortState{Key: key + "/external-pods", Port: ep, Serving: alive})
		}
		if len(ranges) > 0 {
			lb := fromPods
			lb.VIPs, lb.SourceRanges = lbIPs, ranges
			out = append(out, PortState{Key: key + "/loadbalancer-pods", Port: lb, Serving: alive})
		}
		if !scope.ProxyAll {
			shareAffinity()
			continue
		}
		ext := base
		ext.External, ext.SNAT = true, !externalLocal
		if externalLocal {
			choose(&ext, ready, serving, true)
		} else {
			choose(&ext, near, serving, false)
		}
		// The Node's own connections, and its Pods', under
		// externalTrafficPolicy Local.
		// Its Pods' come back from the host with their own address
		// (LocalPods): only this Node's, since an endpoint elsewhere
		// answers them through this Node, which undoes the NAT, while
		// another Node's Pod would get the answer from the endpoint
		// directly.
		var fromNode *pipeline.ServicePort
		if externalLocal {
			n := base
			n.External, n.Sources, n.LocalPods = true, localSources(scope), true
			choose(&n, near, serving, false)
			fromNode = &n
		}
		add := func(key string, sp pipeline.ServicePort, vips []net.IP, port int32) {
			sp.VIPs, sp.Port = vips, uint16(port)
			out = append(out, PortState{Key: key, Port: sp, Serving: alive})
			if fromNode != nil {
				n := *fromNode
				n.VIPs, n.Port = vips, uint16(port)
				out = append(out, PortState{Key: key + "/node", Port: n, Serving: alive})
			}
		}
		if p.NodePort > 0 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) {
			add(key+"/nodeport", ext, []net.IP{pipeline.NodePortVIP}, p.NodePort)
		}
		if len(external) > 0 {
			add(key+"/external", ext, external, p.Port)
		}
		if len(ranges) > 0 {
			lb := ext
			lb.VIPs, lb.Port, lb.SourceRanges = lbIPs, uint16(p.Port), ranges
			out = append(out, PortState{Key: key + "/loadbalancer", Port: lb, Serving: alive})
			if fromNode != nil {
				// The Node's own connections: only from its addresses
				// the ranges admit; the others are dropped with the rest.
				n := *fromNode
				n.VIPs, n.Port, n.Sources, n.LocalPods = lbIPs, uint16(p.Port), nil, false
				for _, src := range fromNode.Sources {
					if inRanges(ranges, src.IP) {
						n.Sources = append(n.Sources, src)
					}
				}
				if len(n.Sources) > 0 {
					out = append(out, PortState{Key: key + "/loadbalancer/node", Port: n, Serving: alive})
				}
			}
		}
		shareAffinity()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// localSources returns the addresses of the Node's own connections, as
// sources of its "/node" frontends.
func localSources(scope Scope) []*net.IPNet {
	var out []*net.IPNet
	for _, ip := range scope.HostIPs {
		if ip4 := ip.To4(); ip4 != nil {
			out = append(out, &net.IPNet{IP: ip4, Mask: net.CIDRMask(32, 32)})
		}
	}
	return out
}

// containsIP reports whether ips holds ip.
func containsIP(ips []net.IP, ip net.IP) bool {
	for _, i := range ips {
		if i.Equal(ip) {
			return true
		}
	}
	return false
}

// inRanges reports whether one of ranges holds ip.
func inRanges(ranges []*net.IPNet, ip net.IP) bool {
	for _, r := range ranges {
		if r.Contains(ip) {
			return true
		}
	}
	return false
}

// sourceRanges returns the IPv4 loadBalancerSourceRanges of svc that
// apply to its LoadBalancer IPs lbIPs: none when it has no such IP, no
// IPv4 range, or a range of every address (0.0.0.0/0 admits all, as no
// range does). The API admits ranges padded with white space; they are
// trimmed. When a range holds one of the Node's addresses hostIPs, the
// LoadBalancer IPs are admitted as sources too: a load balancer that
// hands the Node its VIP as a local address makes the Node's own
// connections to it come from the VIP. This follows kube-proxy
// (pkg/proxy/serviceport.go, nftables proxier's firewall chains).
func sourceRanges(svc *corev1.Service, lbIPs, hostIPs []net.IP) []*net.IPNet {
	if len(lbIPs) == 0 {
		return nil
	}
	var out []*net.IPNet
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		_, n, err := netutils.ParseCIDRSloppy(strings.TrimSpace(r))
		if err != nil || n.IP.To4() == nil {
			continue
		}
		if ones, _ := n.Mask.Size(); ones == 0 {
			return nil
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil
	}
	for _, ip := range hostIPs {
		if inRanges(out, ip) {
			for _, vip := range lbIPs {
				out = append(out, &net.IPNet{IP: vip, Mask: net.CIDRMask(32, 32)})
			}
			break
		}
	}
	return out
}

// choose sets sp's endpoints and action: ready endpoints, else serving
// ones; local ones only when local is set, dropping when there is none.
func choose(sp *pipeline.ServicePort, ready, serving []endpoint, local bool) {
	eps := ready
	if len(eps) == 0 {
		eps = serving
	}
	if len(eps) == 0 {
		sp.Action = pipeline.ServiceReject
		return
	}
	if !local {
		sp.Endpoints = plain(eps)
		return
	}
	var mine []pipeline.ServiceEndpoint
	for _, l := range [][]endpoint{ready, serving} {
		for _, ep := range l {
			if ep.Local {
				mine = append(mine, ep.ServiceEndpoint)
			}
		}
		if len(mine) > 0 {
			break
		}
	}
	if len(mine) == 0 {
		sp.Action = pipeline.ServiceDrop
		return
	}
	sp.Endpoints = mine
}

// endpoint is a Service endpoint with the topology hints of its
// EndpointSlice entry (discovery.k8s.io/v1 EndpointHints).
type endpoint struct {
	pipeline.ServiceEndpoint
	// forZones and forNodes are the zones and Nodes whose clients the
	// EndpointSlice controller meant the endpoint for; empty without hints.
	forZones, forNodes []string
}

// plain drops the hints.
func plain(eps []endpoint) []pipeline.ServiceEndpoint {
	out := make([]pipeline.ServiceEndpoint, len(eps))
	for i, ep := range eps {
		out[i] = ep.ServiceEndpoint
	}
	return out
}

// nearest returns the ready endpoints the Node (name node, zone zone)
// should send to under the EndpointSlice hints, as kube-proxy reads them
// (pkg/proxy/topology.go):
//
//   - when every ready endpoint has Node hints (trafficDistribution
//     PreferSameNode) and one is for this Node, those for this Node;
//   - else when every ready endpoint has zone hints (PreferSameZone,
//     PreferClose, or the topology-mode annotation Auto) and one is for
//     this zone, those for this zone;
//   - else all of them: hints on only some endpoints, or none for this
//     Node's zone, or a Node without a zone label, mean no filtering.
//
// The serving-and-terminating fallback is only used when no endpoint is
// ready, and so no hint applies to it.
func nearest(ready []endpoint, node, zone string) []endpoint {
	allNodes, allZones := len(ready) > 0, len(ready) > 0
	forNode, forZone := false, false
	for _, ep := range ready {
		allNodes = allNodes && len(ep.forNodes) > 0
		allZones = allZones && len(ep.forZones) > 0
		forNode = forNode || slices.Contains(ep.forNodes, node)
		forZone = forZone || (zone != "" && slices.Contains(ep.forZones, zone))
	}
	var keep func(endpoint) bool
	switch {
	case allNodes && forNode:
		keep = func(ep endpoint) bool { return slices.Contains(ep.forNodes, node) }
	case allZones && forZone:
		keep = func(ep endpoint) bool { return slices.Contains(ep.forZones, zone) }
	default:
		return ready
	}
	var out []endpoint
	for _, ep := range ready {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// ipv4s parses the IPv4 addresses of l, skipping others. Leading zeros
// read as decimal, as the API server admitted them before Kubernetes
// 1.33's strict validation (objects stored then keep them).
func ipv4s(l []string) []net.IP {
	var out []net.IP
	for _, s := range l {
		if ip := netutils.ParseIPSloppy(s).To4(); ip != nil {
			out = append(out, ip)
		}
	}
	return out
}

func protoOrTCP(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// endpointsFor collects, from every IPv4 slice, the endpoints serving the
// Service port named portName: the ready ones, and the serving-and-
// terminating ones. An address listed twice counts once. Both lists are
// sorted by IP so that the group's buckets do not move needlessly.
func endpointsFor(slices []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol, nodeName string) (ready, serving []endpoint) {
	seen := map[string]bool{}
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var port int32 = -1
		for _, sp := range s.Ports {
			name := ""
			if sp.Name != nil {
				name = *sp.Name
			}
			pr := corev1.ProtocolTCP
			if sp.Protocol != nil {
				pr = *sp.Protocol
			}
			if name == portName && pr == protoOrTCP(proto) && sp.Port != nil {
				port = *sp.Port
				break
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, e := range s.Endpoints {
			isReady := e.Conditions.Ready == nil || *e.Conditions.Ready
			isServing := e.Conditions.Serving != nil && *e.Conditions.Serving
			isTerminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			if !isReady && !(isServing && isTerminating) {
				continue
			}
			isLocal := e.NodeName != nil && *e.NodeName == nodeName
			var zones, nodes []string
			if h := e.Hints; h != nil {
				for _, z := range h.ForZones {
					zones = append(zones, z.Name)
				}
				for _, n := range h.ForNodes {
					nodes = append(nodes, n.Name)
				}
			}
			for _, a := range e.Addresses {
				ip := net.ParseIP(a).To4()
				if ip == nil || seen[ip.String()] {
					continue
				}
				seen[ip.String()] = true
				ep := endpoint{ServiceEndpoint: pipeline.ServiceEndpoint{IP: ip, Port: uint16(port), Local: isLocal},
					forZones: zones, forNodes: nodes}
				if isReady {
					ready = append(ready, ep)
				} else {
					serving = append(serving, ep)
				}
			}
		}
	}
	byIP := func(l []endpoint) {
		sort.Slice(l, func(i, j int) bool { return string(l[i].IP.To16()) < string(l[j].IP.To16()) })
	}
	byIP(ready)
	byIP(serving)
	return ready, serving
}
