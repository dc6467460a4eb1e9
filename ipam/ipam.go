// Package ipam allocates Pod IPv4 addresses from a Node's podCIDR and keeps
// the allocations on disk, so that a daemon restart never hands out an
// address whose Pod still exists.
//
// The first address of the podCIDR is the gateway and is never allocated;
// neither are the network and broadcast addresses. Allocation is next-fit:
// it continues after the last address handed out, so a released address is
// reused as late as possible (connections to a deleted Pod should not reach
// its successor).
//
// Every change is on disk before the call that made it returns (for
// Reserve, before the durable function it returns gives nil). Concurrent
// calls share the write (group commit): a change is made in memory, and
// one caller at a time writes the whole state (temporary file, fsync,
// rename, fsync of the directory: a file's new directory entry reaches
// the disk only with the directory's own fsync, fsync(2)), covering every
// change made before its write began; the others wait for a write that
// covers theirs. So N concurrent ADDs cost one or two writes, not N, and
// no lock is held while the disk works.
package ipam

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// stateFile is the name of the allocation file in the Allocator's
// directory, and tempPattern (os.CreateTemp) that of the temporary files
// it is written through.
const (
	stateFile   = "allocations.json"
	tempPattern = ".allocations-*"
)

// ErrExhausted is returned (wrapped) when every address of the podCIDR is in use.
var ErrExhausted = errors.New("IP pool exhausted")

// Owner identifies what holds an address: the CNI attachment (container ID
// and interface name, CNI spec "Container Network Interface"), the CNI
// network it was made for (empty in allocations recorded before the
// network was), plus the Pod for operators. The container ID and interface
// name alone key the allocation.
type Owner struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Network     string `json:"network,omitempty"`
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

	// Group commit: version counts the changes to st, saved is the
	// version on disk, saving is set while one caller writes (without
	// mu), and written is broadcast when it is done.
	version  uint64
	saved    uint64
	saving   bool
	flushing bool // a background flusher runs (flushLocked)
	written  *sync.Cond
	writes   int // files written, for tests
}

// Open loads (or creates) the allocation file in dir for podCIDR (IPv4, at
// most /30). If the file records a different podCIDR, for instance after
// the Node object was recreated, the old allocations cannot be valid and are
// discarded; the returned bool reports that.
//
// The directories of dir's path that Open creates (mode 0700) are synced
// to disk with their parents' fsync. dir belongs to one Allocator at a
// time: Open removes the temporary files a
// write interrupted by a crash left in it (any other Allocator's
// in-flight write would fail). Errors: a podCIDR that is not IPv4 or
// smaller than /30, creating or syncing dir, removing a leftover file,
// reading or decoding the allocation file, rewriting it after a reset.
func Open(dir string, podCIDR *net.IPNet) (*Allocator, bool, error) {
	ip4 := podCIDR.IP.To4()
	ones, bits := podCIDR.Mask.Size()
	if ip4 == nil || bits != 32 || ones > 30 {
		return nil, false, fmt.Errorf("podCIDR %s: need an IPv4 prefix of /30 or larger", podCIDR)
	}
	if err := mkdirSynced(dir); err != nil {
		return nil, false, err
	}
	if err := removeTemps(dir); err != nil {
		return nil, false, err
	}
	base := binary.BigEndian.Uint32(ip4)
	size := uint32(1) << (32 - ones)
	a := &Allocator{
		path:    filepath.Join(dir, stateFile),
		podCIDR: &net.IPNet{IP: ip4, Mask: podCIDR.Mask},
		first:   base + 2,
		last:    base + size - 2,
		byOwner: map[string]uint32{},
	}
	a.written = sync.NewCond(&a.mu)
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
		if err := write(a.path, a.st); err != nil {
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
// new one: Reserve, then wait until it is on disk. The error wraps
// ErrExhausted when no address is free.
func (a *Allocator) Allocate(owner Owner) (net.IP, error) {
	ip, durable, err := a.Reserve(owner)
	if err != nil {
		return nil, err
	}
	if err := durable(); err != nil {
		return nil, err
	}
	return ip, nil
}

// Reserve returns the address held by owner, or picks a new one and holds
// it in memory at once, starting the write that persists it. durable
// blocks until the address is on disk; if the write fails, it releases
// the reservation (unless the owner released it already) and returns the
// error. The caller may do other work in between, but must not report the
// address to anyone before durable returns nil: so a CNI ADD overlaps
// the fsync with creating the Pod's interface. The error wraps
// ErrExhausted when no address is free.
func (a *Allocator) Reserve(owner Owner) (ip net.IP, durable func() error, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.byOwner[owner.key()]; ok {
		// Possibly still in flight for an earlier call: wait for what is
		// in memory now.
		v := a.version
		return u32ToIP(cur), func() error {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.persistLocked(v)
		}, nil
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
		a.st.Last = s
		a.byOwner[owner.key()] = cand
		a.version++
		v := a.version
		// Start the write now; durable waits for it (or writes again).
		a.flushLocked()
		return u32ToIP(cand), func() error {
			a.mu.Lock()
			defer a.mu.Unlock()
			err := a.persistLocked(v)
			if err != nil && a.byOwner[owner.key()] == cand && a.st.Allocations[s] == owner {
				// Not on disk: undo it (the next write drops it). Last
				// stays: next-fit only needs it to move forward.
				delete(a.st.Allocations, s)
				delete(a.byOwner, owner.key())
				a.version++
			}
			return err
		}, nil
	}
	return nil, nil, fmt.Errorf("podCIDR %s: all %d addresses in use: %w", a.podCIDR, n, ErrExhausted)
}

// Claim records ip as held by owner and persists it: for an attachment
// found on the bridge whose allocation never reached the disk (the daemon
// stopped in the middle of its ADD). Claiming what owner already holds is
// a no-op. Errors: ip outside the allocatable range, or held by another
// attachment (or owner holding another address), a failed write.
func (a *Allocator) Claim(owner Owner, ip net.IP) error {
	ip4 := ip.To4()
	if ip4 == nil || !a.podCIDR.Contains(ip4) {
		return fmt.Errorf("claiming %s: not in podCIDR %s", ip, a.podCIDR)
	}
	v := binary.BigEndian.Uint32(ip4)
	if v < a.first || v > a.last {
		return fmt.Errorf("claiming %s: reserved address of podCIDR %s", ip, a.podCIDR)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := ip4.String()
	if cur, ok := a.byOwner[owner.key()]; ok {
		if cur == v {
			return a.persistLocked(a.version)
		}
		return fmt.Errorf("claiming %s for %s: it holds %s", ip, owner.key(), u32ToIP(cur))
	}
	if o, used := a.st.Allocations[s]; used {
		return fmt.Errorf("claiming %s for %s: held by %s", ip, owner.key(), o.key())
	}
	a.st.Allocations[s] = owner
	a.byOwner[owner.key()] = v
	a.version++
	if err := a.persistLocked(a.version); err != nil {
		if a.byOwner[owner.key()] == v && a.st.Allocations[s] == owner {
			delete(a.st.Allocations, s)
			delete(a.byOwner, owner.key())
			a.version++
		}
		return err
	}
	return nil
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
	delete(a.byOwner, k)
	a.version++
	if err := a.persistLocked(a.version); err != nil {
		// Still on disk: keep it held unless it went to someone else.
		if _, taken := a.st.Allocations[s]; !taken {
			if _, again := a.byOwner[k]; !again {
				a.st.Allocations[s] = o
				a.byOwner[k] = ip
				a.version++
			}
		}
		return err
	}
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

// persistLocked returns once version v of the state (or a later one) is on
// disk. If no write is running, the caller writes the current state itself,
// releasing a.mu meanwhile; otherwise it waits for the running write and
// checks again. A failed write fails its writer only: a waiter whose
// change it covered writes again. a.mu must be held.
func (a *Allocator) persistLocked(v uint64) error {
	for a.saved < v {
		if a.saving {
			a.written.Wait()
			continue
		}
		a.saving = true
		target := a.version
		snap := a.st
		snap.Allocations = maps.Clone(a.st.Allocations)
		a.mu.Unlock()
		b, err := json.MarshalIndent(snap, "", "  ")
		if err == nil {
			err = writeBytes(a.path, b)
		}
		a.mu.Lock()
		a.writes++
		a.saving = false
		if err == nil && target > a.saved {
			a.saved = target
		}
		a.written.Broadcast()
		if err != nil {
			return err
		}
	}
	return nil
}

// flushLocked starts writing the state in the background unless a
// flusher runs already; the flusher writes until every change made so far
// is on disk (or a write fails: then callers of persistLocked write
// again). a.mu must be held.
func (a *Allocator) flushLocked() {
	if a.flushing {
		return
	}
	a.flushing = true
	go func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for a.saved < a.version {
			if err := a.persistLocked(a.version); err != nil {
				break
			}
		}
		a.flushing = false
	}()
}

// write stores st at path atomically (see writeBytes).
func write(path string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeBytes(path, b)
}

// writeBytes replaces the file at path atomically and durably: temporary
// file, fsync, rename, fsync of the directory.
func writeBytes(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), tempPattern)
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
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("saving IPAM state: %w", err)
	}
	return nil
}

// syncDir fsyncs the directory dir, making the entries created, renamed
// or removed in it durable (fsync(2): syncing a file does not sync its
// directory entry).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory %s to sync it: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("closing directory %s: %w", dir, err)
	}
	return nil
}

// mkdirSynced creates dir and its missing parents (mode 0700), and syncs
// the parent of each directory it created, so the new path survives a
// crash.
func mkdirSynced(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		_, err := os.Stat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("IPAM directory %s: %w", d, err)
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating IPAM directory: %w", err)
	}
	for _, d := range created {
		if err := syncDir(filepath.Dir(d)); err != nil {
			return fmt.Errorf("creating IPAM directory: %w", err)
		}
	}
	return nil
}

// removeTemps removes the temporary files (names matching tempPattern) a
// write interrupted by a crash left in dir. A removal a crash undoes is
// done again by the next Open, so dir is not synced.
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading IPAM directory: %w", err)
	}
	for _, e := range entries {
		if ok, _ := filepath.Match(tempPattern, e.Name()); !ok || !e.Type().IsRegular() {
			continue
		}
		f := filepath.Join(dir, e.Name())
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing leftover IPAM file: %w", err)
		}
	}
	return nil
}

func u32ToIP(v uint32) net.IP {
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, v)
	return ip
}
