// Package install puts the seine CNI plugin in place on a node: it copies the
// seine binary into the CNI binary directory under the plugin type name
// "seine" and writes the network configuration list 10-seine.conflist that
// container runtimes load (CNI spec, section "Configuration format").
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/seine-net/seine/node/cni/wire"
)

const (
	// PluginType is the plugin "type", and so the binary name in BinDir.
	PluginType = "seine"
	// NetworkName is the CNI network name of the conflist.
	NetworkName = "seine"
	// ConfListName is the file written in ConfDir; the "10-" prefix sorts
	// it ahead of most other configurations, and runtimes use the first.
	ConfListName = "10-seine.conflist"
	// CNIVersion is the newest spec version seine implements, the version
	// of the written conflist unless a chained plugin supports less.
	CNIVersion = "1.1.0"
)

// Options says where and what to install.
type Options struct {
	// BinDir is the CNI plugin directory; default /opt/cni/bin.
	BinDir string
	// ConfDir is the CNI configuration directory; default /etc/cni/net.d.
	ConfDir string
	// SocketPath is the daemon's CNI socket written into the plugin
	// configuration; default /var/run/seine/cni.sock.
	SocketPath string
	// MTU, in bytes, for pod interfaces; 0 leaves it to the daemon.
	MTU int
	// Binary is the seine binary to copy; default os.Executable().
	Binary string
	// ChainPortmap appends the portmap plugin for the Pods' hostPorts,
	// instead of seine serving them itself (the portMappings capability
	// on seine's entry).
	ChainPortmap bool
	// ChainBandwidth appends the bandwidth plugin for the Pods' traffic
	// shaping, instead of seine serving it itself (the bandwidth
	// capability on seine's entry). The plugin's egress shaping does not
	// work with the userspace datapath (see node/bandwidth).
	ChainBandwidth bool
	// PluginDirs are searched for the chained plugins, to ask each for the
	// spec versions it supports (CNI spec, "VERSION"); default [BinDir].
	PluginDirs []string
	// CNIVersion of the conflist; empty picks the newest version that seine
	// and every chained plugin support.
	CNIVersion string
	// PluginsFrom, when set, is a directory holding the plugins seine
	// relies on (the image's copy): the chained ones, and loopback, which
	// container runtimes call for every Pod's lo. Each one missing from
	// BinDir is copied from there; a plugin the host already has is left
	// alone.
	PluginsFrom string
}

// DefaultOptions returns the standard node layout: seine alone in its
// conflist, serving hostPorts and traffic shaping itself.
func DefaultOptions() Options {
	return Options{
		BinDir:     "/opt/cni/bin",
		ConfDir:    "/etc/cni/net.d",
		SocketPath: "/var/run/seine/cni.sock",
	}
}

// Install copies the binary to BinDir/seine (mode 0755) and writes
// ConfDir/10-seine.conflist (mode 0644). Empty string fields take the values
// of DefaultOptions; the Chain flags are used as given. Each file is written
// to a temporary file in its directory and renamed into place, so a runtime
// never sees a partial file, and is left untouched when it already has the
// wanted content, so calling Install again is harmless. Other files in
// ConfDir are not touched.
func Install(o Options) error {
	d := DefaultOptions()
	if o.BinDir == "" {
		o.BinDir = d.BinDir
	}
	if o.ConfDir == "" {
		o.ConfDir = d.ConfDir
	}
	if o.SocketPath == "" {
		o.SocketPath = d.SocketPath
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the seine binary: %w", err)
		}
		o.Binary = exe
	}
	if o.PluginsFrom != "" {
		if err := installPlugins(o); err != nil {
			return err
		}
	}
	if o.CNIVersion == "" {
		v, err := negotiateVersion(o)
		if err != nil {
			return err
		}
		o.CNIVersion = v
	}
	conf, err := ConfList(o)
	if err != nil {
		return err
	}
	if err := installBinary(o.Binary, filepath.Join(o.BinDir, PluginType)); err != nil {
		return err
	}
	if err := os.MkdirAll(o.ConfDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI configuration directory: %w", err)
	}
	if err := writeIfChanged(filepath.Join(o.ConfDir, ConfListName), conf, 0o644); err != nil {
		return fmt.Errorf("writing CNI configuration: %w", err)
	}
	return nil
}

// InstallBinary copies the seine binary (o.Binary, default
// os.Executable()) to o.BinDir/seine (default /opt/cni/bin), as Install
// does, without writing a conflist: for chaining into a primary CNI's
// conflist (Chain).
func InstallBinary(o Options) error {
	if o.BinDir == "" {
		o.BinDir = DefaultOptions().BinDir
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the seine binary: %w", err)
		}
		o.Binary = exe
	}
	return installBinary(o.Binary, filepath.Join(o.BinDir, PluginType))
}

type pluginConf struct {
	Type         string          `json:"type"`
	SocketPath   string          `json:"socketPath,omitempty"`
	MTU          int             `json:"mtu,omitempty"`
	Capabilities map[string]bool `json:"capabilities,omitempty"`
}

type confList struct {
	CNIVersion string       `json:"cniVersion"`
	Name       string       `json:"name"`
	Plugins    []pluginConf `json:"plugins"`
}

// ConfList returns the conflist JSON for o (indented, newline-terminated),
// after checking that libcni parses it.
func ConfList(o Options) ([]byte, error) {
	if o.MTU < 0 || o.MTU > 65535 {
		return nil, fmt.Errorf("mtu %d out of range 0-65535", o.MTU)
	}
	if o.CNIVersion == "" {
		o.CNIVersion = CNIVersion
	}
	l := confList{
		CNIVersion: o.CNIVersion,
		Name:       NetworkName,
		Plugins:    []pluginConf{{Type: PluginType, SocketPath: o.SocketPath, MTU: o.MTU, Capabilities: seineCapabilities(o)}},
	}
	if o.ChainPortmap {
		l.Plugins = append(l.Plugins, pluginConf{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}})
	}
	if o.ChainBandwidth {
		l.Plugins = append(l.Plugins, pluginConf{Type: "bandwidth", Capabilities: map[string]bool{"bandwidth": true}})
	}
	out, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding conflist: %w", err)
	}
	out = append(out, '\n')
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		return nil, fmt.Errorf("generated conflist is invalid: %w", err)
	}
	return out, nil
}

// Choice is the operator's choice for one of the plugins seine can serve
// itself or chain (portmap, bandwidth).
type Choice int

const (
	// KeepInstalled chains the plugin if the installed conflist chains it,
	// and serves its capability in seine otherwise (a fresh install).
	KeepInstalled Choice = iota
	// ChainPlugin chains the upstream plugin.
	ChainPlugin
	// ServeInSeine serves the capability in seine, unchaining the plugin.
	ServeInSeine
)

// ResolveChain sets o.ChainPortmap and o.ChainBandwidth from the operator's
// choices and the conflist installed in o.ConfDir (see InstalledChain), and
// returns one line for the operator per plugin kept chained only because
// the installed conflist chains it.
func (o *Options) ResolveChain(portmap, bandwidth Choice) []string {
	installedPM, installedBW := InstalledChain(o.ConfDir)
	var notes []string
	resolve := func(name string, c Choice, installed bool) bool {
		switch c {
		case ChainPlugin:
			return true
		case ServeInSeine:
			return false
		}
		if installed {
			notes = append(notes, fmt.Sprintf("keeping %s chained, as the installed conflist has it: pass --chain-%s=false once no Pod it served is left on the Node", name, name))
		}
		return installed
	}
	o.ChainPortmap = resolve("portmap", portmap, installedPM)
	o.ChainBandwidth = resolve("bandwidth", bandwidth, installedBW)
	return notes
}

// InstalledChain reports which of portmap and bandwidth the conflist in
// confDir chains (both false when there is none or it cannot be read).
// An upgrade from a release that chained them should keep doing so until
// the Pods they served are gone: a runtime deletes a Pod through the
// conflist on disk, and only portmap's DEL removes the rules its ADD made.
func InstalledChain(confDir string) (portmap, bandwidth bool) {
	list, err := libcni.ConfListFromFile(filepath.Join(confDir, ConfListName))
	if err != nil {
		return false, false
	}
	for _, p := range list.Plugins {
		switch p.Network.Type {
		case "portmap":
			portmap = true
		case "bandwidth":
			bandwidth = true
		}
	}
	return portmap, bandwidth
}

// seineCapabilities are the runtime capabilities (CNI conventions) seine's
// own entry declares: those no chained plugin serves.
func seineCapabilities(o Options) map[string]bool {
	caps := map[string]bool{}
	if !o.ChainPortmap {
		caps["portMappings"] = true
	}
	if !o.ChainBandwidth {
		caps["bandwidth"] = true
	}
	if len(caps) == 0 {
		return nil
	}
	return caps
}

// chainedPlugins are the plugin types o chains after seine.
func chainedPlugins(o Options) []string {
	var chained []string
	if o.ChainPortmap {
		chained = append(chained, "portmap")
	}
	if o.ChainBandwidth {
		chained = append(chained, "bandwidth")
	}
	return chained
}

// installPlugins copies every plugin seine relies on that BinDir lacks
// from PluginsFrom.
func installPlugins(o Options) error {
	for _, name := range append(chainedPlugins(o), "loopback") {
		dst := filepath.Join(o.BinDir, name)
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		src := filepath.Join(o.PluginsFrom, name)
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("CNI plugin %s is neither in %s nor in %s: %w", name, o.BinDir, o.PluginsFrom, err)
		}
		if err := installBinary(src, dst); err != nil {
			return fmt.Errorf("installing CNI plugin %s: %w", name, err)
		}
	}
	return nil
}

// installBinary copies src to dst with mode 0755 unless dst already has the
// same content.
func installBinary(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating CNI binary directory: %w", err)
	}
	srcAbs, err := filepath.EvalSymlinks(src)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", src, err)
	}
	if dstAbs, err := filepath.EvalSymlinks(dst); err == nil && dstAbs == srcAbs {
		return nil // running from the installed copy
	}
	in, err := os.Open(srcAbs)
	if err != nil {
		return fmt.Errorf("opening %s: %w", srcAbs, err)
	}
	defer in.Close()
	if same, err := sameContent(in, dst); err != nil {
		return err
	} else if same {
		return os.Chmod(dst, 0o755)
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("rewinding seine binary: %w", err)
	}
	if err := atomicWrite(dst, in, 0o755); err != nil {
		return fmt.Errorf("installing %s to %s: %w", srcAbs, dst, err)
	}
	return nil
}

// sameContent reports whether the file at path has exactly in's content.
func sameContent(in *os.File, path string) (bool, error) {
	sfi, err := in.Stat()
	if err != nil {
		return false, fmt.Errorf("stat seine binary: %w", err)
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("opening installed plugin: %w", err)
	}
	defer f.Close()
	dfi, err := f.Stat()
	if err != nil || dfi.Size() != sfi.Size() || !dfi.Mode().IsRegular() {
		return false, nil
	}
	const chunk = 1 << 20
	a, b := make([]byte, chunk), make([]byte, chunk)
	for {
		na, ea := io.ReadFull(in, a)
		nb, eb := io.ReadFull(f, b)
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			return ea == eb || (isEOF(ea) && isEOF(eb)), nil
		}
	}
}

func isEOF(err error) bool { return err == io.EOF || err == io.ErrUnexpectedEOF }

// writeIfChanged atomically replaces path with data unless it already holds
// exactly data.
func writeIfChanged(path string, data []byte, mode fs.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return os.Chmod(path, mode)
	}
	return atomicWrite(path, bytes.NewReader(data), mode)
}

// atomicWrite writes r to a temporary file beside path, syncs it, sets mode
// and renames it over path.
func atomicWrite(path string, r io.Reader, mode fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, r); err != nil {
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// negotiateVersion asks every chained plugin for its supported versions
// (CNI_COMMAND=VERSION) and returns the newest version all of them and
// seine support. A runtime rejects a conflist whose version a plugin does
// not support, and Debian 12's plugins stop at 1.0.0.
func negotiateVersion(o Options) (string, error) {
	chained := chainedPlugins(o)
	dirs := o.PluginDirs
	if len(dirs) == 0 {
		dirs = []string{o.BinDir}
	}
	seineVersions := wire.SupportedVersions()
	common := map[string]bool{}
	for _, v := range seineVersions {
		common[v] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range chained {
		path, err := invoke.FindInPath(name, dirs)
		if err != nil {
			return "", fmt.Errorf("chained plugin %s not found in %v (install containernetworking-plugins, or disable the chaining): %w", name, dirs, err)
		}
		info, err := invoke.GetVersionInfo(ctx, path, nil)
		if err != nil {
			return "", fmt.Errorf("asking %s for its CNI versions: %w", path, err)
		}
		supported := map[string]bool{}
		for _, v := range info.SupportedVersions() {
			supported[v] = true
		}
		for v := range common {
			if !supported[v] {
				delete(common, v)
			}
		}
	}
	for _, v := range seineVersions {
		if common[v] {
			return v, nil
		}
	}
	return "", fmt.Errorf("no CNI version is supported by seine and all of %v", chained)
}
