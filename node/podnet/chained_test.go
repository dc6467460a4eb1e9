package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
	cniserver "github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/tests/netnstest"
)

func sh(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", argv, err, out)
	}
	return string(out)
}

func readSysctl(t *testing.T, dev, name string) string {
	t.Helper()
	b, err := os.ReadFile(sysctlPath(dev, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestChainedAttachment runs Debian's ptp plugin (host-local IPAM) for a
// Pod, then seine's chained ADD with ptp's result, in a fresh network
// namespace with its own OVS: the Pod's host veth becomes a port of the
// bridge, the host route to the Pod moves from the veth to the gateway
// (source: the Node IP), the veth stops answering ARP and forwarding, and
// the Pod's flows are in; CHECK passes; a restarted backend restores it;
// DEL puts the route and sysctls back as ptp left them and CHECK fails;
// and a Pod whose veth vanished while the daemon was down is released at
// restore, its route on the gateway too.
func TestChainedAttachment(t *testing.T) {
	if _, err := os.Stat("/usr/lib/cni/ptp"); err != nil {
		t.Skip("Debian's containernetworking-plugins (ptp) not installed: run make deps")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	podNS := "seine-ptest-" + hex.EncodeToString(b)
	netnstest.Run(t, func() {
		sh(t, "ip", "netns", "add", podNS)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", podNS).Run() })
		chainedInNetns(t, "/run/netns/"+podNS)
	})
}

func chainedInNetns(t *testing.T, podNetns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := zaptest.NewLogger(t)
	// The Node's transport address (the routes' source) on a veth.
	sh(t, "ip", "link", "add", "tr0", "type", "veth", "peer", "name", "tr1")
	sh(t, "ip", "addr", "add", "198.18.77.1/24", "dev", "tr0")
	sh(t, "ip", "link", "set", "tr0", "up")
	sh(t, "ip", "link", "set", "tr1", "up")

	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev", "fail_mode=secure")
	o.Run("ovs-vsctl", "add-port", "br-int", "gw0", "--", "set", "interface", "gw0", "type=internal", "ofport_request=2")
	for i := 0; ; i++ {
		if _, err := netlink.LinkByName("gw0"); err == nil {
			break
		}
		if i == 50 {
			t.Fatal("gw0 did not appear")
		}
		time.Sleep(100 * time.Millisecond)
	}
	sh(t, "ip", "link", "set", "gw0", "up")

	// The primary: ptp with host-local, as a runtime runs it.
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"routed","plugins":[{"type":"ptp","ipMasq":false,
		"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.77.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}]}`,
		filepath.Join(t.TempDir(), "ipam"))
	list, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni"}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{ContainerID: "chained1", NetNS: podNetns, IfName: "eth0"}
	res, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("ptp ADD: %v", err)
	}
	t.Cleanup(func() { _ = cni.DelNetworkList(context.Background(), list, rt) })
	prev, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	podIP := prev.IPs[0].Address.IP.String()
	var veth string
	for _, itf := range prev.Interfaces {
		if itf.Sandbox == "" {
			veth = itf.Name
		}
	}
	routeTo := func() string { return strings.TrimSpace(sh(t, "ip", "-4", "route", "show", podIP)) }
	if r := routeTo(); !strings.Contains(r, "dev "+veth) {
		t.Fatalf("ptp's route: %q, want dev %s", r, veth)
	}
	sysBefore := readSysctl(t, veth, "arp_ignore") + "/" + readSysctl(t, veth, "forwarding")

	db, err := ovsdb.Dial(ctx, o.DBSocket(), log.Named("ovsdb"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	ofc, err := of.Dial(ctx, o.MgmtSocket("br-int"), log.Named("of"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ofc.Close() })
	gwMAC, _ := net.ParseMAC("0a:00:00:00:00:01")
	cfg := Config{BridgeName: "br-int", Chained: true, Gateway: "gw0", NodeIP: net.ParseIP("198.18.77.1"), DisableTxChecksum: true,
		Bridge: pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: gwMAC, NodeIP: net.ParseIP("198.18.77.1"), PolicyOnly: true}}
	flows := flowsync.New(ofc)
	be := New(cfg, nil, db, flows, log.Named("podnet"))
	be.MarkReady()
	req := &cniserver.Request{Command: cniserver.CmdAdd, ContainerID: "chained1", Netns: podNetns, IfName: "eth0",
		PodNamespace: "ns", PodName: "web", NetConf: &cniserver.NetConf{NetConf: types.NetConf{PrevResult: prev}}}

	// Without a prevResult (seine not chained after a primary): refused.
	bare := *req
	bare.NetConf = &cniserver.NetConf{}
	if _, err := be.Add(ctx, &bare); err == nil || !strings.Contains(err.Error(), "chained after") {
		t.Fatalf("ADD without prevResult: %v", err)
	}
	out, err := be.Add(ctx, req)
	if err != nil {
		t.Fatalf("chained ADD: %v", err)
	}
	if out.IPs[0].Address.IP.String() != podIP {
		t.Errorf("ADD did not pass ptp's result on: %+v", out)
	}
	attached := func() {
		t.Helper()
		if r := routeTo(); !strings.Contains(r, "dev gw0") || !strings.Contains(r, "src 198.18.77.1") || strings.Contains(r, veth) {
			t.Errorf("route to the Pod: %q, want dev gw0 src 198.18.77.1 only", r)
		}
		if ports := o.Run("ovs-vsctl", "list-ports", "br-int"); !strings.Contains(ports, veth) {
			t.Errorf("%s is not a port of br-int:\n%s", veth, ports)
		}
		if got := readSysctl(t, veth, "arp_ignore") + "/" + readSysctl(t, veth, "forwarding"); got != "8/0" {
			t.Errorf("arp_ignore/forwarding of %s: %s, want 8/0", veth, got)
		}
	}
	attached()
	// The same ADD again, without a DEL: refused, and the attachment
	// stays as it is.
	var cerr *cniserver.Error
	if _, err := be.Add(ctx, req); !errors.As(err, &cerr) || cerr.Code != types.ErrInvalidEnvironmentVariables {
		t.Errorf("second chained ADD: %v, want CNI error 4", err)
	}
	attached()
	dump := o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", o.MgmtSocket("br-int"))
	if !strings.Contains(dump, "nw_dst="+podIP) || !strings.Contains(dump, "nw_src="+podIP) {
		t.Errorf("no flows for %s:\n%s", podIP, dump)
	}
	if err := be.Check(ctx, req, prev); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	// A restarted daemon finds it attached.
	be2 := New(cfg, nil, db, flows, log.Named("podnet2"))
	be2.MarkReady()
	if n, err := be2.RestorePods(ctx); err != nil || n != 1 {
		t.Fatalf("RestorePods = %d, %v; want 1", n, err)
	}
	attached()

	if err := be2.Del(ctx, req); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if r := routeTo(); !strings.Contains(r, "dev "+veth) || strings.Contains(r, "gw0") {
		t.Errorf("route after DEL: %q, want ptp's on %s", r, veth)
	}
	if got := readSysctl(t, veth, "arp_ignore") + "/" + readSysctl(t, veth, "forwarding"); got != sysBefore {
		t.Errorf("sysctls after DEL: %s, want %s as ptp left them", got, sysBefore)
	}
	if ports := o.Run("ovs-vsctl", "list-ports", "br-int"); strings.Contains(ports, veth) {
		t.Errorf("%s still a port after DEL", veth)
	}
	if err := be2.Check(ctx, req, prev); err == nil {
		t.Error("CHECK passed after DEL")
	}
	if err := be2.Del(ctx, req); err != nil {
		t.Errorf("second DEL: %v", err)
	}

	// Attached again, then the veth vanishes while no daemon runs.
	if _, err := be2.Add(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		t.Fatal(err)
	}
	be3 := New(cfg, nil, db, flows, log.Named("podnet3"))
	if n, err := be3.RestorePods(ctx); err != nil || n != 0 {
		t.Fatalf("RestorePods after the veth went = %d, %v; want 0", n, err)
	}
	if r := routeTo(); r != "" {
		t.Errorf("route to a gone Pod left: %q", r)
	}
	if ports := o.Run("ovs-vsctl", "list-ports", "br-int"); strings.Contains(ports, veth) {
		t.Errorf("port of a gone Pod left")
	}
}
