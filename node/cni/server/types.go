package server

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// CNI commands as they appear in CNI_COMMAND (CNI spec, section "Parameters").
const (
	CmdAdd    = "ADD"
	CmdDel    = "DEL"
	CmdCheck  = "CHECK"
	CmdStatus = "STATUS"
	CmdGC     = "GC"
)

// Request is one parsed CNI invocation as the daemon sees it.
type Request struct {
	// Command is one of CmdAdd, CmdDel, CmdCheck, CmdStatus, CmdGC.
	Command string
	// ContainerID is CNI_CONTAINERID; empty for STATUS and GC.
	ContainerID string
	// Netns is CNI_NETNS, a path such as /var/run/netns/cni-1234; may be
	// empty for DEL (the namespace may already be gone).
	Netns string
	// IfName is CNI_IFNAME, the interface name to create inside Netns.
	IfName string
	// PodNamespace, PodName, PodUID and InfraContainerID come from the
	// K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID and
	// K8S_POD_INFRA_CONTAINER_ID keys that kubelet's runtimes put into
	// CNI_ARGS; empty when absent.
	PodNamespace, PodName, PodUID, InfraContainerID string
	// NetConf is the parsed network configuration; its PrevResult is set
	// when the runtime sent a prevResult.
	NetConf *NetConf
	// RawConf is the network configuration exactly as the plugin read it
	// from stdin.
	RawConf []byte
}

// NetConf is seine's plugin configuration: the generic CNI fields (cniVersion,
// name, type, capabilities, ipam, dns, prevResult, cni.dev/valid-attachments)
// plus seine's own. It is meant for decoding; marshalling it goes through the
// embedded PluginConf's MarshalJSON, which drops the seine fields.
type NetConf struct {
	types.NetConf
	// RuntimeConfig holds the runtimeConfig object the runtime injects for
	// the capabilities the plugin declared, keyed by capability name.
	RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig,omitempty"`
	// SocketPath is the daemon's CNI socket the plugin dials.
	SocketPath string `json:"socketPath"`
	// MTU, in bytes, of the container interface; 0 means the daemon's
	// default.
	MTU int `json:"mtu,omitempty"`
}

// Backend does the real work of each CNI command. Its methods are called with
// at most one request per container ID in flight, and never while a GC runs
// (Status excepted: STATUS takes no lock and may run at any time).
type Backend interface {
	// Add attaches the container and returns its result; the server
	// converts it to the request's cniVersion.
	Add(ctx context.Context, req *Request) (*current.Result, error)
	// Del detaches the container. It should succeed when the attachment
	// is already gone (CNI spec, section "DEL").
	Del(ctx context.Context, req *Request) error
	// Check verifies the attachment; prev is the runtime's prevResult
	// converted to the current result type, or nil when none was sent.
	Check(ctx context.Context, req *Request, prev *current.Result) error
	// Status reports whether the daemon is ready to serve ADDs; return an
	// *Error with code types.ErrPluginNotAvailable (50) or
	// types.ErrLimitedConnectivity (51) when it is not.
	Status(ctx context.Context) error
	// GC releases every attachment of this network that is not in valid.
	GC(ctx context.Context, req *Request, valid []types.GCAttachment) error
}

// Seine's own CNI error codes. The CNI spec (section "Error") reserves 1-99
// for well-known codes (see the Err* constants of
// github.com/containernetworking/cni/pkg/types) and leaves 100 and above to
// plugins.
const (
	// ErrCodeIPAMExhausted: the node's pod address pool has no free address.
	ErrCodeIPAMExhausted uint = 100
	// ErrCodeDatapath: programming the datapath (veth, OVS port, flows)
	// failed.
	ErrCodeDatapath uint = 101
	// ErrCodeInternal: any other failure inside the daemon; errors a
	// Backend returns that are not an *Error get this code.
	ErrCodeInternal uint = 102
)

// Error is an error with a CNI error code, returned to the runtime as the
// CNI error object {"code", "msg", "details"}.
type Error struct {
	// Code is a spec well-known code (1-99) or one of seine's ErrCode*.
	Code uint
	// Msg is a short human-readable message.
	Msg string
	// Details is optional longer text.
	Details string
	// Err is the cause, if any; it is appended to the details on the wire.
	Err error
}

// Errorf returns an *Error with the given code and a formatted message; a %w
// verb in format also sets Err.
func Errorf(code uint, format string, args ...any) *Error {
	wrapped := fmt.Errorf(format, args...)
	return &Error{Code: code, Msg: wrapped.Error(), Err: unwrapOnce(wrapped)}
}

func unwrapOnce(err error) error {
	if u, ok := err.(interface{ Unwrap() error }); ok {
		return u.Unwrap()
	}
	return nil
}

// Error returns "msg; details: cause" with empty parts left out.
func (e *Error) Error() string {
	msg, details := e.wireMsgDetails()
	switch {
	case msg == "":
		return details
	case details == "":
		return msg
	}
	return msg + "; " + details
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// wireMsgDetails returns the msg and details fields sent to the plugin.
func (e *Error) wireMsgDetails() (msg, details string) {
	msg, details = e.Msg, e.Details
	if e.Err != nil && !containsCause(msg, e.Err) {
		if msg == "" {
			msg = e.Err.Error()
		} else if details == "" {
			details = e.Err.Error()
		} else {
			details += ": " + e.Err.Error()
		}
	}
	return msg, details
}

func containsCause(msg string, cause error) bool {
	c := cause.Error()
	return c != "" && len(msg) >= len(c) && msg[len(msg)-len(c):] == c
}
