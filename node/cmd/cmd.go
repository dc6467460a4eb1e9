// Package cmd is the command line of the seine daemon binary: the node
// daemon itself and the admin subcommands that run on a Node.
package cmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/seine-net/seine/node/agent"
	"github.com/seine-net/seine/node/cni/install"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/ctl"
	"github.com/seine-net/seine/node/logring"
	"github.com/seine-net/seine/node/version"
)

// Main runs the seine command line and returns the process exit status.
func Main(args []string) int {
	if err := NewApp().Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "seine:", err)
		return 1
	}
	return 0
}

// NewApp returns the urfave/cli application.
func NewApp() *cli.App {
	return &cli.App{
		Name:    "seine",
		Usage:   "Kubernetes networking on Open vSwitch",
		Version: version.Version(),
		Commands: []*cli.Command{
			nodeCommand(),
			installCNICommand(),
			ovsCommand(),
			{
				Name:            "ctl",
				Usage:           "seinectl, the operators' CLI (seine ctl --help)",
				SkipFlagParsing: true,
				Action: func(c *cli.Context) error {
					if code := ctl.Main(append([]string{"seinectl"}, c.Args().Slice()...)); code != 0 {
						return cli.Exit("", code)
					}
					return nil
				},
			},
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					fmt.Fprintln(c.App.Writer, "seine", version.String())
					return nil
				},
			},
		},
	}
}

func nodeCommand() *cli.Command {
	return &cli.Command{
		Name:  "node",
		Usage: "run the per-Node daemon (bridge, Pod networking, CNI server)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "YAML configuration file (docs/configuration.md)", EnvVars: []string{"SEINE_CONFIG"}},
			&cli.StringSliceFlag{Name: "set", Usage: "override one configuration key: --set tunnelType=vxlan (repeatable)"},
			&cli.StringFlag{Name: "log-format", Value: "console", Usage: "console or json"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := config.Load(c.String("config"), c.StringSlice("set"))
			if err != nil {
				return err
			}
			logging, err := NewLogging(cfg.LogLevel, c.String("log-format"))
			if err != nil {
				return err
			}
			log := logging.Logger
			defer func() { _ = log.Sync() }()
			log.Info("starting seine node", zap.String("version", version.String()),
				zap.String("datapath", cfg.OVSDatapathType),
				zap.String("traffic_encap_mode", string(cfg.TrafficEncapMode)))
			for _, w := range cfg.Warnings() {
				log.Warn("configuration", zap.String("warning", w))
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := agent.Run(ctx, cfg, log, agent.WithLogLevel(logging.Level), agent.WithRecentLogs(logging.Recent)); err != nil {
				log.Error("seine node failed", zap.Error(err))
				return err
			}
			log.Info("seine node stopped")
			return nil
		},
	}
}

func installCNICommand() *cli.Command {
	def := install.DefaultOptions()
	return &cli.Command{
		Name:  "install-cni",
		Usage: "install the CNI plugin binary and write the conflist",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cni-bin-dir", Value: def.BinDir, Usage: "CNI plugin directory"},
			&cli.StringFlag{Name: "cni-conf-dir", Value: def.ConfDir, Usage: "CNI configuration directory"},
			&cli.StringFlag{Name: "cni-socket", Value: def.SocketPath, Usage: "the daemon's CNI socket"},
			&cli.IntFlag{Name: "mtu", Usage: "Pod interface MTU (0: the daemon derives it)"},
			&cli.BoolFlag{Name: "chain-portmap", Usage: "chain the portmap plugin for hostPorts instead of seine serving them (default: as the installed conflist does, else no)"},
			&cli.BoolFlag{Name: "chain-bandwidth", Usage: "chain the bandwidth plugin for traffic shaping instead of seine serving it; its egress shaping does not work with the userspace datapath (default: as the installed conflist does, else no)"},
			&cli.BoolFlag{Name: "no-portmap", Hidden: true, Usage: "deprecated: seine serves hostPorts itself unless --chain-portmap"},
			&cli.BoolFlag{Name: "no-bandwidth", Hidden: true, Usage: "deprecated: seine serves shaping itself unless --chain-bandwidth"},
			&cli.StringSliceFlag{Name: "plugin-dir", Usage: "where to find the chained plugins, to negotiate the conflist's CNI version (default: --cni-bin-dir; repeatable)"},
			&cli.StringFlag{Name: "cni-version", Usage: "the conflist's cniVersion (default: the newest all chained plugins support)"},
			&cli.StringFlag{Name: "chain-into", Usage: "networkPolicyOnly: insert seine after the primary plugin of this conflist instead of writing " + install.ConfListName},
			&cli.BoolFlag{Name: "unchain", Usage: "with --chain-into: remove seine from that conflist instead (stop the daemon first: it puts itself back)"},
			&cli.StringFlag{Name: "install-plugins-from", Usage: "copy each plugin seine relies on (the chained ones, loopback) that the CNI bin dir lacks from this directory (the image's /opt/cni/bin)"},
			&cli.StringFlag{Name: "config", Usage: "the daemon's configuration file: its cniSocket goes into the conflist (unless --cni-socket), and with trafficEncapMode networkPolicyOnly seine is chained into its primaryCNIConflist instead of writing " + install.ConfListName},
			&cli.StringFlag{Name: "host-root", Usage: "with --config: where the host's file system is mounted (in a container, /host), prefixed to primaryCNIConflist"},
		},
		Action: func(c *cli.Context) error {
			if c.Bool("unchain") && c.String("chain-into") == "" {
				return fmt.Errorf("--unchain needs --chain-into")
			}
			socket := c.String("cni-socket")
			if path := c.String("config"); path != "" {
				cfg, err := config.Load(path, nil)
				if err != nil {
					return fmt.Errorf("install-cni --config: %w", err)
				}
				if !c.IsSet("cni-socket") {
					socket = cfg.CNISocket
				}
				if cfg.TrafficEncapMode == config.ModeNetworkPolicyOnly && c.String("chain-into") == "" {
					return chainFromConfig(c, filepath.Join("/", c.String("host-root"), cfg.PrimaryCNIConflist), socket)
				}
			}
			if primary := c.String("chain-into"); primary != "" {
				return chainCNI(c, primary, socket)
			}
			o := install.Options{
				BinDir:      c.String("cni-bin-dir"),
				ConfDir:     c.String("cni-conf-dir"),
				SocketPath:  socket,
				MTU:         c.Int("mtu"),
				PluginDirs:  c.StringSlice("plugin-dir"),
				CNIVersion:  c.String("cni-version"),
				PluginsFrom: c.String("install-plugins-from"),
			}
			// An upgrade keeps the plugins the installed conflist chains,
			// so the Pods they served are deleted through them.
			choice := func(flag, deprecated string) install.Choice {
				switch {
				case c.IsSet(flag) && c.Bool(flag):
					return install.ChainPlugin
				case c.IsSet(flag) || c.Bool(deprecated):
					return install.ServeInSeine
				}
				return install.KeepInstalled
			}
			for _, note := range o.ResolveChain(choice("chain-portmap", "no-portmap"), choice("chain-bandwidth", "no-bandwidth")) {
				fmt.Fprintln(c.App.Writer, note)
			}
			if err := install.Install(o); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "installed %s/%s and %s/%s\n", o.BinDir, install.PluginType, o.ConfDir, install.ConfListName)
			return nil
		},
	}
}

// chainFromConfig is install-cni in networkPolicyOnly mode (from
// --config): it installs the binary, removes a conflist of seine's own
// that an install in another mode left in the configuration directory
// (it could sort before the primary's and take every Pod), and chains
// seine into the primary's conflist. A primary that has not written its
// conflist yet is no error: the daemon chains itself in once it does.
func chainFromConfig(c *cli.Context, primary, socket string) error {
	o := install.Options{BinDir: c.String("cni-bin-dir")}
	if err := install.InstallBinary(o); err != nil {
		return err
	}
	own := filepath.Join(c.String("cni-conf-dir"), install.ConfListName)
	if err := os.Remove(own); err == nil {
		fmt.Fprintf(c.App.Writer, "removed %s: in networkPolicyOnly mode seine runs chained after the primary CNI\n", own)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", own, err)
	}
	changed, err := install.Chain(primary, socket)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(c.App.Writer, "installed %s/%s; %s does not exist yet: the daemon chains seine into it once the primary CNI writes it\n",
			o.BinDir, install.PluginType, primary)
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(c.App.Writer, "installed %s/%s and chained it into %s (changed: %v)\n", o.BinDir, install.PluginType, primary, changed)
	return nil
}

// chainCNI installs the binary and chains seine into (or, with --unchain,
// out of) the primary CNI's conflist.
func chainCNI(c *cli.Context, primary, socket string) error {
	if c.Bool("unchain") {
		changed, err := install.Unchain(primary)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "seine removed from %s (changed: %v)\n", primary, changed)
		return nil
	}
	o := install.Options{BinDir: c.String("cni-bin-dir")}
	if err := install.InstallBinary(o); err != nil {
		return err
	}
	changed, err := install.Chain(primary, socket)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "installed %s/%s and chained it into %s (changed: %v)\n", o.BinDir, install.PluginType, primary, changed)
	return nil
}

// recentLogSize is how much of its recent log the daemon keeps in memory
// for support bundles.
const recentLogSize = 4 << 20

// Logging is the daemon's logger, its level (changed at run time by
// seinectl log-level) and the copy of its recent output.
type Logging struct {
	Logger *zap.Logger
	Level  zap.AtomicLevel
	Recent *logring.Ring
}

// NewLogging builds the daemon's zap logger: level debug, info, warn or
// error; format console (human-readable) or json; to standard error and
// to an in-memory ring of the last 4 MiB.
func NewLogging(level, format string) (Logging, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return Logging{}, fmt.Errorf("log level: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	zc.Sampling = nil
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(zc.EncoderConfig)
	case "console":
		zc.Encoding = "console"
		enc = zapcore.NewConsoleEncoder(zc.EncoderConfig)
	default:
		return Logging{}, fmt.Errorf("log format %q: want console or json", format)
	}
	ring := logring.New(recentLogSize)
	log, err := zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, zapcore.NewCore(enc, ring, zc.Level))
	}))
	if err != nil {
		return Logging{}, err
	}
	return Logging{Logger: log, Level: zc.Level, Recent: ring}, nil
}
