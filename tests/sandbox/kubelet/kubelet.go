// Package kubelet is a minimal kubelet for the Seine sandbox. It runs as
// one long-lived process per Node inside the Node's network namespace and
// does the parts of a kubelet that matter to a network plugin:
//
//   - registers the Node (InternalIP = underlay address, fixed capacity,
//     Ready) and keeps it Ready through a Lease in kube-node-lease and
//     Ready-condition heartbeats;
//   - for each Pod bound to the Node: creates a network namespace
//     "seine-<sandbox>-pod-<uid[:8]>", runs CNI ADD through libcni with
//     the arguments a real kubelet passes, starts echo servers (package
//     echo) for the declared container ports and reports the Pod Running
//     and Ready with the IP from the CNI result;
//   - on deletion: stops the servers, runs CNI DEL, deletes the namespace
//     and finishes a graceful deletion with gracePeriodSeconds=0.
//
// There are no containers: a "container" is the set of echo servers.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/seine-net/seine/tests/sandbox/echo"
)

// Config configures one kubelet.
type Config struct {
	// Sandbox is the sandbox name; Pod namespaces are named
	// PodNetNSName(Sandbox, uid).
	Sandbox string
	// NodeName is the Node object's name.
	NodeName string
	// NodeIP is the Node's underlay IPv4 address (InternalIP, hostIP).
	NodeIP string
	// Kubeconfig is the path of a kubeconfig usable from the Node's netns.
	Kubeconfig string
	// CNIBinDir is the Node's own CNI plugin directory, searched first.
	CNIBinDir string
	// ExtraCNIPaths are searched after CNIBinDir (default /usr/lib/cni).
	ExtraCNIPaths []string
	// CNIConfDir holds the network configuration (*.conflist).
	CNIConfDir string
	// CNICacheDir is libcni's result cache (instead of /var/lib/cni).
	CNICacheDir string
	// PodStateDir receives one PodState file per Pod.
	PodStateDir string
	// HeartbeatInterval is the Lease/status renewal period (default 10 s).
	HeartbeatInterval time.Duration
}

// Kubelet is a running kubelet; create it with New and run it with Run.
type Kubelet struct {
	cfg    Config
	log    *zap.Logger
	client kubernetes.Interface
	lister corelisters.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]
	// pods is owned by the single worker goroutine.
	pods map[string]*podRuntime
}

// podRuntime is a Pod set up on this Node.
type podRuntime struct {
	state   PodState
	servers *echo.Servers // nil after a kubelet restart until re-served
}

// New checks cfg and builds a client from cfg.Kubeconfig.
func New(cfg Config, log *zap.Logger) (*Kubelet, error) {
	if cfg.Sandbox == "" || cfg.NodeName == "" || cfg.NodeIP == "" || cfg.Kubeconfig == "" ||
		cfg.CNIConfDir == "" || cfg.PodStateDir == "" {
		return nil, errors.New("kubelet: sandbox, node name, node IP, kubeconfig, CNI conf dir and pod state dir are required")
	}
	if cfg.ExtraCNIPaths == nil {
		cfg.ExtraCNIPaths = []string{"/usr/lib/cni"}
	}
	if cfg.CNICacheDir == "" {
		cfg.CNICacheDir = filepath.Join(filepath.Dir(cfg.CNIConfDir), "cni-cache")
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubelet: load kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "seine-sandbox-kubelet/" + cfg.NodeName
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubelet: client: %w", err)
	}
	return &Kubelet{cfg: cfg, log: log.With(zap.String("node", cfg.NodeName)), client: client,
		pods: map[string]*podRuntime{}}, nil
}

// Run registers the Node and serves Pods until ctx ends. Pods keep their
// namespaces when Run returns (like a real kubelet that stops); their
// servers end with the process.
func (k *Kubelet) Run(ctx context.Context) error {
	for {
		err := k.registerNode(ctx)
		if err == nil {
			break
		}
		k.log.Warn("node registration failed, retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	go k.heartbeat(ctx, k.cfg.HeartbeatInterval)

	k.queue = workqueue.NewTypedRateLimitingQueue(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second))
	defer k.queue.ShutDown()

	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.cfg.NodeName).String()
		}))
	inf := factory.Core().V1().Pods()
	k.lister = inf.Lister()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("kubelet: pod informer: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("kubelet: pod cache did not sync: %w", ctx.Err())
	}

	// Adopt what a previous run of this kubelet left: Pods still present
	// get their servers back, the others are torn down.
	states, err := ListPodStates(k.cfg.PodStateDir)
	if err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	for _, st := range states {
		if st.Node != k.cfg.NodeName {
			continue
		}
		key := st.Namespace + "/" + st.Name
		k.pods[key] = &podRuntime{state: *st}
		k.queue.Add(key)
		k.log.Info("adopting pod from state file", zap.String("pod", key))
	}

	go func() {
		<-ctx.Done()
		k.queue.ShutDown()
	}()
	k.log.Info("kubelet running")
	for k.processNext(ctx) {
	}
	for _, p := range k.pods {
		p.servers.Close()
	}
	return nil
}

func (k *Kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		if ctx.Err() != nil {
			return false
		}
		k.log.Warn("pod sync failed, retrying", zap.String("pod", key), zap.Error(err),
			zap.Int("attempts", k.queue.NumRequeues(key)+1))
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// sync brings one Pod (namespace/name) to its desired state.
func (k *Kubelet) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := k.lister.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		pod = nil
	} else if err != nil {
		return fmt.Errorf("get pod from cache: %w", err)
	}
	rt := k.pods[key]
	if rt != nil && (pod == nil || pod.UID != rt.state.UID || pod.DeletionTimestamp != nil) {
		if err := k.teardown(ctx, rt); err != nil {
			return err
		}
		delete(k.pods, key)
		rt = nil
	}
	if pod == nil {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		return k.finishDeletion(ctx, pod)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	if rt == nil {
		rt, err = k.setup(ctx, pod)
		if err != nil {
			k.recordSetupFailure(ctx, pod, err)
			return err
		}
		k.pods[key] = rt
	}
	if rt.servers == nil {
		if err := k.serve(rt); err != nil {
			return err
		}
	}
	if !statusUpToDate(pod, rt) {
		if err := k.writeRunningStatus(ctx, pod, rt); err != nil {
			return err
		}
	}
	return nil
}

// setup creates the Pod's namespace and network and starts its servers.
func (k *Kubelet) setup(ctx context.Context, pod *corev1.Pod) (*podRuntime, error) {
	log := k.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name))
	containerID, err := newContainerID()
	if err != nil {
		return nil, err
	}
	st := PodState{
		Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Node: k.cfg.NodeName,
		ContainerID: containerID, Ports: portStrings(podPorts(pod)),
	}
	if pod.Spec.HostNetwork {
		st.HostNetwork = true
		st.IP = k.cfg.NodeIP
		st.IPs = []string{k.cfg.NodeIP}
	} else {
		list, err := k.loadConfList()
		if err != nil {
			return nil, err
		}
		st.NetNS = PodNetNSName(k.cfg.Sandbox, string(pod.UID))
		if err := addNetNS(ctx, st.NetNS); err != nil {
			return nil, err
		}
		rtc := runtimeConf(pod, string(pod.UID), containerID, filepath.Join(NetNSDir, st.NetNS))
		ips, err := k.cniAdd(ctx, list, rtc)
		if err != nil {
			// Undo the partial attempt: DEL is idempotent per the CNI spec.
			if derr := k.cniConfig().DelNetworkList(ctx, list, rtc); derr != nil {
				log.Warn("CNI DEL after failed ADD failed", zap.Error(derr))
			}
			if derr := delNetNS(ctx, st.NetNS); derr != nil {
				log.Warn("removing netns after failed ADD failed", zap.Error(derr))
			}
			return nil, err
		}
		st.IP, st.IPs = ips[0], ips
	}
	rt := &podRuntime{state: st}
	if err := k.serve(rt); err != nil {
		_ = k.teardown(ctx, rt)
		return nil, err
	}
	if err := writePodState(k.cfg.PodStateDir, &rt.state); err != nil {
		_ = k.teardown(ctx, rt)
		return nil, err
	}
	log.Info("pod network ready", zap.String("netns", st.NetNS), zap.String("ip", st.IP),
		zap.String("container_id", containerID))
	return rt, nil
}

func (k *Kubelet) serve(rt *podRuntime) error {
	nsPath := ""
	if !rt.state.HostNetwork {
		nsPath = filepath.Join(NetNSDir, rt.state.NetNS)
	}
	var ports []echo.Port
	for _, s := range rt.state.Ports {
		p, err := echo.ParsePort(s)
		if err == nil {
			ports = append(ports, p)
		}
	}
	srv, err := echo.Serve(nsPath, rt.state.Name, ports, k.log.With(zap.String("pod", rt.state.Namespace+"/"+rt.state.Name)))
	if err != nil {
		return fmt.Errorf("start servers of %s/%s: %w", rt.state.Namespace, rt.state.Name, err)
	}
	rt.servers = srv
	return nil
}

// teardown stops the servers, runs CNI DEL, deletes the namespace and the
// state file. It is safe to repeat after a partial failure.
func (k *Kubelet) teardown(ctx context.Context, rt *podRuntime) error {
	st := rt.state
	rt.servers.Close()
	rt.servers = nil
	if !st.HostNetwork && st.NetNS != "" {
		nsPath := filepath.Join(NetNSDir, st.NetNS)
		if _, err := os.Stat(nsPath); err != nil {
			nsPath = "" // CNI spec: DEL without a namespace is allowed
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: st.Namespace, Name: st.Name, UID: st.UID}}
		if err := k.cniDel(ctx, runtimeConf(pod, string(st.UID), st.ContainerID, nsPath)); err != nil {
			return fmt.Errorf("teardown %s/%s: %w", st.Namespace, st.Name, err)
		}
		if err := delNetNS(ctx, st.NetNS); err != nil {
			return fmt.Errorf("teardown %s/%s: %w", st.Namespace, st.Name, err)
		}
	}
	if err := removePodState(k.cfg.PodStateDir, st.Namespace, st.Name); err != nil {
		return err
	}
	k.log.Info("pod torn down", zap.String("pod", st.Namespace+"/"+st.Name), zap.String("netns", st.NetNS))
	return nil
}

// finishDeletion completes a graceful deletion once the Pod is torn down,
// as the kubelet does with a zero grace period and a UID precondition.
func (k *Kubelet) finishDeletion(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("finish deletion of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func podPorts(pod *corev1.Pod) []echo.Port {
	seen := map[echo.Port]bool{}
	var out []echo.Port
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			ep := echo.Port{Port: p.ContainerPort, Protocol: p.Protocol}
			if ep.Protocol == "" {
				ep.Protocol = corev1.ProtocolTCP
			}
			if !seen[ep] {
				seen[ep] = true
				out = append(out, ep)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Protocol < out[j].Protocol
	})
	return out
}

func portStrings(ps []echo.Port) []string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
	}
	return out
}
