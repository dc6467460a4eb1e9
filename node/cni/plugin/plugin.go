// Package plugin is the CNI plugin side of seine: the seine binary runs it
// when the container runtime executes it (CNI_COMMAND set). It is a thin
// gRPC client that forwards each invocation to the node daemon over the
// daemon's root-only unix socket and relays the daemon's answer to the
// runtime: the result JSON on stdout, or a CNI error (CNI spec, section
// "Error") on stdout with a non-zero exit status.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/seine-net/seine/node/cni/cnipb"
)

const (
	// DefaultSocketPath is the daemon socket used when the network
	// configuration has no socketPath.
	DefaultSocketPath = "/var/run/seine/cni.sock"
	// ConnectTimeout bounds connecting to the daemon socket.
	ConnectTimeout = 3 * time.Second
	// CallTimeout bounds one whole invocation, daemon work included.
	CallTimeout = 2 * time.Minute
)

// Versions is the CNI spec versions the plugin accepts in configurations;
// VERSION reports them without contacting the daemon.
var Versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Main runs the plugin for the CNI_COMMAND in the environment and exits the
// process with status 1 after printing a CNI error to stdout when the
// command fails; it returns on success. version is printed in the "about"
// text shown when the binary runs without CNI_COMMAND.
func Main(version string) {
	p := &Plugin{Stdout: os.Stdout}
	skel.PluginMainFuncs(p.Funcs(), Versions, "CNI plugin seine "+version)
}

// Plugin forwards CNI invocations to the daemon. The zero value writes to
// nothing; set Stdout.
type Plugin struct {
	// Stdout receives ADD results.
	Stdout io.Writer
}

// Funcs returns the skel callbacks for ADD, DEL, CHECK, STATUS and GC.
// Each returns nil or a *types.Error carrying the daemon's code.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    p.call("ADD"),
		Del:    p.call("DEL"),
		Check:  p.call("CHECK"),
		GC:     p.call("GC"),
		Status: p.call("STATUS"),
	}
}

// socketPathOf returns socketPath from the network configuration, or
// DefaultSocketPath.
func socketPathOf(stdin []byte) (string, error) {
	var conf struct {
		SocketPath string `json:"socketPath"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return "", err
	}
	if conf.SocketPath == "" {
		return DefaultSocketPath, nil
	}
	return conf.SocketPath, nil
}

func (p *Plugin) call(cmd string) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
		defer cancel()
		return p.forward(ctx, cmd, args)
	}
}

// forward sends one invocation to the daemon and relays its answer.
func (p *Plugin) forward(ctx context.Context, cmd string, args *skel.CmdArgs) error {
	socket, err := socketPathOf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "failed to decode network configuration", err.Error())
	}
	conn, closeConn, err := dial(ctx, socket)
	if err != nil {
		return notRunning(cmd, socket, err)
	}
	defer closeConn()
	client := cnipb.NewCNIClient(conn)

	req := &cnipb.CmdRequest{
		ContainerId:          args.ContainerID,
		Netns:                args.Netns,
		Ifname:               args.IfName,
		Args:                 args.Args,
		Path:                 args.Path,
		NetworkConfiguration: args.StdinData,
	}
	var resp *cnipb.CmdResponse
	switch cmd {
	case "ADD":
		resp, err = client.CmdAdd(ctx, req)
	case "DEL":
		resp, err = client.CmdDel(ctx, req)
	case "CHECK":
		resp, err = client.CmdCheck(ctx, req)
	case "GC":
		resp, err = client.CmdGC(ctx, req)
	case "STATUS":
		resp, err = client.CmdStatus(ctx, &cnipb.StatusRequest{NetworkConfiguration: args.StdinData})
	default:
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI command %q", cmd), "")
	}
	if err != nil {
		// The daemon reports CNI errors inside the response, so a gRPC
		// error means the transport failed: the daemon died, restarted
		// or timed out mid-request.
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("seine daemon call %s over %s failed", cmd, socket), err.Error())
	}
	if e := resp.GetError(); e != nil {
		return types.NewError(uint(e.GetCode()), e.GetMsg(), e.GetDetails())
	}
	if cmd == "ADD" {
		if len(resp.GetCniResult()) == 0 {
			return types.NewError(types.ErrInternal, "seine daemon returned an empty ADD result", "")
		}
		if _, err := p.Stdout.Write(resp.GetCniResult()); err != nil {
			return types.NewError(types.ErrIOFailure, "writing result to stdout", err.Error())
		}
	}
	return nil
}

// notRunning is the error for a daemon that cannot be reached: try again
// later (11) for commands about containers, plugin not available (50) for
// STATUS (CNI spec, section "STATUS").
func notRunning(cmd, socket string, cause error) *types.Error {
	code := types.ErrTryAgainLater
	if cmd == "STATUS" {
		code = types.ErrPluginNotAvailable
	}
	return types.NewError(code, fmt.Sprintf("seine daemon not running: cannot connect to %s: %v", socket, cause), "")
}

// dial connects to the daemon socket within ConnectTimeout and returns a
// gRPC connection that uses that socket connection first, so an absent
// daemon is detected here rather than as a vague RPC failure.
// The returned function closes the connection.
func dial(ctx context.Context, socket string) (*grpc.ClientConn, func(), error) {
	d := net.Dialer{Timeout: ConnectTimeout}
	raw, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Err != nil {
			err = oe.Err // drop the repeated "dial unix <socket>" prefix
		}
		return nil, nil, err
	}
	var used atomic.Bool
	conn, err := grpc.NewClient("passthrough:///seine-daemon",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if used.CompareAndSwap(false, true) {
				return raw, nil
			}
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		raw.Close()
		return nil, nil, err
	}
	return conn, func() {
		conn.Close()
		if used.CompareAndSwap(false, true) {
			raw.Close() // never handed to gRPC
		}
	}, nil
}
