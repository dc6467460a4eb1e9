package podnet

import (
	"errors"
	"sync"
)

// OpenFlow port numbers a Pod port may be given: ofport_request accepts
// 1-65279 (ovs-vswitchd.conf.db(5), Interface table); 1 and 2 are the
// tunnel and gateway ports (node/agent), so Pods start at 3.
const (
	firstPodOFPort = 3
	lastPodOFPort  = 0xfeff
)

// ofportPool chooses the OpenFlow port number of each new Pod port, so that
// the Pod's flows can be installed while ovs-vswitchd is still adding the
// port (the number is requested with Interface.ofport_request). Next-fit,
// like IP allocation: a number freed by a DEL is reused as late as
// possible. Every port already on the bridge is marked used at start.
// It is safe for concurrent use.
type ofportPool struct {
	mu   sync.Mutex
	used map[uint32]bool
	next uint32
}

func newOFPortPool() *ofportPool {
	return &ofportPool{used: map[uint32]bool{}, next: firstPodOFPort}
}

var errNoOFPort = errors.New("no OpenFlow port number left")

// get reserves a free number.
func (p *ofportPool) get() (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i <= lastPodOFPort-firstPodOFPort; i++ {
		n := p.next
		p.next++
		if p.next > lastPodOFPort {
			p.next = firstPodOFPort
		}
		if !p.used[n] {
			p.used[n] = true
			return n, nil
		}
	}
	return 0, errNoOFPort
}

// mark records n as used (a port found on the bridge, or given a number
// other than the one requested).
func (p *ofportPool) mark(n uint32) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	p.used[n] = true
	p.mu.Unlock()
}

// release frees n.
func (p *ofportPool) release(n uint32) {
	p.mu.Lock()
	delete(p.used, n)
	p.mu.Unlock()
}
