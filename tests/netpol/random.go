package netpol

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SeedEnv is the environment variable that sets the random seed of the
// differential suites: a number, or "random" for a fresh one.
const SeedEnv = "SEINE_NETPOL_SEED"

// DefaultSeed is the seed when SeedEnv is unset, so that `make test` probes
// the same policy sets on every run (a red CI must mean a regression, not
// an unlucky draw). Exploring new sets is one SEINE_NETPOL_SEED=random away.
const DefaultSeed uint64 = 20261121

// Seed returns the seed SeedEnv asks for (DefaultSeed when unset, one from
// the clock for "random"). A malformed value is an error.
func Seed() (uint64, error) {
	switch v := os.Getenv(SeedEnv); v {
	case "":
		return DefaultSeed, nil
	case "random":
		return uint64(time.Now().UnixNano()), nil
	default:
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: want an unsigned integer or \"random\": %w", SeedEnv, v, err)
		}
		return s, nil
	}
}

// NewRand returns a deterministic generator for seed.
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5e1e)) }

// Generator makes random, API-valid NetworkPolicy sets over the model:
// podSelectors and namespaceSelectors with matchLabels and
// matchExpressions (In, NotIn, Exists, DoesNotExist) over the model's Pod
// and namespace labels, ipBlocks with except over the Pod IPs' ranges,
// numbered, named and ranged ports on TCP, UDP and SCTP, both directions,
// explicit and implied policyTypes.
type Generator struct {
	R *rand.Rand
	// S supplies Pod IPs for ipBlocks.
	S *State
}

// Policies returns 1..max policies (max < 1 means 4) with unique names.
func (g *Generator) Policies(max int) []*networkingv1.NetworkPolicy {
	if max < 1 {
		max = 4
	}
	n := 1 + g.R.IntN(max)
	out := make([]*networkingv1.NetworkPolicy, n)
	for i := range out {
		out[i] = g.Policy(fmt.Sprintf("rand-%d", i))
	}
	return out
}

// Policy returns one random policy named name.
func (g *Generator) Policy(name string) *networkingv1.NetworkPolicy {
	nss := Namespaces()
	p := NewPolicy(nss[g.R.IntN(len(nss))], name, g.podSelector(true))
	var ingress, egress bool
	switch g.R.IntN(3) {
	case 0:
		ingress = true
	case 1:
		egress = true
	default:
		ingress, egress = true, true
	}
	if ingress {
		for i, k := 0, g.R.IntN(3); i < k; i++ {
			p.Spec.Ingress = append(p.Spec.Ingress, From(g.peers(), g.ports()...))
		}
	}
	if egress {
		for i, k := 0, g.R.IntN(3); i < k; i++ {
			p.Spec.Egress = append(p.Spec.Egress, To(g.peers(), g.ports()...))
		}
	}
	// policyTypes: implied only where the default says the same thing
	// (Ingress always, Egress iff egress rules exist).
	implied := ingress && (!egress || len(p.Spec.Egress) > 0)
	if !implied || g.R.IntN(2) == 0 {
		if ingress {
			p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		}
		if egress {
			p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
	return p
}

func (g *Generator) pick(xs ...string) string { return xs[g.R.IntN(len(xs))] }

// podSelector: empty, matchLabels or a matchExpression over pod labels.
func (g *Generator) podSelector(allowEmpty bool) metav1.LabelSelector {
	switch k := g.R.IntN(6); {
	case k == 0 && allowEmpty:
		return Labels()
	case k <= 2:
		return Labels(LabelPod, g.pick(PodNames()...))
	default:
		return g.expr(LabelPod, PodNames())
	}
}

// nsSelector: empty, matchLabels on ns or kubernetes.io/metadata.name, or
// a matchExpression.
func (g *Generator) nsSelector() metav1.LabelSelector {
	key := g.pick(LabelNS, LabelMetadataName)
	switch g.R.IntN(5) {
	case 0:
		return Labels()
	case 1, 2:
		return Labels(key, g.pick(Namespaces()...))
	default:
		return g.expr(key, Namespaces())
	}
}

func (g *Generator) expr(key string, values []string) metav1.LabelSelector {
	pickN := func() []string {
		perm := g.R.Perm(len(values))
		n := 1 + g.R.IntN(2)
		out := make([]string, 0, n)
		for _, i := range perm[:n] {
			out = append(out, values[i])
		}
		return out
	}
	switch g.R.IntN(5) {
	case 0:
		return Expr(key, metav1.LabelSelectorOpIn, pickN()...)
	case 1:
		return Expr(key, metav1.LabelSelectorOpNotIn, pickN()...)
	case 2:
		return Expr(key, metav1.LabelSelectorOpExists)
	case 3:
		// A key no object has: DoesNotExist matches everything.
		return Expr("missing", metav1.LabelSelectorOpDoesNotExist)
	default:
		return Expr(key, metav1.LabelSelectorOpDoesNotExist)
	}
}

// peers: none (all peers) or 1..2 of podSelector / namespaceSelector /
// both / ipBlock.
func (g *Generator) peers() []networkingv1.NetworkPolicyPeer {
	if g.R.IntN(4) == 0 {
		return nil
	}
	var out []networkingv1.NetworkPolicyPeer
	for i, k := 0, 1+g.R.IntN(2); i < k; i++ {
		switch g.R.IntN(4) {
		case 0:
			out = append(out, PodPeer(g.podSelector(true)))
		case 1:
			out = append(out, NSPeer(g.nsSelector()))
		case 2:
			out = append(out, NSPodPeer(g.nsSelector(), g.podSelector(true)))
		default:
			out = append(out, g.ipBlock())
		}
	}
	return out
}

// ipBlock: a canonical range around a random Pod IP (prefix 16..32 within
// 10.244.0.0/16), optionally with an except range strictly inside it
// around another Pod IP of the range.
func (g *Generator) ipBlock() networkingv1.NetworkPolicyPeer {
	ips := g.podIPs()
	if len(ips) == 0 {
		return IPPeer("10.244.0.0/16")
	}
	base := ips[g.R.IntN(len(ips))]
	prefixes := []int{16, 22, 24, 25, 26, 28, 32}
	bits := prefixes[g.R.IntN(len(prefixes))]
	cidr := CIDR(base, bits)
	_, block, _ := net.ParseCIDR(cidr)
	if bits == 32 || g.R.IntN(2) == 0 {
		return IPPeer(cidr)
	}
	var inside []net.IP
	for _, ip := range ips {
		if block.Contains(ip) {
			inside = append(inside, ip)
		}
	}
	ex := inside[g.R.IntN(len(inside))]
	exBits := bits + 1 + g.R.IntN(32-bits)
	return IPPeer(cidr, CIDR(ex, exBits))
}

func (g *Generator) podIPs() []net.IP {
	if g.S == nil {
		return nil
	}
	var out []net.IP
	for _, p := range g.S.Pods {
		if p.IP != nil {
			out = append(out, p.IP)
		}
	}
	return out
}

// ports: none (all ports) or 1..2 port entries.
func (g *Generator) ports() []networkingv1.NetworkPolicyPort {
	if g.R.IntN(3) == 0 {
		return nil
	}
	choices := []func() networkingv1.NetworkPolicyPort{
		func() networkingv1.NetworkPolicyPort { return Port(80, "") },
		func() networkingv1.NetworkPolicyPort { return Port(81, corev1.ProtocolTCP) },
		func() networkingv1.NetworkPolicyPort { return Port(80, corev1.ProtocolUDP) },
		func() networkingv1.NetworkPolicyPort { return Port(81, corev1.ProtocolUDP) },
		func() networkingv1.NetworkPolicyPort { return NamedPort("serve-80-tcp", "") },
		func() networkingv1.NetworkPolicyPort { return NamedPort("serve-81-tcp", corev1.ProtocolTCP) },
		func() networkingv1.NetworkPolicyPort { return NamedPort("serve-80-udp", corev1.ProtocolUDP) },
		// A name whose protocol differs from the port's: resolves to nothing.
		func() networkingv1.NetworkPolicyPort { return NamedPort("serve-80-tcp", corev1.ProtocolUDP) },
		func() networkingv1.NetworkPolicyPort { return PortRange(80, 81, "") },
		func() networkingv1.NetworkPolicyPort { return PortRange(79, 80, corev1.ProtocolUDP) },
		func() networkingv1.NetworkPolicyPort { return AnyPort(corev1.ProtocolUDP) },
		func() networkingv1.NetworkPolicyPort { return AnyPort(corev1.ProtocolTCP) },
		func() networkingv1.NetworkPolicyPort { return Port(80, corev1.ProtocolSCTP) },
	}
	var out []networkingv1.NetworkPolicyPort
	for i, k := 0, 1+g.R.IntN(2); i < k; i++ {
		out = append(out, choices[g.R.IntN(len(choices))]())
	}
	return out
}
