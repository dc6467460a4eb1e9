package proxy

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/seine-net/seine/datapath/pipeline"
)

// Frontend is one programmed frontend of a Service port, as the switch
// has it, for operators (seinectl get service).
type Frontend struct {
	// Service is the Service's "namespace/name".
	Service string
	// Port is the Service port's name, or its number when unnamed, and
	// its protocol: "http/TCP".
	Port string
	// Kind says which traffic the frontend takes (see Translate):
	// "internal" (ClusterIPs, and externalIPs and LoadBalancer IPs from
	// Pods), "nodeport", "external" (externalIPs and LoadBalancer IPs
	// routed in by the host), "loadbalancer" and "loadbalancer-pods"
	// (LoadBalancer IPs with source ranges), "external-pods"
	// (internalTrafficPolicy Local); "/node" is appended to the twin that
	// takes the Node's own connections under externalTrafficPolicy Local.
	Kind string
	// ServicePort is what the switch was programmed with: its ID (the
	// group ID and the flows' owner "svc/<ID>"), VIPs, port, action and
	// endpoints.
	ServicePort pipeline.ServicePort
	// Aliases maps each alias among ServicePort.VIPs to the externalIP or
	// LoadBalancer IP it stands for (see MapLocalVIPAliases).
	Aliases map[string]net.IP
}

// Frontends returns every programmed frontend, sorted by Service, port
// and kind. The proxy holds its lock while it programs a batch, which
// waits for ovs-vswitchd when that is down: Frontends waits for it only
// until ctx ends, and then returns an error saying so.
func (p *Proxier) Frontends(ctx context.Context) ([]Frontend, error) {
	for !p.mu.TryLock() {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the Service proxy is busy programming (is ovs-vswitchd up?): %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer p.mu.Unlock()
	var out []Frontend
	for svc, ports := range p.installed {
		for key, pi := range ports {
			if pi.port.ID == 0 { // never programmed
				continue
			}
			f := Frontend{Service: svc, ServicePort: pi.port}
			f.Port, f.Kind = frontendName(svc, key)
			for _, vip := range pi.port.VIPs {
				if p.host == nil || !p.host.isAlias(vip) {
					continue
				}
				if owner, ok := p.host.aliasOwner[vip.String()]; ok {
					if f.Aliases == nil {
						f.Aliases = map[string]net.IP{}
					}
					f.Aliases[vip.String()] = net.ParseIP(owner)
				}
			}
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		if a.Port != b.Port {
			return a.Port < b.Port
		}
		return a.Kind < b.Kind
	})
	return out, nil
}

// frontendName splits a PortState key ("ns/name/port/PROTO[/kind[/node]]")
// of the Service svc into the port ("port/PROTO") and the kind.
func frontendName(svc, key string) (port, kind string) {
	rest := strings.TrimPrefix(key, svc+"/")
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 2 {
		return rest, "internal"
	}
	port = parts[0] + "/" + parts[1]
	kind = "internal"
	if len(parts) == 3 {
		kind = parts[2]
	}
	return port, kind
}
