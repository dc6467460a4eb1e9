package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// bulkPort is where bulk receivers listen.
const bulkPort = 9100

// bulkSize is what each transfer sends: enough for TCP to grow 64 KiB
// segments when segmentation offload is on.
const bulkSize = 8 << 20

// bulkReceiver accepts connections one at a time on l, reads each to its
// end and answers with the SHA-256 of what it read.
func bulkReceiver(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			h := sha256.New()
			if _, err := io.Copy(h, c); err != nil {
				return
			}
			_, _ = c.Write(h.Sum(nil))
		}()
	}
}

// sendBulk sends bulkSize random bytes over conn, closes its sending side
// and checks the digest the receiver answers with.
func sendBulk(conn net.Conn) error {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(45 * time.Second))
	data := make([]byte, bulkSize)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	start := time.Now()
	if _, err := conn.Write(data); err != nil {
		return fmt.Errorf("sending after %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(conn)
	if err != nil {
		return fmt.Errorf("reading the digest: %w", err)
	}
	if !bytes.Equal(got, want[:]) {
		return errors.New("the receiver read different bytes")
	}
	return nil
}

// dialFromNetNS opens a TCP connection from inside a named network
// namespace (a Node's or the external host's).
func dialFromNetNS(ctx context.Context, netnsName, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(filepath.Join("/run/netns", netnsName), func(ns.NetNS) error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return conn, err
}

// TestLargeTransfers sends 8 MiB over TCP, and checks every byte arrives,
// on each path where large (segmentation-offloaded) packets meet another
// part of the datapath: Pod to Pod on one Node and across Nodes (the
// tunnel), through a ClusterIP (conntrack DNAT of large segments) from
// the same and from another Node, from the external host through a
// NodePort on each Node (the host's DNAT, the gateway's tap, SNAT to a
// gateway IP, the tunnel), and from a Pod to the external host
// (masquerade through the gateway). With userspace TSO a path that cannot
// carry large packets drops them, and the transfer stalls.
func TestLargeTransfers(t *testing.T) {
	c := shared
	nsName := "bulk"
	server := svcPods(t, c, nsName, "bulk", 0)[0]
	clients := svcPods(t, c, nsName, "bulk-client", 0, 1)
	svc := createService(t, c, nsName, "bulk", "bulk", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "bulk", Port: bulkPort,
			Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(bulkPort)})
	})
	l, err := c.ListenIn(server.ns, server.name, ":"+strconv.Itoa(bulkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go bulkReceiver(l)

	extNS, extIP := c.ExternalHost()
	var extL net.Listener
	err = ns.WithNetNSPath(filepath.Join("/run/netns", extNS), func(ns.NetNS) error {
		var err error
		extL, err = net.Listen("tcp", ":"+strconv.Itoa(bulkPort))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer extL.Close()
	go bulkReceiver(extL)

	nodePort := nodePortOf(t, svc, "bulk")
	fromPod := func(p podRef, addr string) func(context.Context) (net.Conn, error) {
		return func(ctx context.Context) (net.Conn, error) { return c.DialFrom(ctx, p.ns, p.name, addr) }
	}
	fromExt := func(addr string) func(context.Context) (net.Conn, error) {
		return func(ctx context.Context) (net.Conn, error) { return dialFromNetNS(ctx, extNS, addr) }
	}
	hostPort := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	nodes := c.Nodes()
	paths := []struct {
		name string
		dial func(context.Context) (net.Conn, error)
	}{
		{"Pod to Pod on one Node", fromPod(clients[0], hostPort(server.ip, bulkPort))},
		{"Pod to Pod across Nodes", fromPod(clients[1], hostPort(server.ip, bulkPort))},
		{"ClusterIP, endpoint on the same Node", fromPod(clients[0], hostPort(svc.Spec.ClusterIP, bulkPort))},
		{"ClusterIP, endpoint on another Node", fromPod(clients[1], hostPort(svc.Spec.ClusterIP, bulkPort))},
		{"NodePort of the endpoint's Node from outside", fromExt(hostPort(nodes[0].IP, nodePort))},
		{"NodePort of another Node from outside", fromExt(hostPort(nodes[1].IP, nodePort))},
		{"Pod to the external host", fromPod(server, hostPort(extIP, bulkPort))},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			var last error
			// The Service may take a moment to be programmed; a connection
			// that opened must carry every byte.
			eventually(t, 20*time.Second, "connecting", func() error {
				conn, err := p.dial(testCtx(t, 3*time.Second))
				if err != nil {
					return err
				}
				last = sendBulk(conn)
				return nil
			})
			if last != nil {
				t.Fatalf("%d bytes: %v", bulkSize, last)
			}
		})
	}
}

// TestShortConnectionsShareDatapathFlows opens connPerFlowProbe short TCP
// connections, one after another, between two Pods of one Node and checks
// that the datapath flows (megaflows) on that Node did not grow with them:
// a flow that reads a packet's ports (for example to save them for the
// NAT checksum detour) matches one connection exactly, so every new
// connection would take an upcall to ovs-vswitchd and a flow of its own,
// and under a high connection rate the datapath's flow limit is reached.
// Only connections that conntrack may NAT may pay that.
func TestShortConnectionsShareDatapathFlows(t *testing.T) {
	const connPerFlowProbe = 200
	c := shared
	nsName := "connflows"
	server := svcPods(t, c, nsName, "connflows", 0)[0]
	client := svcPods(t, c, nsName, "connflows-client", 0)[0]
	l, err := c.ListenIn(server.ns, server.name, ":"+strconv.Itoa(bulkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, conn)
			conn.Close()
		}
	}()
	addr := net.JoinHostPort(server.ip, strconv.Itoa(bulkPort))
	for i := range connPerFlowProbe {
		conn, err := c.DialFrom(testCtx(t, 5*time.Second), client.ns, client.name, addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_, err = conn.Write([]byte("ping"))
		conn.Close()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	// The datapath flows of this client's TCP packets that match a port.
	var perConn []string
	for _, f := range strings.Split(ovs(t, c.Nodes()[0], "ovs-appctl", "dpctl/dump-flows"), "\n") {
		if strings.Contains(f, "proto=6") && strings.Contains(f, "tcp(") && strings.Contains(f, client.ip+",") {
			perConn = append(perConn, f)
		}
	}
	if len(perConn) > connPerFlowProbe/10 {
		t.Fatalf("%d short connections left %d datapath flows matching the client's TCP ports, e.g.:\n%s",
			connPerFlowProbe, len(perConn), strings.Join(perConn[:min(5, len(perConn))], "\n"))
	}
	t.Logf("%d short connections, %d datapath flows matching the client's TCP ports", connPerFlowProbe, len(perConn))
}
