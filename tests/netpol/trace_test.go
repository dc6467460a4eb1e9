package netpol

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestTracePacketFlow(t *testing.T) {
	f, err := TracePacket{InPort: 1, TunSrc: "198.18.0.11", TunDst: "198.18.0.12", Protocol: corev1.ProtocolSCTP,
		DLSrc: "06:00:1c:ea:43:de", DLDst: "0e:5e:1e:00:00:01", NWSrc: "10.244.0.2", NWDst: "10.244.1.2", DstPort: 80}.Flow()
	if err != nil {
		t.Fatal(err)
	}
	want := "in_port=1,tun_src=198.18.0.11,tun_dst=198.18.0.12,sctp,dl_src=06:00:1c:ea:43:de,dl_dst=0e:5e:1e:00:00:01," +
		"nw_src=10.244.0.2,nw_dst=10.244.1.2,nw_ttl=64,sctp_src=40000,sctp_dst=80"
	if f != want {
		t.Errorf("flow:\n got %s\nwant %s", f, want)
	}
	if _, err := (TracePacket{Protocol: corev1.ProtocolTCP}).Flow(); err == nil {
		t.Errorf("flow without addresses: no error")
	}
}
