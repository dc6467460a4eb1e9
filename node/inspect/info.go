package inspect

import (
	"context"
	"errors"
	"net"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/version"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// Version reports the daemon's and OVS's versions.
func (in *Inspector) Version(ctx context.Context) (localapi.Version, error) {
	v := localapi.Version{Node: in.d.Config.NodeName, Daemon: version.String(), Datapath: in.d.Config.OVSDatapathType}
	ovs, err := in.d.Appctl.Version(ctx)
	if err != nil {
		ovs = "unknown (" + err.Error() + ")"
	}
	v.OVS = ovs
	return v, nil
}

// OVSConnected is nil while the OVSDB and OpenFlow connections are up.
func OVSConnected(ovs *ovsdb.Client, ofc *of.Client) error {
	var errs []error
	if !ovs.Connected() {
		errs = append(errs, errors.New("OVSDB connection down"))
	}
	if !ofc.Connected() {
		errs = append(errs, errors.New("OpenFlow connection down"))
	}
	return errors.Join(errs...)
}

// condition builds a condition from a check: True when err is nil.
func condition(typ string, err error, okReason, failReason string) metav1.Condition {
	c := metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: okReason, Message: ""}
	if err != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, failReason, err.Error()
	}
	return c
}

// cidrString is n in CIDR notation, "" for none: a Node in
// networkPolicyOnly mode has no podCIDR of its own.
func cidrString(n *net.IPNet) string {
	if n == nil {
		return ""
	}
	return n.String()
}

// AgentInfo computes this Node's AgentInfo status now. The conditions
// lack APIConnected (the writer knows) and their transition times.
func (in *Inspector) AgentInfo(ctx context.Context) (localapi.AgentInfo, error) {
	d := in.d
	ovs, err := d.Appctl.Version(ctx)
	if err != nil {
		ovs = "unknown"
	}
	st := opsv1alpha1.AgentInfoStatus{
		Version:           version.Version(),
		Capabilities:      []string{cpv1alpha1.PodRealizationSlicesCapability},
		StartTime:         metav1.NewTime(d.StartTime),
		LastHeartbeatTime: metav1.NewTime(time.Now()),
		OVS:               opsv1alpha1.OVSInfo{Version: ovs, DatapathType: d.Config.OVSDatapathType, Bridge: d.Config.BridgeName},
		TunnelType:        d.Config.TunnelType,
		TrafficMode:       d.TrafficMode,
		NodeIP:            d.Bridge.NodeIP.String(),
		PodCIDR:           cidrString(d.Bridge.PodCIDR),
		PodCount:          int32(len(d.Pods.Attachments())),
		FlowCount:         int32(d.Flows.Count()),
	}
	if d.Peers != nil {
		st.PeerCount = int32(d.Peers())
	}
	counts := d.Flows.CountByTable()
	for _, ti := range pipeline.Tables() {
		st.FlowTables = append(st.FlowTables, opsv1alpha1.TableFlows{Table: ti.Name, ID: int32(ti.Table), Flows: int32(counts[uint8(ti.Table)])})
		delete(counts, uint8(ti.Table))
	}
	var others []uint8
	for t := range counts {
		others = append(others, t)
	}
	sort.Slice(others, func(i, j int) bool { return others[i] < others[j] })
	for _, t := range others {
		st.FlowTables = append(st.FlowTables, opsv1alpha1.TableFlows{Table: tableName(t), ID: int32(t), Flows: int32(counts[t])})
	}
	policies := error(nil)
	if d.Policy != nil {
		st.NetworkPolicyCount = int32(len(d.Policy.View().Policies))
		st.RealizedPolicies = d.Policy.RealizedPolicies()
		policies = d.Policy.Realized()
	}
	st.Conditions = []metav1.Condition{
		condition(opsv1alpha1.AgentOVSConnected, OVSConnected(d.OVSDB, d.OpenFlow), "Connected", "Disconnected"),
		condition(opsv1alpha1.AgentPoliciesRealized, policies, "Realized", "NotRealized"),
		condition(opsv1alpha1.AgentReady, d.Probes.Ready.Err(), "Ready", "NotReady"),
	}
	return st, nil
}
