package tunnel

import "testing"

func TestPickType(t *testing.T) {
	for _, tc := range []struct {
		name       string
		configured string
		previous   string
		peers      map[string]int
		userspace  bool
		want       string
		from       TypeSource
	}{
		{"fresh userspace cluster", "", "", nil, true, VXLAN, FromDefault},
		{"fresh kernel cluster", "", "", nil, false, Geneve, FromDefault},
		{"configured wins over everything", GRE, Geneve, map[string]int{VXLAN: 5}, true, GRE, FromConfig},
		{"a restart keeps its type", "", Geneve, map[string]int{VXLAN: 5}, true, Geneve, FromThisNode},
		{"an unknown previous type is ignored", "", "ipip", map[string]int{Geneve: 1}, true, Geneve, FromPeers},
		{"a joining Node follows the cluster", "", "", map[string]int{Geneve: 3}, true, Geneve, FromPeers},
		{"the majority", "", "", map[string]int{Geneve: 3, VXLAN: 2, GRE: 1}, true, Geneve, FromPeers},
		{"a tie goes to the default", "", "", map[string]int{Geneve: 2, VXLAN: 2}, true, VXLAN, FromPeers},
		{"a tie goes to the default, kernel", "", "", map[string]int{Geneve: 2, VXLAN: 2}, false, Geneve, FromPeers},
		{"a tie without the default goes by name", "", "", map[string]int{VXLAN: 1, GRE: 1}, false, GRE, FromPeers},
		{"peers reporting nothing or nonsense", "", "", map[string]int{"": 7, "ipip": 9, Geneve: 0}, true, VXLAN, FromDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from := PickType(tc.configured, tc.previous, tc.peers, tc.userspace)
			if got != tc.want || from != tc.from {
				t.Errorf("PickType(%q, %q, %v, %v) = %q (%s), want %q (%s)",
					tc.configured, tc.previous, tc.peers, tc.userspace, got, from, tc.want, tc.from)
			}
		})
	}
}
