// Package realization defines the digest that ties a Pod's CNI ADD to the
// policy state computed for it. The controller records, per Pod, the digest
// of the policy state that applies to the Pod (controlplane PodRealization);
// an agent computes the same digest from what it has installed, and a CNI
// ADD returns only once both agree — so a Pod never runs before its
// policies are enforced.
package realization

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strconv"
)

// Policy is what the digest covers of one computed NetworkPolicy that
// applies to the Pod: its name, a hash of its spec (SpecHash), and, for
// every AddressGroup key its rules reference, the number of slices the
// group has (so the agent also waits for a new group's objects).
type Policy struct {
	Name     string
	SpecHash string
	// AddressGroupSlices maps group key → slice count.
	AddressGroupSlices map[string]int
}

// Digest returns the first 128 bits of the SHA-256 of the Pod's policy
// state, in hex (32 digits); the
// order of policies does not matter. No policies give the digest of the
// empty state, which is a valid acknowledgement too ("nothing applies").
func Digest(policies []Policy) string {
	ps := append([]Policy(nil), policies...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
	h := sha256.New()
	for _, p := range ps {
		keys := make([]string, 0, len(p.AddressGroupSlices))
		for k := range p.AddressGroupSlices {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.Write([]byte(p.Name + "\x00" + p.SpecHash + "\x00"))
		for _, k := range keys {
			h.Write([]byte(k + "=" + itoa(p.AddressGroupSlices[k]) + "\x00"))
		}
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:16]) // 32 hex digits
}

// SpecHash hashes any JSON-encodable spec (the controller and the agent
// hash the same NetworkPolicySpec value, so they agree).
func SpecHash(spec any) string {
	b, err := json.Marshal(spec)
	if err != nil {
		return "unencodable"
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:16]) // 32 hex digits
}

// PodKey is the key of a Pod in PodRealizationSpec.Pods.
func PodKey(namespace, name, uid string) string { return namespace + "/" + name + "/" + uid }

func itoa(i int) string { return strconv.Itoa(i) }
