// Command coredns is the cluster DNS of the sandbox's real Nodes (`make
// node-tools`): CoreDNS built from its Go module with only the plugins a
// cluster's kube-dns needs, so the conformance suite's DNS tests can run.
// Which plugins a server block may use, and in which order they run, is
// the CoreDNS convention for custom builds: dnsserver.Directives.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func main() {
	dnsserver.Directives = []string{
		"reload", "health", "ready", "errors", "log", "loadbalance", "cache",
		"hosts", "kubernetes", "loop", "whoami",
	}
	coremain.Run()
}
