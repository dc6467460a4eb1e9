package pipeline_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
)

// testPort is one port of a test bridge: an internal port, or, with
// geneve, a flow-based Geneve port (remote_ip and key set by the flows,
// ovs-vswitchd.conf.db(5), "Tunnel Options").
type testPort struct {
	name   string
	ofport int
	geneve bool
}

// The ports the pipeline tests share, at the ofports their Bridge values
// name (TunnelPort 1, GatewayPort 2, Pods from 3, SegmentPort 5).
var (
	geneveTun0 = testPort{"tun0", 1, true}
	// internalTun0 stands for the kernel VXLAN device: an ordinary port.
	internalTun0 = testPort{"tun0", 1, false}
	gw0          = testPort{"gw0", 2, false}
	seg0         = testPort{"seg0", 5, false}
)

// podPort returns a Pod's port (internal), name, at ofport.
func podPort(name string, ofport int) testPort { return testPort{name, ofport, false} }

// testBridge starts OVS with a netdev bridge br-int (secure fail mode,
// OpenFlow 1.0, 1.3 and 1.5) holding ports at their requested ofports,
// dials its OpenFlow socket, and returns both with a context for the
// test's calls (2 minutes; the client itself lives until the test ends);
// all end with the test. Each port is added in
// a transaction of its own, so the datapath numbers them in the order
// given (br-int first), as traces that read datapath actions expect.
func testBridge(t *testing.T, ports ...testPort) (*ovstest.OVS, *of.Client, context.Context) {
	t.Helper()
	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	for _, p := range ports {
		args := []string{"add-port", "br-int", p.name, "--", "set", "interface", p.name, "type=internal"}
		if p.geneve {
			args = append(args[:len(args)-1], "type=geneve", "options:remote_ip=flow", "options:key=flow")
		}
		o.Run("ovs-vsctl", append(args, "ofport_request="+strconv.Itoa(p.ofport))...)
	}
	life, end := context.WithCancel(context.Background())
	t.Cleanup(end)
	ctx, cancel := context.WithTimeout(life, 2*time.Minute)
	t.Cleanup(cancel)
	c, err := of.Dial(life, o.MgmtSocket("br-int"), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return o, c, ctx
}

// addFlows adds the flows of every set in one bundle.
func addFlows(ctx context.Context, t *testing.T, c *of.Client, sets ...[]of.Flow) {
	t.Helper()
	var mods []of.FlowMod
	for _, fs := range sets {
		for _, f := range fs {
			mods = append(mods, of.FlowMod{Op: of.OpAdd, Flow: f})
		}
	}
	if err := c.Apply(ctx, mods); err != nil {
		t.Fatal(err)
	}
}
