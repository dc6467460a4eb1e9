package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// Chaining into a primary CNI's conflist (trafficEncapMode
// networkPolicyOnly). The primary (AWS VPC CNI, ptp, ...) owns its file and
// may rewrite it at any time, e.g. when its own daemon restarts; seine
// inserts its plugin right after the primary's (CNI spec, "Network
// Configuration Lists": plugins run in order on ADD, in reverse on DEL)
// and puts it back whenever the file changes (KeepChained). Everything
// else in the file is kept as the primary wrote it, unknown keys included.

// resyncChain is how often KeepChained re-checks the conflist even
// without a file notification.
const resyncChain = 30 * time.Second

// Chain makes the conflist at path run the seine plugin (socketPath
// socket) after its first plugin: the list's first seine entry stays where
// it is when it is not first and is exactly {"type":"seine","socketPath":
// socket}; otherwise it is replaced by that entry right after the first
// plugin. It reports whether it rewrote the file. The file is
// replaced atomically and only when it changes. Errors: the file is
// missing (fs.ErrNotExist, wrapped) or is not a valid conflist.
func Chain(path, socket string) (bool, error) {
	return editChain(path, func(plugins []json.RawMessage) ([]json.RawMessage, error) {
		seine, err := json.Marshal(pluginConf{Type: PluginType, SocketPath: socket})
		if err != nil {
			return nil, err
		}
		for i, p := range plugins {
			if pluginType(p) == PluginType {
				if i >= 1 && bytes.Equal(compact(p), seine) {
					return plugins, nil
				}
				plugins = append(plugins[:i:i], plugins[i+1:]...)
				break
			}
		}
		if len(plugins) == 0 {
			return nil, errors.New("the conflist has no primary plugin to chain after")
		}
		out := append([]json.RawMessage{plugins[0], seine}, plugins[1:]...)
		return out, nil
	})
}

// Unchain removes the seine plugin from the conflist at path, if it is
// there, and reports whether it rewrote the file.
func Unchain(path string) (bool, error) {
	return editChain(path, func(plugins []json.RawMessage) ([]json.RawMessage, error) {
		out := plugins[:0:0]
		for _, p := range plugins {
			if pluginType(p) != PluginType {
				out = append(out, p)
			}
		}
		return out, nil
	})
}

// Chained reports whether the conflist at path runs the seine plugin.
func Chained(path string) (bool, error) {
	found := false
	_, err := editChain(path, func(plugins []json.RawMessage) ([]json.RawMessage, error) {
		for _, p := range plugins {
			found = found || pluginType(p) == PluginType
		}
		return plugins, nil
	})
	return found, err
}

// editChain reads the conflist at path, lets edit change its plugin list
// and writes the result back when the list changed.
func editChain(path string, edit func([]json.RawMessage) ([]json.RawMessage, error)) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("reading primary CNI conflist: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return false, fmt.Errorf("primary CNI conflist %s: %w", path, err)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(doc["plugins"], &plugins); err != nil {
		return false, fmt.Errorf("primary CNI conflist %s: \"plugins\" is not a list: %w", path, err)
	}
	before := make([]string, len(plugins))
	for i, p := range plugins {
		before[i] = string(compact(p))
	}
	out, err := edit(plugins)
	if err != nil {
		return false, fmt.Errorf("primary CNI conflist %s: %w", path, err)
	}
	same := len(out) == len(before)
	for i := 0; same && i < len(out); i++ {
		same = string(compact(out[i])) == before[i]
	}
	if same {
		return false, nil
	}
	if doc["plugins"], err = json.Marshal(out); err != nil {
		return false, err
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return false, err
	}
	data = append(data, '\n')
	if _, err := libcni.ConfListFromBytes(data); err != nil {
		return false, fmt.Errorf("the edited conflist would be invalid: %w", err)
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := atomicWrite(path, bytes.NewReader(data), mode); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	return true, nil
}

func pluginType(p json.RawMessage) string {
	var t struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(p, &t)
	return t.Type
}

func compact(p json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, p); err != nil {
		return p
	}
	return b.Bytes()
}

// KeepChained chains seine into the conflist at path (see Chain) and
// keeps it there until ctx ends: it watches the file's directory (a
// primary usually replaces its file by renaming a new one over it) and
// re-checks every resyncChain. A missing file is waited for. Errors only
// when the directory cannot be watched.
func KeepChained(ctx context.Context, path, socket string, log *zap.Logger) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching CNI configuration: %w", err)
	}
	defer w.Close()
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("CNI configuration directory: %w", err)
	}
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	missing := false
	ensure := func(why string) {
		changed, err := Chain(path, socket)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !missing {
				log.Warn("waiting for the primary CNI's conflist", zap.String("conflist", path))
			}
			missing = true
		case err != nil:
			log.Error("chaining seine into the primary CNI's conflist", zap.String("conflist", path), zap.Error(err))
		case changed:
			missing = false
			log.Info("seine chained into the primary CNI's conflist", zap.String("conflist", path), zap.String("trigger", why))
		}
	}
	ensure("start")
	tick := time.NewTicker(resyncChain)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if filepath.Clean(ev.Name) == filepath.Clean(path) && !ev.Has(fsnotify.Chmod) {
				ensure("file changed")
			}
		case err, ok := <-w.Errors:
			if ok {
				log.Warn("watching the primary CNI's conflist", zap.Error(err))
			}
		case <-tick.C:
			ensure("periodic check")
		}
	}
}
