package tunnel

import "testing"

func TestPickType(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    TypeEvidence
		want string
		from TypeSource
	}{
		{"fresh userspace cluster", TypeEvidence{UserspaceDatapath: true}, VXLAN, FromDefault},
		{"fresh kernel cluster", TypeEvidence{}, Geneve, FromDefault},
		{"configured wins over everything",
			TypeEvidence{Configured: GRE, Bridge: VXLAN, Reported: Geneve, Peers: map[string]int{VXLAN: 5}, UserspaceDatapath: true}, GRE, FromConfig},
		{"a restart keeps its tunnel port's type",
			TypeEvidence{Bridge: Geneve, Reported: GRE, Peers: map[string]int{VXLAN: 5}, UserspaceDatapath: true}, Geneve, FromBridge},
		{"without a tunnel port, its AgentInfo's",
			TypeEvidence{Reported: Geneve, Peers: map[string]int{VXLAN: 5}, UserspaceDatapath: true}, Geneve, FromAgentInfo},
		{"unknown own types are ignored",
			TypeEvidence{Bridge: "stt", Reported: "ipip", Peers: map[string]int{Geneve: 1}, UserspaceDatapath: true}, Geneve, FromPeers},
		{"a joining Node follows the cluster", TypeEvidence{Peers: map[string]int{Geneve: 3}, UserspaceDatapath: true}, Geneve, FromPeers},
		{"the majority", TypeEvidence{Peers: map[string]int{Geneve: 3, VXLAN: 2, GRE: 1}, UserspaceDatapath: true}, Geneve, FromPeers},
		{"a tie goes to the default", TypeEvidence{Peers: map[string]int{Geneve: 2, VXLAN: 2}, UserspaceDatapath: true}, VXLAN, FromPeers},
		{"a tie goes to the default, kernel", TypeEvidence{Peers: map[string]int{Geneve: 2, VXLAN: 2}}, Geneve, FromPeers},
		{"a tie without the default goes by name", TypeEvidence{Peers: map[string]int{VXLAN: 1, GRE: 1}}, GRE, FromPeers},
		{"peers reporting nothing or nonsense",
			TypeEvidence{Peers: map[string]int{"": 7, "ipip": 9, Geneve: 0}, UserspaceDatapath: true}, VXLAN, FromDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Peers is a map: repeat so that an order-dependent tie shows.
			for range 20 {
				got, from := PickType(tc.e)
				if got != tc.want || from != tc.from {
					t.Fatalf("PickType(%+v) = %q (%s), want %q (%s)", tc.e, got, from, tc.want, tc.from)
				}
			}
		})
	}
}
