package server

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/seine-net/seine/node/cni/wire"
)

// minVersion is the lowest cniVersion for which a command exists (CNI spec:
// CHECK came with 0.4.0, STATUS and GC with 1.1.0).
var minVersion = map[string]string{
	CmdCheck:  "0.4.0",
	CmdStatus: "1.1.0",
	CmdGC:     "1.1.0",
}

// parseRequest validates one wire request and turns it into a Request.
// Errors carry the CNI code the runtime should see: 6 for undecodable JSON,
// 7 for an invalid configuration, 1 for an unsupported cniVersion and 4 for
// missing or malformed CNI_* parameters.
func parseRequest(in *wire.Request) (*Request, *Error) {
	if in.Version != wire.ProtocolVersion {
		return nil, &Error{
			Code:    types.ErrTryAgainLater,
			Msg:     fmt.Sprintf("the plugin speaks seine CNI protocol version %d, this daemon version %d", in.Version, wire.ProtocolVersion),
			Details: "plugin and daemon differ while an upgrade replaces them; the daemon's install-cni step installs the matching plugin",
		}
	}
	cmd := in.Command
	if !wire.Forwarded(cmd) {
		return nil, &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("unknown CNI command %q", cmd)}
	}
	conf, err := parseNetConf(cmd, in.Config)
	if err != nil {
		return nil, err
	}
	req := &Request{
		Command:     cmd,
		ContainerID: in.ContainerID,
		Netns:       in.Netns,
		IfName:      in.IfName,
		NetConf:     conf,
		RawConf:     in.Config,
	}
	switch cmd {
	case CmdAdd, CmdDel, CmdCheck:
		// CNI spec, section "Parameters": CNI_CONTAINERID and CNI_IFNAME
		// are required for ADD, DEL and CHECK; CNI_NETNS for ADD and CHECK.
		if req.ContainerID == "" {
			return nil, &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID is required"}
		}
		if req.IfName == "" {
			return nil, &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_IFNAME is required"}
		}
		if req.Netns == "" && cmd != CmdDel {
			return nil, &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_NETNS is required"}
		}
		// The reference library's rules (cni pkg/utils), which its
		// plugin skeleton applies: container IDs and interface names
		// end up in OVS external IDs, file names and link names.
		if e := utils.ValidateContainerID(req.ContainerID); e != nil {
			return nil, &Error{Code: e.Code, Msg: "CNI_CONTAINERID: " + e.Msg, Details: e.Details}
		}
		if e := utils.ValidateInterfaceName(req.IfName); e != nil {
			return nil, &Error{Code: e.Code, Msg: "CNI_IFNAME: " + e.Msg, Details: e.Details}
		}
	}
	if err := parseK8sArgs(in.Args, req); err != nil {
		return nil, err
	}
	return req, nil
}

// minMTU is the smallest MTU an IPv4 interface may have (RFC 791: every
// host must forward a 68-byte datagram without fragmenting it); the kernel
// refuses less for a device with IPv4 addresses.
const minMTU = 68

// parseNetConf decodes and validates the network configuration of cmd.
func parseNetConf(cmd string, raw []byte) (*NetConf, *Error) {
	conf := &NetConf{}
	if err := json.Unmarshal(raw, conf); err != nil {
		return nil, &Error{Code: types.ErrDecodingFailure, Msg: "failed to decode network configuration", Err: err}
	}
	given := fmt.Sprintf("config is %q", conf.CNIVersion)
	if conf.CNIVersion == "" {
		// CNI spec: a configuration without cniVersion is 0.1.0.
		conf.CNIVersion = "0.1.0"
		given = "config has no cniVersion (read as 0.1.0)"
	}
	if supported := wire.SupportedVersions(); !slices.Contains(supported, conf.CNIVersion) {
		return nil, &Error{
			Code:    types.ErrIncompatibleCNIVersion,
			Msg:     "incompatible CNI versions",
			Details: fmt.Sprintf("%s, seine supports %s", given, strings.Join(supported, ", ")),
		}
	}
	if min, ok := minVersion[cmd]; ok {
		if ge, err := version.GreaterThanOrEqualTo(conf.CNIVersion, min); err != nil || !ge {
			return nil, &Error{
				Code: types.ErrIncompatibleCNIVersion,
				Msg:  fmt.Sprintf("config version %s does not allow %s, which needs %s or later", conf.CNIVersion, cmd, min),
			}
		}
	}
	if conf.Name == "" {
		return nil, &Error{Code: types.ErrInvalidNetworkConfig, Msg: "invalid network configuration: missing network name"}
	}
	if e := utils.ValidateNetworkName(conf.Name); e != nil {
		return nil, &Error{Code: e.Code, Msg: "invalid network configuration: " + e.Msg, Details: e.Details}
	}
	if conf.Type == "" {
		return nil, &Error{Code: types.ErrInvalidNetworkConfig, Msg: "invalid network configuration: missing plugin type"}
	}
	if conf.MTU != 0 && (conf.MTU < minMTU || conf.MTU > 65535) {
		return nil, &Error{Code: types.ErrInvalidNetworkConfig,
			Msg: fmt.Sprintf("invalid network configuration: mtu %d out of range %d-65535 (0: the daemon's)", conf.MTU, minMTU)}
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.NetConf); err != nil {
			return nil, &Error{Code: types.ErrInvalidNetworkConfig, Msg: "invalid network configuration: bad prevResult", Err: err}
		}
	}
	if cmd == CmdGC {
		valid, e := validAttachments(raw)
		if e != nil {
			return nil, e
		}
		conf.ValidAttachments = valid
	}
	return conf, nil
}

// validAttachments reads the attachments a GC must keep (CNI spec 1.1,
// "GC"): "cni.dev/valid-attachments", or "cni.dev/attachments", the name
// the spec's text first gave it (containernetworking/cni#1101; libcni
// sends both since v1.2.3), which a runtime written to that text sends
// alone. A null list keeps nothing, as CRI-O
// sends for a network without Pods. A configuration with neither key
// does not say what is valid, and is refused: read as an empty list, it
// would release every attachment of the Node.
func validAttachments(raw []byte) ([]types.GCAttachment, *Error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return nil, &Error{Code: types.ErrDecodingFailure, Msg: "failed to decode network configuration", Err: err}
	}
	v, ok := keys["cni.dev/valid-attachments"]
	if !ok {
		v, ok = keys["cni.dev/attachments"]
	}
	if !ok {
		return nil, &Error{Code: types.ErrInvalidNetworkConfig,
			Msg: "invalid network configuration: GC without cni.dev/valid-attachments; nothing released, since which attachments are valid is unknown"}
	}
	var valid []types.GCAttachment
	if err := json.Unmarshal(v, &valid); err != nil {
		return nil, &Error{Code: types.ErrDecodingFailure, Msg: "failed to decode cni.dev/valid-attachments", Err: err}
	}
	return valid, nil
}

// parseK8sArgs fills the pod fields of req from CNI_ARGS, a string of
// "KEY=VALUE" pairs separated by ';' (CNI spec, section "Parameters"). Keys
// other than kubelet's K8S_POD_* are ignored.
func parseK8sArgs(args string, req *Request) *Error {
	if args == "" {
		return nil
	}
	for pair := range strings.SplitSeq(args, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return &Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("malformed CNI_ARGS pair %q: want KEY=VALUE", pair)}
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			req.PodNamespace = v
		case "K8S_POD_NAME":
			req.PodName = v
		case "K8S_POD_UID":
			req.PodUID = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			req.InfraContainerID = v
		}
	}
	return nil
}

// prevResult returns the request's prevResult as a current (1.x) result, or
// nil when the runtime sent none.
func prevResult(req *Request) (*current.Result, *Error) {
	if req.NetConf.PrevResult == nil {
		return nil, nil
	}
	prev, err := current.NewResultFromResult(req.NetConf.PrevResult)
	if err != nil {
		return nil, &Error{Code: types.ErrInvalidNetworkConfig, Msg: "invalid network configuration: cannot convert prevResult", Err: err}
	}
	return prev, nil
}

// encodeResult converts res to cniVersion and returns its JSON.
func encodeResult(res *current.Result, cniVersion string) ([]byte, *Error) {
	if res == nil {
		return nil, &Error{Code: ErrCodeInternal, Msg: "backend returned no result for ADD"}
	}
	conv, err := res.GetAsVersion(cniVersion)
	if err != nil {
		return nil, &Error{Code: types.ErrIncompatibleCNIVersion, Msg: fmt.Sprintf("cannot convert result to version %s", cniVersion), Err: err}
	}
	out, err := json.Marshal(conv)
	if err != nil {
		return nil, &Error{Code: ErrCodeInternal, Msg: "cannot encode result", Err: err}
	}
	return out, nil
}
