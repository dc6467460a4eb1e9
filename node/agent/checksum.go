package agent

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/csumseed"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tunnel"
)

// seedHook is one device hook of the checksum seed program.
type seedHook struct {
	device string
	dir    csumseed.Direction
}

// seedHooks returns where packets leave b (docs/configuration.md, "NAT of
// offloaded packets"): the gateway, a tap whose ingress is where the host
// receives them; the kernel tunnel device; and the segmentation port where
// b has one when the program is attached (with an OVS tunnel port), both
// at egress, before the kernel segments.
func seedHooks(cfg config.Config, kind tunnel.Kind, b pipeline.Bridge) []seedHook {
	hooks := []seedHook{{cfg.GatewayName, csumseed.Ingress}}
	if b.TunnelPort != 0 && kind == tunnel.KindKernelDevice {
		hooks = append(hooks, seedHook{cfg.TunnelName, csumseed.Egress})
	}
	if b.SegmentPort != 0 {
		hooks = append(hooks, seedHook{tunnel.DefaultSegmentPair.Port, csumseed.Egress})
	}
	return hooks
}

// partialChecksums decides how NATed packets with partial checksums leave
// the Node and sets b.PartialChecksumsRewritten. They have partial
// checksums only with the userspace datapath and userspace TSO (tso);
// then, with natChecksum "rewrite", it loads the checksum seed program and
// attaches it to every hook of seedHooks (the segmentation port's only if
// b has one already: with an OVS tunnel port). If the kernel refuses, it
// logs why and the Node takes the NAT checksum detour, for which the
// caller adds the segmentation port (segmentPortNeeded).
// Removing the program from the hooks an earlier run used is left to the
// caller, once no flow of the earlier round is left (detachSeed): those
// send NATed packets out directly.
//
// It returns the loaded program (nil when unused), which the caller hands
// to a seedKeeper, to attach again to a device made anew while the daemon
// runs (ovs-vswitchd's taps persist across its restarts, but a bridge it
// re-creates has new ones), and closes at exit; the filters stay behind
// the process, so a restart leaves no moment without them.
func partialChecksums(cfg config.Config, kind tunnel.Kind, tso bool, b *pipeline.Bridge, log *zap.Logger) *csumseed.Program {
	b.PartialChecksumsRewritten = false
	if !userspaceDatapath(cfg) || !tso || cfg.NATChecksumMode() != config.NATChecksumRewrite {
		return nil
	}
	hooks := seedHooks(cfg, kind, *b)
	prog, err := csumseed.Load()
	if err == nil {
		err = attachSeed(prog, hooks)
	}
	if err != nil {
		log.Warn("partial checksums cannot be rewritten where packets leave; NATed packets take the slower checksum detour",
			zap.String("nat_checksum", config.NATChecksumDetour), zap.Error(err))
		if prog != nil {
			_ = prog.Close()
		}
		return nil
	}
	b.PartialChecksumsRewritten = true
	devices := make([]string, 0, len(hooks))
	for _, h := range hooks {
		devices = append(devices, h.device+" "+h.dir.String())
	}
	log.Info("partial checksums rewritten where packets leave", zap.String("nat_checksum", config.NATChecksumRewrite),
		zap.Strings("hooks", devices))
	return prog
}

// attachSeed attaches prog to every hook; the first failure stops it.
func attachSeed(prog *csumseed.Program, hooks []seedHook) error {
	for _, h := range hooks {
		if err := prog.Attach(h.device, h.dir); err != nil {
			return err
		}
	}
	return nil
}

// seedKeeper keeps the checksum seed program on its hooks while the
// daemon runs: a device made anew (ovs-vswitchd re-creating its bridge,
// an operator re-creating the tunnel device) comes without the filter, and
// so does a hook whose filter someone removed. Each check attaches the
// program where it is missing and exports how many hooks still lack it.
type seedKeeper struct {
	prog    *csumseed.Program
	hooks   []seedHook
	missing prometheus.Gauge
	log     *zap.Logger

	mu     sync.Mutex
	failed map[seedHook]bool // hooks the last check could not mend
	closed bool              // prog is closed: ensure does nothing
}

// newSeedKeeper returns a keeper of prog on hooks, which owns prog from
// then on (close releases it), its gauge registered with reg (which
// panics if one is registered there already):
//
//	seine_nat_checksum_hooks_missing 0
func newSeedKeeper(prog *csumseed.Program, hooks []seedHook, reg prometheus.Registerer, log *zap.Logger) *seedKeeper {
	k := &seedKeeper{prog: prog, hooks: hooks, log: log, failed: map[seedHook]bool{},
		missing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seine_nat_checksum_hooks_missing",
			Help: "Devices where packets leave the bridge that lack the checksum seed filter although natChecksum rewrite is in effect (seine attaches it again every 30 s and on OpenFlow reconnect); above 0, NATed packets with partial checksums leave there with wrong checksums.",
		})}
	reg.MustRegister(k.missing)
	return k
}

// ensure attaches the program to every hook that lacks it and returns how
// many hooks still lack it. A hook it mends is logged at warning level; a
// hook it cannot mend at error level, once until it is mended.
func (k *seedKeeper) ensure() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return 0
	}
	missing := 0
	for _, h := range k.hooks {
		ok, err := csumseed.Attached(h.device, h.dir)
		if err == nil && ok {
			k.failed[h] = false
			continue
		}
		if err == nil {
			err = k.prog.Attach(h.device, h.dir)
		}
		if err != nil {
			missing++
			if !k.failed[h] {
				k.log.Error("the checksum seed filter is missing and cannot be attached: NATed packets with partial checksums leave here with wrong checksums",
					zap.String("interface", h.device), zap.Stringer("direction", h.dir), zap.Error(err))
			}
			k.failed[h] = true
			continue
		}
		k.log.Warn("the checksum seed filter was missing; attached again",
			zap.String("interface", h.device), zap.Stringer("direction", h.dir))
		k.failed[h] = false
	}
	k.missing.Set(float64(missing))
	return missing
}

// close waits for a check under way, stops later ones (the reconnect hook
// may still call ensure) and releases the program; the filters stay.
func (k *seedKeeper) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	return k.prog.Close()
}

// run checks the hooks every period until ctx ends. The first check comes
// a period after the start: partialChecksums has just attached every hook.
func (k *seedKeeper) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k.ensure()
		}
	}
}

// detachSeed removes the program from every hook it may have been left
// on, for a Node that does not rewrite (b.PartialChecksumsRewritten
// false); failures are logged (a filter left behind only rewrites partial
// seeds, which is never wrong).
func detachSeed(cfg config.Config, log *zap.Logger) {
	for _, h := range []seedHook{{cfg.GatewayName, csumseed.Ingress}, {cfg.TunnelName, csumseed.Egress},
		{tunnel.DefaultSegmentPair.Port, csumseed.Egress}} {
		if err := csumseed.Detach(h.device, h.dir); err != nil {
			log.Warn("removing the checksum seed filter", zap.String("interface", h.device),
				zap.Stringer("direction", h.dir), zap.Error(err))
		}
	}
}

// natChecksumInEffect names how b makes NATed partial checksums right:
// "rewrite" (the checksum seed program), "detour" (the pipeline's), or
// "none" (no partial checksums cross the bridge: the kernel datapath, or
// no userspace TSO).
func natChecksumInEffect(b pipeline.Bridge) string {
	switch {
	case b.PartialChecksumsRewritten:
		return config.NATChecksumRewrite
	case b.NATChecksumDetour():
		return config.NATChecksumDetour
	}
	return "none"
}

// registerNATChecksumMetric exports natChecksumInEffect, which may differ
// from the configuration (a kernel that refuses the program):
//
//	seine_nat_checksum_info{mode="rewrite"} 1
func registerNATChecksumMetric(reg *prometheus.Registry, b pipeline.Bridge) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "seine_nat_checksum_info",
		Help:        "How NATed packets with partial checksums are made right before they leave the Node (natChecksum in effect: rewrite, detour, or none without userspace TSO); always 1.",
		ConstLabels: prometheus.Labels{"mode": natChecksumInEffect(b)},
	}, func() float64 { return 1 }))
}
