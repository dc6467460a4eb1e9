// Package inspect answers operators' questions about this Node from the
// daemon's components, read-only: its Pods' interfaces, its flows (OVS's
// entries joined with Seine's desired state), its copy of the policy
// state, ofproto/trace runs, its AgentInfo figures and a support bundle.
// node/localapi serves it to seinectl.
package inspect

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/node/proxy"
	policyagent "github.com/seine-net/seine/policy/agent"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// Deps are the components the inspector reads.
type Deps struct {
	Config    config.Config
	Bridge    pipeline.Bridge
	StartTime time.Time
	// TrafficMode is the trafficEncapMode in effect: encap, noEncap,
	// hybrid or networkPolicyOnly.
	TrafficMode string
	OVSDB       *ovsdb.Client
	OpenFlow    *of.Client
	Appctl      *ovsctl.Client
	Flows       *flowsync.Syncer
	Pods        *podnet.Backend
	// Policy is nil when NetworkPolicy enforcement is off.
	Policy *policyagent.Agent
	// Peers returns the number of peer Nodes programmed.
	Peers func() int
	// NodeByIP names the Node with the given InternalIP ("" if none).
	NodeByIP func(ip net.IP) string
	// PodIP returns the IP of a Pod anywhere in the cluster.
	PodIP  func(ctx context.Context, namespace, name string) (string, error)
	Probes *health.Probes
	// Registry is dumped into support bundles.
	Registry *prometheus.Registry
	// Logs holds the daemon's recent log lines (support bundles); may be
	// nil.
	Logs io.WriterTo
	// Services returns the Service proxy's frontends; nil (the func or
	// its result) when the proxy is off.
	Services func(ctx context.Context) ([]proxy.Frontend, error)
}

// Inspector implements localapi.Backend.
type Inspector struct {
	d Deps
}

var _ localapi.Backend = (*Inspector)(nil)

// New returns an inspector over d.
func New(d Deps) *Inspector { return &Inspector{d: d} }

// PodInterfaces lists the attached Pods.
func (in *Inspector) PodInterfaces() []localapi.PodInterface {
	var out []localapi.PodInterface
	for _, a := range in.d.Pods.Attachments() {
		out = append(out, localapi.PodInterface{Namespace: a.Namespace, Name: a.Name, ContainerID: a.ContainerID,
			IfName: a.IfName, HostVeth: a.HostVeth, OFPort: a.OFPort, IP: a.IP, MAC: a.MAC,
			IngressIsolated: a.IngressIsolated, EgressIsolated: a.EgressIsolated,
			EgressLimited: a.EgressLimited, EgressMeter: a.EgressMeter})
	}
	return out
}

func (in *Inspector) view() policyagent.View {
	if in.d.Policy == nil {
		return policyagent.View{}
	}
	return in.d.Policy.View()
}

// NetworkPolicies lists the agent's computed policies.
func (in *Inspector) NetworkPolicies() []localapi.AgentPolicy {
	var out []localapi.AgentPolicy
	for _, p := range in.view().Policies {
		out = append(out, localapi.AgentPolicy{Policy: p.Object, Installed: p.Installed, Targets: p.Targets, Flows: p.Flows})
	}
	return out
}

// AppliedToGroups lists the agent's AppliedToGroups.
func (in *Inspector) AppliedToGroups() []*cpv1alpha1.AppliedToGroup { return in.view().AppliedToGroups }

// AddressGroups lists the agent's AddressGroups.
func (in *Inspector) AddressGroups() []*cpv1alpha1.AddressGroup { return in.view().AddressGroups }

// frontends returns the Service proxy's frontends (none when it is off).
func (in *Inspector) frontends(ctx context.Context) ([]proxy.Frontend, error) {
	if in.d.Services == nil {
		return nil, nil
	}
	return in.d.Services(ctx)
}

// Services lists the Service proxy's frontends, by Service, port and kind.
func (in *Inspector) Services(ctx context.Context) ([]localapi.ServiceFrontend, error) {
	fs, err := in.frontends(ctx)
	if err != nil {
		return nil, &localapi.StatusError{Code: http.StatusServiceUnavailable, Err: err}
	}
	out := []localapi.ServiceFrontend{}
	for _, f := range fs {
		sp := f.ServicePort
		ns, name, _ := strings.Cut(f.Service, "/")
		sf := localapi.ServiceFrontend{Namespace: ns, Name: name, Port: f.Port, Kind: f.Kind, ID: sp.ID,
			Action: serviceAction(sp.Action), SNAT: sp.SNAT, AffinitySeconds: int(sp.AffinitySeconds)}
		for _, vip := range sp.VIPs {
			sf.Addresses = append(sf.Addresses, net.JoinHostPort(vip.String(), strconv.Itoa(int(sp.Port))))
		}
		for alias, ip := range f.Aliases {
			if sf.Aliases == nil {
				sf.Aliases = map[string]string{}
			}
			sf.Aliases[alias] = ip.String()
		}
		for _, ep := range sp.Endpoints {
			e := net.JoinHostPort(ep.IP.String(), strconv.Itoa(int(ep.Port)))
			if ep.Local {
				e += " (local)"
			}
			sf.Endpoints = append(sf.Endpoints, e)
		}
		for _, n := range sp.Sources {
			sf.Sources = append(sf.Sources, n.String())
		}
		for _, n := range sp.SourceRanges {
			sf.SourceRanges = append(sf.SourceRanges, n.String())
		}
		out = append(out, sf)
	}
	return out, nil
}

func serviceAction(a pipeline.ServiceAction) string {
	switch a {
	case pipeline.ServiceBalance:
		return "balance"
	case pipeline.ServiceReject:
		return "reject"
	case pipeline.ServiceDrop:
		return "drop"
	}
	return fmt.Sprint(int(a))
}

// tableName names a table for output.
func tableName(t uint8) string { return pipeline.Table(t).String() }

// sortFlows orders flows by table (pipeline order), then by descending
// priority, then by match.
func sortFlows(fs []localapi.Flow) {
	sort.SliceStable(fs, func(i, j int) bool {
		if fs[i].TableID != fs[j].TableID {
			return fs[i].TableID < fs[j].TableID
		}
		if fs[i].Priority != fs[j].Priority {
			return fs[i].Priority > fs[j].Priority
		}
		return fs[i].Match < fs[j].Match
	})
}
