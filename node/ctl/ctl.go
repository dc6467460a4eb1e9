// Package ctl is seinectl, the operators' command-line client.
package ctl

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/seine-net/seine/node/version"
)

// Main runs seinectl and returns the process exit status.
func Main(args []string) int {
	app := &cli.App{
		Name:    "seinectl",
		Usage:   "inspect and debug Seine",
		Version: version.Version(),
		Commands: []*cli.Command{
			{
				Name:  "version",
				Usage: "print the version of seinectl",
				Action: func(c *cli.Context) error {
					fmt.Fprintln(c.App.Writer, "seinectl", version.String())
					return nil
				},
			},
		},
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "seinectl:", err)
		return 1
	}
	return 0
}
