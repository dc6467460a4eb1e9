package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/seine-net/seine/tests/sandbox/controlplane"
)

// Down removes everything sandbox name (under stateRoot, "" = default)
// owns, also after a crashed or killed run: the control plane; every
// process inside the sandbox's namespaces (kubelets, seine, OVS, servers
// started with `ext`), in a real Node's cgroups (its containers) or whose
// command line names the state directory; the real Nodes' cgroups;
// the namespaces themselves (Pod namespaces included); the host link; and
// the state directory. A sandbox that does not exist is success. Errors
// are collected; Down goes on after each.
func Down(name, stateRoot string) error {
	if name == "" {
		name = DefaultName
	}
	if err := ValidateName(name); err != nil {
		return err
	}
	dir, err := filepath.Abs(StateDir(name, stateRoot))
	if err != nil {
		return fmt.Errorf("sandbox down: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error

	// The control plane first, etcd last (its own Stop knows the order).
	if _, err := os.Stat(filepath.Join(dir, "cp")); err == nil {
		if err := controlplane.Stop(filepath.Join(dir, "cp")); err != nil {
			errs = append(errs, fmt.Errorf("stop control plane: %w", err))
		}
	}

	// Then everything else that is ours, found two ways.
	seen := map[int]bool{}
	var pids []int
	add := func(ps []int) {
		for _, p := range ps {
			if !seen[p] {
				seen[p] = true
				pids = append(pids, p)
			}
		}
	}
	namespaces := listNetNS(name)
	for _, ns := range namespaces {
		add(netnsPids(ctx, ns))
	}
	add(processesMentioning(dir))
	if err := terminate(pids, 5*time.Second); err != nil {
		errs = append(errs, err)
	}
	// Real Nodes: the containers of Pods live in network namespaces of
	// their own, but in the Node's cgroups.
	for _, cg := range nodeCgroupsOf(name) {
		if err := removeNodeCgroups(cg); err != nil {
			errs = append(errs, err)
		}
	}

	for _, ns := range listNetNS(name) {
		if err := deleteNetNS(ctx, ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteHostLink(name); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state dir: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox down %s: %w", name, err)
	}
	return nil
}
