// Package plugin is the CNI plugin side of seine, a thin client of the node
// daemon: it forwards each invocation over the daemon's root-only unix
// socket (package wire) and relays the answer to the runtime, the result
// JSON on stdout, or a CNI error object on stdout with exit status 1 (CNI
// spec, section "Error").
//
// The seine binary is also the daemon, and Go runs the initializers of
// about 310 of its packages before main; they cost about 8 ms of CPU,
// paid on every exec. So the plugin does not wait for main: this package's
// initializer runs the invocation and exits. Go initialises packages in
// the order of their import paths, each once its imports are done (Go
// spec, "Package initialization"), so this package and everything it
// imports must stay clear of heavy packages, of package net, whose
// vendored imports sort after every other path, and of any package whose
// own initializer sorts late, such as path/filepath (TestImportsStayLight
// here and TestPluginStartsEarly in package main guard that). With nothing
// else to wait for, seine-cni starts in about a quarter of the daemon's
// start-up time (docs/benchmarks.md).
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/seine-net/seine/node/cni/wire"
	"github.com/seine-net/seine/node/version"
)

const (
	// DefaultSocketPath is the daemon socket used when the network
	// configuration has no socketPath.
	DefaultSocketPath = "/var/run/seine/cni.sock"
	// CallTimeout bounds one whole invocation, daemon work included.
	CallTimeout = 2 * time.Minute
)

// CNI error codes the plugin itself returns (CNI spec, section "Error").
const (
	codeInvalidEnvironment = 4
	codeIOFailure          = 5
	codeDecodingFailure    = 6
	codeInvalidConfig      = 7
	codeTryAgainLater      = 11
	codeNotAvailable       = 50
	codeInternal           = 999 // types.ErrInternal of the reference library
)

func init() {
	if Invoked(os.Args[0], os.Getenv("CNI_COMMAND")) {
		os.Exit(Run(os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
}

// Invoked reports whether the binary runs as the CNI plugin: when it was
// executed as seine-cni, or with CNI_COMMAND set (runtimes execute the
// plugin under the conflist's "type", which may be any name).
func Invoked(argv0, cniCommand string) bool {
	// Not filepath.Base: package path/filepath has an initializer of
	// its own that sorts late, and would hold this package's back.
	return argv0[strings.LastIndexByte(argv0, '/')+1:] == "seine-cni" || cniCommand != ""
}

// Run runs one CNI invocation: getenv gives the CNI_* parameters, stdin
// the network configuration. It returns the exit status, 0 on success and
// 1 after writing a CNI error object to stdout. Without CNI_COMMAND it
// prints what the binary is to stderr and returns 0.
func Run(getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := getenv("CNI_COMMAND")
	if cmd == "" {
		fmt.Fprintf(stderr, "CNI plugin seine %s\nCNI protocol versions supported: %s\n",
			version.Version(), strings.Join(supported(), ", "))
		return 0
	}
	if cmd == "VERSION" {
		return printVersion(stdout) // stdin is not needed (and may be a terminal)
	}
	conf, err := io.ReadAll(io.LimitReader(stdin, wire.MaxConfigBytes+1))
	if err != nil {
		return fail(stdout, nil, &wire.Error{Code: codeIOFailure, Msg: "reading the network configuration from stdin", Details: err.Error()})
	}
	if len(conf) > wire.MaxConfigBytes {
		return fail(stdout, nil, &wire.Error{Code: codeInvalidConfig, Msg: fmt.Sprintf("network configuration on stdin exceeds %d bytes", wire.MaxConfigBytes)})
	}
	req := &wire.Request{
		Command:     cmd,
		ContainerID: getenv("CNI_CONTAINERID"),
		Netns:       getenv("CNI_NETNS"),
		IfName:      getenv("CNI_IFNAME"),
		Args:        getenv("CNI_ARGS"),
		Path:        getenv("CNI_PATH"),
		Config:      conf,
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	result, cerr := Forward(ctx, req)
	if cerr != nil {
		return fail(stdout, conf, cerr)
	}
	if len(result) > 0 {
		if _, err := stdout.Write(result); err != nil {
			return fail(stdout, conf, &wire.Error{Code: codeIOFailure, Msg: "writing the result to stdout", Details: err.Error()})
		}
	}
	return 0
}

// Forward sends req to the daemon whose socket the configuration names
// (socketPath, default DefaultSocketPath) and returns the ADD result (nil
// for the other commands) or the CNI error to report: the daemon's own; 4
// for an unknown command; 6 for a configuration that is not JSON; when
// the daemon's socket cannot be reached, 11 (try again later), or for
// STATUS success while the daemon's heartbeat is recent (it is restarting,
// wire.AliveGrace) and 50 (plugin not available) after that (CNI spec,
// section "STATUS"); and 11 when the exchange breaks off.
func Forward(ctx context.Context, req *wire.Request) (json.RawMessage, *wire.Error) {
	if !wire.Forwarded(req.Command) {
		return nil, &wire.Error{Code: codeInvalidEnvironment, Msg: fmt.Sprintf("unknown CNI_COMMAND %q", req.Command)}
	}
	var conf struct {
		SocketPath string `json:"socketPath"`
	}
	if err := json.Unmarshal(req.Config, &conf); err != nil {
		return nil, &wire.Error{Code: codeDecodingFailure, Msg: "failed to decode network configuration", Details: err.Error()}
	}
	socket := conf.SocketPath
	if socket == "" {
		socket = DefaultSocketPath
	}
	resp, err := wire.Call(ctx, socket, req)
	if ce := (*wire.ConnectError)(nil); errors.As(err, &ce) {
		code := uint(codeTryAgainLater)
		if req.Command == "STATUS" {
			if wire.RecentlyAlive(socket, time.Now()) {
				return nil, nil // restarting: the Node stays Ready
			}
			code = codeNotAvailable // CNI spec, section "STATUS"
		}
		return nil, &wire.Error{Code: code, Msg: fmt.Sprintf("seine daemon not running: %v", err)}
	}
	if err != nil {
		// The daemon reports CNI errors inside the response, so this
		// is the transport: the daemon died, restarted or timed out.
		return nil, &wire.Error{Code: codeTryAgainLater, Msg: fmt.Sprintf("seine daemon call %s over %s failed", req.Command, socket), Details: err.Error()}
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if req.Command == "ADD" && len(resp.Result) == 0 {
		return nil, &wire.Error{Code: codeInternal, Msg: "seine daemon returned an empty ADD result"}
	}
	return resp.Result, nil
}

// supported returns the CNI versions seine supports, oldest first.
func supported() []string {
	v := wire.SupportedVersions()
	slices.Reverse(v)
	return v
}

// printVersion answers VERSION without the daemon (CNI spec, section
// "VERSION"): the newest spec version and every version the plugin
// supports. Like the reference skeleton (cni pkg/skel), it answers whatever
// configuration came with the request.
func printVersion(stdout io.Writer) int {
	out, _ := json.Marshal(struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}{wire.SupportedVersions()[0], supported()})
	if _, err := stdout.Write(out); err != nil {
		return 1
	}
	return 0
}

// fail writes e as a CNI error object to stdout, in the configuration's
// cniVersion when it has one, and returns exit status 1.
func fail(stdout io.Writer, conf []byte, e *wire.Error) int {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(conf, &c)
	if c.CNIVersion == "" {
		c.CNIVersion = wire.SupportedVersions()[0]
	}
	out, _ := json.Marshal(struct {
		CNIVersion string `json:"cniVersion"`
		*wire.Error
	}{c.CNIVersion, e})
	_, _ = stdout.Write(out)
	return 1
}
