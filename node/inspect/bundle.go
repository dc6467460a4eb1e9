package inspect

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/prometheus/common/expfmt"
	"github.com/vishvananda/netlink"
	"sigs.k8s.io/yaml"

	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/localapi"
)

// BundleParts are the archive's top-level parts: every bundle has a
// directory (or file) for each, which tests check.
var BundleParts = []string{
	"version.json", "agentinfo.json", "config.yaml", "health.txt", "metrics.txt",
	"logs/", "ovs/", "network/", "policy/", "profiles/",
}

// maxLogTail is how much of each OVS log file a bundle takes.
const maxLogTail = 2 << 20

// SupportBundle writes a gzipped tar archive of everything needed to
// debug this Node: versions, AgentInfo, configuration, probes, metrics,
// the daemon's and OVS's logs, OVS ports, flows (joined with Seine's
// desired state), groups, datapath flows and tunnel neighbours, the
// Node's links, addresses, routes, neighbours and nftables ruleset, its
// connection tracking (the kernel tracker's settings and counts, OVS's
// counts by protocol), the Service proxy's frontends, the agent's policy
// state, and goroutine and heap
// profiles. A part that fails is replaced by a file "<part>.error" saying
// why; the archive is still written.
func (in *Inspector) SupportBundle(ctx context.Context, w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	prefix := fmt.Sprintf("seine-%s-%s/", in.d.Config.NodeName, time.Now().UTC().Format("20060102T150405Z"))
	add := func(name string, fn func(w io.Writer) error) error {
		var b bytes.Buffer
		if err := fn(&b); err != nil {
			b.Reset()
			fmt.Fprintf(&b, "%v\n", err)
			name += ".error"
		}
		hdr := &tar.Header{Name: prefix + name, Mode: 0o644, Size: int64(b.Len()), ModTime: time.Now()}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(b.Bytes())
		return err
	}
	jsonOf := func(v any, err error) func(io.Writer) error {
		return func(w io.Writer) error {
			if err != nil {
				return err
			}
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(v)
		}
	}
	appctl := func(args ...string) func(io.Writer) error {
		return func(w io.Writer) error {
			out, err := in.d.Appctl.Run(ctx, args[0], args[1:]...)
			if err != nil {
				return err
			}
			_, err = io.WriteString(w, out)
			return err
		}
	}
	v, verr := in.Version(ctx)
	ai, aerr := in.AgentInfo(ctx)
	flows, ferr := in.Flows(ctx, localapi.FlowQuery{})
	ports, perr := in.d.OVSDB.ListPorts(ctx, in.d.Config.BridgeName)
	groups, gerr := in.d.OpenFlow.GroupIDs(ctx)
	view := in.view()
	parts := []struct {
		name string
		fn   func(io.Writer) error
	}{
		{"version.json", jsonOf(v, verr)},
		{"agentinfo.json", jsonOf(ai, aerr)},
		{"config.yaml", func(w io.Writer) error {
			b, err := yaml.Marshal(in.d.Config)
			if err == nil {
				_, err = w.Write(b)
			}
			return err
		}},
		{"health.txt", func(w io.Writer) error {
			for _, c := range []struct {
				probe string
				res   []string
			}{{"healthz", results(in.d.Probes.Live.Run())}, {"readyz", results(in.d.Probes.Ready.Run())}} {
				fmt.Fprintf(w, "%s:\n%s", c.probe, strings.Join(c.res, ""))
			}
			return nil
		}},
		{"metrics.txt", func(w io.Writer) error {
			mfs, err := in.d.Registry.Gather()
			if err != nil {
				return err
			}
			enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range mfs {
				if err := enc.Encode(mf); err != nil {
					return err
				}
			}
			return nil
		}},
		{"logs/seine.log", func(w io.Writer) error {
			if in.d.Logs == nil {
				return fmt.Errorf("the daemon keeps no log in memory")
			}
			_, err := in.d.Logs.WriteTo(w)
			return err
		}},
		{"logs/ovs-vswitchd.log", tailFile(in.ovsLog("ovs-vswitchd.log"))},
		{"logs/ovsdb-server.log", tailFile(in.ovsLog("ovsdb-server.log"))},
		{"ovs/ports.json", jsonOf(ports, perr)},
		{"ovs/flows.txt", func(w io.Writer) error {
			if ferr != nil {
				return ferr
			}
			for _, f := range flows {
				fmt.Fprintf(w, "table=%s priority=%d cookie=%s n_packets=%d n_bytes=%d %s actions=%s owner=%q state=%s\n",
					f.Table, f.Priority, f.Cookie, f.Packets, f.Bytes, f.Match, f.Actions, f.Owner, f.State)
			}
			return nil
		}},
		{"ovs/bridge-dump-flows.txt", appctl("bridge/dump-flows", in.d.Config.BridgeName)},
		{"ovs/groups.json", jsonOf(groups, gerr)},
		{"ovs/dpif.txt", appctl("dpif/show")},
		{"ovs/datapath-flows.txt", appctl("dpctl/dump-flows")},
		{"ovs/tunnel-neighbors.txt", appctl("tnl/neigh/show")},
		{"network/links.txt", netlinkDump(func() ([]any, error) { return asAny(netlinksafe.LinkList()) })},
		{"network/addresses.txt", netlinkDump(func() ([]any, error) { return asAny(netlinksafe.AddrList(nil, netlink.FAMILY_V4)) })},
		{"network/routes.txt", netlinkDump(func() ([]any, error) {
			return asAny(netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE))
		})},
		{"network/rules.txt", netlinkDump(func() ([]any, error) { return asAny(netlinksafe.RuleList(netlink.FAMILY_V4)) })},
		{"network/neighbors.txt", netlinkDump(func() ([]any, error) {
			// No netlinksafe variant: an interrupted dump is returned as is.
			return asAny(netlink.NeighList(0, netlink.FAMILY_V4))
		})},
		{"network/conntrack.txt", conntrackSettings("/proc/sys/net/netfilter")},
		{"network/services.json", func(w io.Writer) error {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			svcs, err := in.Services(sctx)
			return jsonOf(svcs, err)(w)
		}},
		{"ovs/conntrack-stats.txt", appctl("dpctl/ct-stats-show")},
		{"network/nftables.txt", func(w io.Writer) error {
			out, err := exec.CommandContext(ctx, "nft", "list", "ruleset").CombinedOutput()
			if err != nil {
				return fmt.Errorf("nft list ruleset: %w: %s", err, out)
			}
			_, err = w.Write(out)
			return err
		}},
		{"policy/podinterfaces.json", jsonOf(in.PodInterfaces(), nil)},
		{"policy/networkpolicies.json", jsonOf(in.NetworkPolicies(), nil)},
		{"policy/appliedtogroups.json", jsonOf(view.AppliedToGroups, nil)},
		{"policy/addressgroups.json", jsonOf(view.AddressGroups, nil)},
		{"policy/podrealizations.json", jsonOf(view.PodRealizations, nil)},
		{"profiles/goroutine.txt", func(w io.Writer) error { return pprof.Lookup("goroutine").WriteTo(w, 2) }},
		{"profiles/heap.pb.gz", func(w io.Writer) error { return pprof.Lookup("heap").WriteTo(w, 0) }},
	}
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := add(p.name, p.fn); err != nil {
			return fmt.Errorf("writing %s: %w", p.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func results(rs []health.Result) []string {
	var out []string
	for _, r := range rs {
		if r.Error == "" {
			out = append(out, fmt.Sprintf("[+]%s ok\n", r.Name))
		} else {
			out = append(out, fmt.Sprintf("[-]%s failed: %s\n", r.Name, r.Error))
		}
	}
	return out
}

// conntrackSettings writes the kernel connection tracker's settings and
// counters in dir (nf_conntrack_count, _max, _buckets, the timeouts: the
// files named nf_conntrack_* there), one "name value" line each, so that a
// full table ("nf_conntrack: table full, dropping packet") shows.
func conntrackSettings(dir string) func(io.Writer) error {
	return func(w io.Writer) error {
		files, err := filepath.Glob(filepath.Join(dir, "nf_conntrack_*"))
		if err != nil {
			return err
		}
		if len(files) == 0 {
			return fmt.Errorf("%s: no nf_conntrack settings (the module is not loaded)", dir)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s %s\n", filepath.Base(f), strings.TrimSpace(string(b)))
		}
		return nil
	}
}

// ovsLog finds an OVS log file: next to OVS's sockets (as the sandbox and
// some packagings keep it) or in /var/log/openvswitch.
func (in *Inspector) ovsLog(name string) string {
	for _, d := range []string{in.d.Config.OVSRunDir, "/var/log/openvswitch"} {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join("/var/log/openvswitch", name)
}

// tailFile writes the last maxLogTail bytes of path.
func tailFile(path string) func(io.Writer) error {
	return func(w io.Writer) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Size() > maxLogTail {
			if _, err := f.Seek(-maxLogTail, io.SeekEnd); err != nil {
				return err
			}
		}
		_, err = io.Copy(w, f)
		return err
	}
}

func asAny[T any](l []T, err error) ([]any, error) {
	out := make([]any, len(l))
	for i := range l {
		out[i] = l[i]
	}
	return out, err
}

// netlinkDump writes one object per line, naming links rather than
// numbering them.
func netlinkDump(list func() ([]any, error)) func(io.Writer) error {
	return func(w io.Writer) error {
		l, err := list()
		if err != nil {
			return err
		}
		names := map[int]string{}
		if links, err := netlinksafe.LinkList(); err == nil {
			for _, link := range links {
				names[link.Attrs().Index] = link.Attrs().Name
			}
		}
		dev := func(i int) string {
			if n, ok := names[i]; ok {
				return n
			}
			return fmt.Sprintf("if%d", i)
		}
		for _, o := range l {
			switch o := o.(type) {
			case netlink.Link:
				a := o.Attrs()
				fmt.Fprintf(w, "%d: %s type %s mtu %d state %s mac %s master %s\n", a.Index, a.Name, o.Type(), a.MTU, a.OperState,
					a.HardwareAddr, dev(a.MasterIndex))
			case netlink.Route:
				dst := "default"
				if o.Dst != nil {
					dst = o.Dst.String()
				}
				fmt.Fprintf(w, "%s", dst)
				if o.Gw != nil {
					fmt.Fprintf(w, " via %s", o.Gw)
				}
				fmt.Fprintf(w, " dev %s table %d proto %d scope %s", dev(o.LinkIndex), o.Table, o.Protocol, o.Scope)
				if o.Src != nil {
					fmt.Fprintf(w, " src %s", o.Src)
				}
				fmt.Fprintln(w)
			case netlink.Addr:
				fmt.Fprintf(w, "%s dev %s\n", o.IPNet, dev(o.LinkIndex))
			case netlink.Neigh:
				fmt.Fprintf(w, "%s dev %s lladdr %s state %#x\n", o.IP, dev(o.LinkIndex), o.HardwareAddr, o.State)
			default:
				fmt.Fprintf(w, "%v\n", o)
			}
		}
		return nil
	}
}
