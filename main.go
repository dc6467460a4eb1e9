// Command seine is Seine's single binary. Like busybox it picks its role
// from the name it was invoked by (argv[0]):
//
//   - seine-cni, or any name when CNI_COMMAND is set: the CNI plugin, a thin
//     client of the local daemon (CNI spec, "Parameters"). It runs from
//     package plugin's initializer and exits before main, so that it does
//     not pay for the daemon's package initializers on every exec (see
//     package plugin);
//   - seinectl: the command-line client for operators;
//   - seine (anything else): the daemon and its admin subcommands.
package main

import (
	"os"
	"path/filepath"

	"github.com/seine-net/seine/node/cmd"
	// Imported for its initializer, which runs the CNI plugin role.
	_ "github.com/seine-net/seine/node/cni/plugin"
	"github.com/seine-net/seine/node/ctl"
)

func main() {
	switch role(os.Args[0]) {
	case "ctl":
		os.Exit(ctl.Main(os.Args))
	default:
		os.Exit(cmd.Main(os.Args))
	}
}

// role maps argv[0] to the binary's role once the plugin's initializer has
// passed (plugin.Invoked was false).
func role(argv0 string) string {
	if filepath.Base(argv0) == "seinectl" {
		return "ctl"
	}
	return "daemon"
}
