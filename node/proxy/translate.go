package proxy

import (
	"fmt"
	"net"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

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

// Translate computes the desired state of every port of svc from its
// EndpointSlices (IPv4 only), as seen from the Node nodeName:
//
//   - new connections go to ready endpoints; when none is ready, to the
//     serving and terminating ones (KEP-1669 ProxyTerminatingEndpoints);
//   - the endpoint port is the EndpointSlice port of the same name and
//     protocol, so named targetPorts arrive already resolved;
//   - internalTrafficPolicy Local keeps only endpoints on nodeName and
//     drops connections when there is none (Kubernetes documents that the
//     traffic is dropped then); a port with no endpoint at all is rejected;
//   - sessionAffinity ClientIP sets AffinitySeconds (default 10800 s,
//     capped at 65535, the width of OpenFlow's hard_timeout).
//
// The ClusterIP(s) are the VIPs. The result is sorted by Key.
func Translate(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, nodeName string) ([]PortState, error) {
	var vips []net.IP
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		if ip := net.ParseIP(s); ip != nil && ip.To4() != nil {
			vips = append(vips, ip.To4())
		}
	}
	if len(vips) == 0 {
		return nil, nil
	}
	var affinity uint16
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		t := int32(corev1.DefaultClientIPServiceAffinitySeconds)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t = *c.ClientIP.TimeoutSeconds
		}
		affinity = uint16(min(max(t, 1), 65535))
	}
	local := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	var out []PortState
	for _, p := range svc.Spec.Ports {
		proto, ok := protoNumber(p.Protocol)
		if !ok {
			return nil, fmt.Errorf("service %s/%s port %q: unsupported protocol %q", svc.Namespace, svc.Name, p.Name, p.Protocol)
		}
		ready, serving := endpointsFor(slices, p.Name, p.Protocol, nodeName)
		eps := ready
		if len(eps) == 0 {
			eps = serving
		}
		sp := pipeline.ServicePort{VIPs: vips, Protocol: proto, Port: uint16(p.Port), AffinitySeconds: affinity}
		switch {
		case len(eps) == 0:
			sp.Action = pipeline.ServiceReject
		case local:
			for _, ep := range eps {
				if ep.Local {
					sp.Endpoints = append(sp.Endpoints, ep)
				}
			}
			if len(sp.Endpoints) == 0 {
				sp.Action = pipeline.ServiceDrop
			}
		default:
			sp.Endpoints = eps
		}
		key := svc.Namespace + "/" + svc.Name + "/" + p.Name + "/" + string(protoOrTCP(p.Protocol))
		if p.Name == "" {
			key = svc.Namespace + "/" + svc.Name + "/" + strconv.Itoa(int(p.Port)) + "/" + string(protoOrTCP(p.Protocol))
		}
		out = append(out, PortState{Key: key, Port: sp})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
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
func endpointsFor(slices []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol, nodeName string) (ready, serving []pipeline.ServiceEndpoint) {
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
			for _, a := range e.Addresses {
				ip := net.ParseIP(a).To4()
				if ip == nil || seen[ip.String()] {
					continue
				}
				seen[ip.String()] = true
				ep := pipeline.ServiceEndpoint{IP: ip, Port: uint16(port), Local: isLocal}
				if isReady {
					ready = append(ready, ep)
				} else {
					serving = append(serving, ep)
				}
			}
		}
	}
	byIP := func(l []pipeline.ServiceEndpoint) {
		sort.Slice(l, func(i, j int) bool { return string(l[i].IP.To16()) < string(l[j].IP.To16()) })
	}
	byIP(ready)
	byIP(serving)
	return ready, serving
}
