// Package ipam allocates Pod IPv4 addresses from a Node's podCIDR and keeps
// the allocations on disk, so that a daemon restart never hands out an
// address whose Pod still exists.
//
// The first address of the podCIDR is the gateway and is never allocated;
// neither are the network and broadcast addresses. Allocation is next-fit:
// it continues after the last address handed out, so a released address is
// reused as late as possible (connections to a deleted Pod should not reach
// its successor).
package ipam

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// ErrExhausted is returned (wrapped) when every address of the podCIDR is in use.
var ErrExhausted = errors.New("IP pool exhausted")

// Owner identifies what holds an address: the CNI attachment (container ID
// and interface name, CNI spec "Container Network Interface"), plus the Pod
// for operators.
type Owner struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Namespace   string `json:"namespace,omitempty"`
	Pod         string `json:"pod,omitempty"`
}

func (o Owner) key() string { return o.ContainerID + "/" + o.IfName }

type state struct {
	PodCIDR     string           `json:"podCIDR"`
	Last        string           `json:"last,omitempty"`
	Allocations map[string]Owner `json:"allocations"` // IP -> owner
}

// Allocator hands out addresses of one podCIDR. It is safe for concurrent use.
type Allocator struct {
	mu      sync.Mutex
	path    string
	podCIDR *net.IPNet
	first   uint32 // first allocatable address (gateway + 1)
	last    uint32 // last allocatable address (broadcast - 1)
	st      state
	byOwner map[string]uint32
}

// Open loads (or creates) the allocation file in dir for podCIDR (IPv4, at
// most /30). If the file records a different podCIDR, for instance after
// the Node object was recreated, the old allocations cannot be valid and are
// discarded; the returned bool reports that.
func Open(dir string, podCIDR *net.IPNet) (*Allocator, bool, error) {
	ip4 := podCIDR.IP.To4()
	ones, bits := podCIDR.Mask.Size()
	if ip4 == nil || bits != 32 || ones > 30 {
		return nil, false, fmt.Errorf("podCIDR %s: need an IPv4 prefix of /30 or larger", podCIDR)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("creating IPAM directory: %w", err)
	}
	base := binary.BigEndian.Uint32(ip4)
	size := uint32(1) << (32 - ones)
	a := &Allocator{
		path:    filepath.Join(dir, "allocations.json"),
		podCIDR: &net.IPNet{IP: ip4, Mask: podCIDR.Mask},
		first:   base + 2,
		last:    base + size - 2,
		byOwner: map[string]uint32{},
	}
	reset := false
	b, err := os.ReadFile(a.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, false, fmt.Errorf("reading IPAM state: %w", err)
	default:
		if err := json.Unmarshal(b, &a.st); err != nil {
			return nil, false, fmt.Errorf("IPAM state %s is corrupt: %w", a.path, err)
		}
		if a.st.PodCIDR != a.podCIDR.String() {
			reset = len(a.st.Allocations) > 0
			a.st = state{}
		}
	}
	a.st.PodCIDR = a.podCIDR.String()
	if a.st.Allocations == nil {
		a.st.Allocations = map[string]Owner{}
	}
	for ipStr, o := range a.st.Allocations {
		ip := net.ParseIP(ipStr).To4()
		if ip == nil || !a.podCIDR.Contains(ip) {
			delete(a.st.Allocations, ipStr)
			continue
		}
		a.byOwner[o.key()] = binary.BigEndian.Uint32(ip)
	}
	if reset {
		if err := a.save(); err != nil {
			return nil, false, err
		}
	}
	return a, reset, nil
}

// PodCIDR returns the range this allocator serves.
func (a *Allocator) PodCIDR() *net.IPNet { return a.podCIDR }

// Gateway returns the first address of the podCIDR, reserved for the gateway.
func (a *Allocator) Gateway() net.IP { return u32ToIP(a.first - 1) }

// Allocate returns the address held by owner, or allocates and persists a
// new one. The error wraps ErrExhausted when no address is free.
func (a *Allocator) Allocate(owner Owner) (net.IP, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byOwner[owner.key()]; ok {
		return u32ToIP(ip), nil
	}
	n := a.last - a.first + 1
	start := a.first
	if l := net.ParseIP(a.st.Last).To4(); l != nil && a.podCIDR.Contains(l) {
		start = binary.BigEndian.Uint32(l) + 1
	}
	for i := uint32(0); i < n; i++ {
		cand := start + i
		if cand > a.last || cand < a.first {
			cand = a.first + (cand-a.first)%n
		}
		s := u32ToIP(cand).String()
		if _, used := a.st.Allocations[s]; used {
			continue
		}
		a.st.Allocations[s] = owner
		prevLast := a.st.Last
		a.st.Last = s
		if err := a.save(); err != nil {
			delete(a.st.Allocations, s)
			a.st.Last = prevLast
			return nil, err
		}
		a.byOwner[owner.key()] = cand
		return u32ToIP(cand), nil
	}
	return nil, fmt.Errorf("podCIDR %s: all %d addresses in use: %w", a.podCIDR, n, ErrExhausted)
}

// Release frees the address held by the attachment; releasing an unknown
// attachment is not an error (CNI DEL must be idempotent).
func (a *Allocator) Release(containerID, ifName string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := Owner{ContainerID: containerID, IfName: ifName}.key()
	ip, ok := a.byOwner[k]
	if !ok {
		return nil
	}
	s := u32ToIP(ip).String()
	o := a.st.Allocations[s]
	delete(a.st.Allocations, s)
	if err := a.save(); err != nil {
		a.st.Allocations[s] = o
		return err
	}
	delete(a.byOwner, k)
	return nil
}

// Lookup returns the address of an attachment, if it holds one.
func (a *Allocator) Lookup(containerID, ifName string) (net.IP, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ip, ok := a.byOwner[Owner{ContainerID: containerID, IfName: ifName}.key()]
	if !ok {
		return nil, false
	}
	return u32ToIP(ip), true
}

// Allocation is one address in use.
type Allocation struct {
	IP    net.IP
	Owner Owner
}

// List returns every allocation, ordered by address.
func (a *Allocator) List() []Allocation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Allocation, 0, len(a.st.Allocations))
	for s, o := range a.st.Allocations {
		out = append(out, Allocation{IP: net.ParseIP(s).To4(), Owner: o})
	}
	sort.Slice(out, func(i, j int) bool {
		return binary.BigEndian.Uint32(out[i].IP) < binary.BigEndian.Uint32(out[j].IP)
	})
	return out
}

// save writes the state atomically: temporary file, fsync, rename.
func (a *Allocator) save() error {
	b, err := json.MarshalIndent(a.st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(a.path), ".allocations-*")
	if err != nil {
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	if err := os.Rename(tmp.Name(), a.path); err != nil {
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	return nil
}

func u32ToIP(v uint32) net.IP {
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, v)
	return ip
}
