// Command seine is Seine's single binary. Like busybox it picks its role
// from the name it was invoked by (argv[0]):
//
//   - seine-cni, or any name when CNI_COMMAND is set: the CNI plugin, a thin
//     client of the local daemon (CNI spec, "Parameters");
//   - seinectl: the command-line client for operators;
//   - seine (anything else): the daemon and its admin subcommands.
package main

import (
	"os"
	"path/filepath"

	"github.com/seine-net/seine/node/cmd"
	"github.com/seine-net/seine/node/cni/plugin"
	"github.com/seine-net/seine/node/ctl"
	"github.com/seine-net/seine/node/version"
)

func main() {
	switch role(os.Args[0], os.Getenv("CNI_COMMAND")) {
	case "cni":
		plugin.Main(version.Version())
	case "ctl":
		os.Exit(ctl.Main(os.Args))
	default:
		os.Exit(cmd.Main(os.Args))
	}
}

// role maps argv[0] and CNI_COMMAND to the binary's role.
func role(argv0, cniCommand string) string {
	switch name := filepath.Base(argv0); {
	case name == "seine-cni" || cniCommand != "":
		return "cni"
	case name == "seinectl":
		return "ctl"
	default:
		return "daemon"
	}
}
