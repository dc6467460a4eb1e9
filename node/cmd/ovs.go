package cmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
	"github.com/seine-net/seine/datapath/ovsdaemon"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/node/agent"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/tunnel"
)

// ovsCommand runs the Node's Open vSwitch daemons (the seine-ovs
// DaemonSet's openvswitch container) and checks them (its liveness probe).
func ovsCommand() *cli.Command {
	configFlag := &cli.StringFlag{Name: "config", Usage: "seine's YAML configuration (ovsRunDir, ovsDatapathType, dataDir)", EnvVars: []string{"SEINE_CONFIG"}}
	return &cli.Command{
		Name:  "ovs",
		Usage: "run or check this Node's Open vSwitch daemons",
		Subcommands: []*cli.Command{
			{
				Name: "run",
				Usage: "run ovsdb-server and ovs-vswitchd in the foreground, restarting either if it exits; " +
					"loads the openvswitch kernel module for ovsDatapathType system, raises net.core.rmem_default to netdevReceiveBuffer for netdev; " +
					"the database lives in <dataDir>/ovsdb",
				Flags: []cli.Flag{configFlag},
				Action: func(c *cli.Context) error {
					cfg, err := config.Load(c.String("config"), nil)
					if err != nil {
						return err
					}
					logging, err := NewLogging(cfg.LogLevel, "console")
					if err != nil {
						return err
					}
					log := logging.Logger
					defer func() { _ = log.Sync() }()
					ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
					defer stop()
					oc := ovsConfig(cfg)
					// Before ovs-vswitchd opens its ports' sockets.
					agent.EnsureNetdevReceiveBuffer(cfg, log)
					oc.BeforeStop = func(ctx context.Context) error {
						// Removing Seine stops both DaemonSets' Pods at
						// once: the daemon's CNI requests in flight finish
						// or roll back on a live OVS first.
						waitDaemonGone(ctx, cfg.APISocket, daemonStopStart, daemonStopWait, log)
						if cfg.OVSDatapathType != config.DatapathNetdev {
							return nil
						}
						// The transport bridge holds the Node's address, and
						// dies with ovs-vswitchd: give the device back first.
						return releaseTransport(ctx, cfg, log)
					}
					err = ovsdaemon.Run(ctx, oc, log.Named("ovs"))
					if err != nil {
						log.Error("Open vSwitch failed", zap.Error(err))
					}
					return err
				},
			},
			{
				Name:  "health",
				Usage: "exit 0 when ovsdb-server and ovs-vswitchd both answer (the openvswitch container's liveness probe)",
				Flags: []cli.Flag{configFlag, &cli.DurationFlag{Name: "timeout", Value: 4 * time.Second}},
				Action: func(c *cli.Context) error {
					cfg, err := config.Load(c.String("config"), nil)
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
					defer cancel()
					if err := ovsdaemon.Health(ctx, cfg.OVSRunDir); err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, "ok")
					return nil
				},
			},
		},
	}
}

// daemonStopWait bounds how long a stopping `seine ovs run` waits for a
// stopping seine daemon to exit: the seine container's own grace period.
// daemonStopStart is how long it gives a running daemon to begin stopping:
// `kubectl delete -f` deletes both Pods of a Node, not at the same instant.
const (
	daemonStopWait  = 30 * time.Second
	daemonStopStart = 5 * time.Second
)

// waitDaemonGone returns once nothing answers on the seine daemon's local
// API socket (apiSocket), once the daemon has answered for startWait that
// it is not stopping (its /readyz passes the shutdown check: only Open
// vSwitch is being replaced, and the daemon rides out the restart and
// puts its ports and flows back, docs/design.md, "Restarts without packet
// loss"), or after limit.
func waitDaemonGone(ctx context.Context, apiSocket string, startWait, limit time.Duration, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	api := localapi.NewClient(apiSocket)
	began := time.Now()
	logged := false
	for {
		answering, stopping := daemonState(ctx, api)
		switch {
		case ctx.Err() != nil:
			log.Info("the seine daemon still runs after the wait: stopping Open vSwitch under it",
				zap.Duration("waited", time.Since(began)))
			return
		case !answering:
			return // no daemon (any more)
		case !stopping && time.Since(began) >= startWait:
			log.Info("the seine daemon keeps running: stopping Open vSwitch under it; it reconnects to the next one",
				zap.String("api_socket", apiSocket))
			return
		case stopping && !logged:
			logged = true
			log.Info("waiting for the seine daemon to stop before Open vSwitch does",
				zap.String("api_socket", apiSocket), zap.Duration("at_most", limit))
		}
		select {
		case <-ctx.Done(): // logged above
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// daemonState asks the seine daemon for its /readyz over the local API:
// answering is false when nothing accepts on the socket; stopping is true
// when the answer fails the shutdown check (health.CheckShutdown).
func daemonState(ctx context.Context, api *localapi.Client) (answering, stopping bool) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var b strings.Builder
	err := api.Stream(rctx, "/readyz?verbose", &b)
	var op *net.OpError
	switch {
	case err == nil:
		return true, false
	case errors.As(err, &op):
		return false, false
	default:
		return true, strings.Contains(err.Error(), "[-]"+health.CheckShutdown+" failed")
	}
}

// releaseTransport hands the transport device of the userspace datapath
// back to the kernel (tunnel.DetachNetdev) before ovs-vswitchd exits. When
// that fails, the device's ingress drop goes anyway: once ovs-vswitchd is
// gone nothing reads the device behind it, and an address already on the
// device (or put there by hand) would be cut off.
func releaseTransport(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	nft, err := knftables.New(knftables.NetDevFamily, tunnel.TransportTable)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	ovs, err := ovsdb.Dial(ctx, cfg.OVSDBEndpoint(), log.Named("ovsdb"))
	if err == nil {
		defer ovs.Close()
		err = tunnel.DetachNetdev(ctx, ovs, nft, cfg.TransportBridge, log)
	}
	if err != nil {
		if derr := nftables.DeleteTable(ctx, nft); derr != nil {
			return errors.Join(err, fmt.Errorf("removing the transport device's ingress drop: %w", derr))
		}
		log.Warn("the transport device was not handed back; its ingress drop is removed all the same", zap.Error(err))
	}
	return err
}

// ovsConfig maps seine's configuration onto the daemons'.
func ovsConfig(cfg config.Config) ovsdaemon.Config {
	return ovsdaemon.Config{
		RunDir:   cfg.OVSRunDir,
		DBFile:   filepath.Join(cfg.DataDir, "ovsdb", "conf.db"),
		Datapath: cfg.OVSDatapathType,
		// The daemon reads the key at start only: set it before.
		UserspaceTSO: cfg.UserspaceTSOEnabled(),
	}
}
