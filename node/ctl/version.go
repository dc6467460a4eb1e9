package ctl

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/version"
)

// versions is what `seinectl version` reports.
type versions struct {
	Client string            `json:"client"`
	Daemon *localapi.Version `json:"daemon,omitempty"`
	// DaemonError says why the daemon did not answer.
	DaemonError string `json:"daemonError,omitempty"`
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the versions of seinectl, the local daemon and its Open vSwitch",
		Flags: []cli.Flag{textOutputFlag(),
			&cli.BoolFlag{Name: "client", Usage: "only seinectl's own version: no daemon is asked (as kubectl version --client)"}},
		Action: func(c *cli.Context) error {
			v := versions{Client: version.String()}
			client := c.Bool("client")
			var daemonErr error
			if !client {
				ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
				defer cancel()
				var d localapi.Version
				if daemonErr = local(c).Get(ctx, "/v1/version", nil, &d); daemonErr != nil {
					v.DaemonError = daemonErr.Error()
				} else {
					v.Daemon = &d
				}
			}
			if o := c.String("output"); o == "json" || o == "yaml" {
				if err := print(c, v, nil); err != nil {
					return err
				}
			} else {
				w := c.App.Writer
				fmtLine := func(k, v string) { _, _ = w.Write([]byte(k + v + "\n")) }
				fmtLine("seinectl: ", v.Client)
				switch {
				case client:
				case v.Daemon == nil:
					fmtLine("daemon:   ", "unreachable: "+v.DaemonError)
				default:
					fmtLine("daemon:   ", v.Daemon.Daemon+" on Node "+v.Daemon.Node)
					fmtLine("ovs:      ", v.Daemon.OVS+" ("+v.Daemon.Datapath+" datapath)")
				}
			}
			// Like kubectl version without a server: the client's version
			// is printed, the exit status says the daemon did not answer.
			if daemonErr != nil {
				return fmt.Errorf("the daemon's version: %w", daemonErr)
			}
			return nil
		},
	}
}
