// Command render writes Seine's installation manifest (package deploy) for
// the given values to standard output or a file:
//
//	go run ./deploy/render --image registry.example/seine:v0.1.0 \
//	    --cluster-cidr 10.32.0.0/16 --kube-apiserver https://10.0.0.1:6443 --proxy-all > seine.yaml
//
// Without flags it renders the committed deploy/seine.yaml (`make manifests`).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/seine-net/seine/deploy"
)

func main() {
	v := deploy.DefaultValues()
	out := flag.String("o", "", "output file (default: standard output)")
	flag.StringVar(&v.Image, "image", v.Image, "the seine image, repository:tag")
	flag.StringVar(&v.ImagePullPolicy, "image-pull-policy", v.ImagePullPolicy, "IfNotPresent, Always or Never")
	flag.StringVar(&v.Namespace, "namespace", v.Namespace, "namespace of Seine's objects")
	flag.StringVar(&v.ClusterCIDR, "cluster-cidr", v.ClusterCIDR, "the cluster's Pod range (kube-controller-manager --cluster-cidr)")
	flag.StringVar(&v.ServiceCIDR, "service-cidr", v.ServiceCIDR, "the Service ClusterIP range")
	flag.StringVar(&v.OVSDatapathType, "ovs-datapath", v.OVSDatapathType, "system (kernel module) or netdev (userspace)")
	flag.StringVar(&v.KubeAPIServerOverride, "kube-apiserver", v.KubeAPIServerOverride,
		"API server URL to use instead of the in-cluster kubernetes Service (needed without kube-proxy)")
	flag.BoolVar(&v.ProxyAll, "proxy-all", v.ProxyAll, "replace kube-proxy entirely (NodePorts, externalIPs, LoadBalancer IPs, host traffic); needs --kube-apiserver")
	flag.StringVar(&v.TrafficEncapMode, "traffic-mode", v.TrafficEncapMode, "encap (default), noEncap, hybrid or networkPolicyOnly")
	flag.StringVar(&v.PrimaryCNIConflist, "primary-cni-conflist", v.PrimaryCNIConflist,
		"networkPolicyOnly: the routed primary CNI's conflist seine chains itself into, in /etc/cni/net.d")
	flag.BoolVar(&v.WithoutDaemonSet, "without-daemonset", v.WithoutDaemonSet,
		"leave out the ConfigMap and DaemonSet: the cluster-wide objects for Nodes that run seine as a systemd service")
	printImage := flag.Bool("print-image", false, "print the image reference and exit (for the Makefile)")
	flag.Parse()
	if *printImage {
		fmt.Println(v.Image)
		return
	}
	b, err := deploy.Render(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(2)
	}
	if *out == "" {
		_, err = os.Stdout.Write(b)
	} else {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
