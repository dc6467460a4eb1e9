package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// serviceAccountTokenSeconds is the requested lifetime of tokens written
// by ServiceAccountKubeconfig: 24 h.
const serviceAccountTokenSeconds = 24 * 60 * 60

// writeKubeconfig writes a single-context kubeconfig ("sandbox") at path
// with the cluster CA embedded and the given user credentials.
func (cp *ControlPlane) writeKubeconfig(path, server string, user *clientcmdapi.AuthInfo) error {
	ca, err := os.ReadFile(cp.CACertFile())
	if err != nil {
		return fmt.Errorf("read CA certificate: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["sandbox"] = user
	cfg.Contexts["sandbox"] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: "sandbox"}
	cfg.CurrentContext = "sandbox"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory of kubeconfig %s: %w", path, err)
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// WriteAdminKubeconfig writes a kubeconfig at path for server (a URL such
// as https://198.18.255.2:6443, whose host must be covered by the serving
// certificate: 127.0.0.1, AdvertiseAddress, ExtraSANs or a kubernetes.*
// DNS name) that authenticates with the admin client certificate
// (system:masters). Certificate, key and CA are embedded.
func (cp *ControlPlane) WriteAdminKubeconfig(path, server string) error {
	cert, err := os.ReadFile(cp.path("pki", "admin.crt"))
	if err != nil {
		return fmt.Errorf("read admin certificate: %w", err)
	}
	key, err := os.ReadFile(cp.path("pki", "admin.key"))
	if err != nil {
		return fmt.Errorf("read admin key: %w", err)
	}
	return cp.writeKubeconfig(path, server, &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key})
}

// ServiceAccountKubeconfig creates the Namespace namespace and the
// ServiceAccount namespace/name if missing, obtains a 24 h bearer token for
// it with the TokenRequest API (POST .../serviceaccounts/NAME/token, bound
// to the default API audience) and writes a kubeconfig at path with server
// Server() that authenticates with that token, so a client using it has
// only the RBAC rights granted to the ServiceAccount.
//
// A non-empty node binds the token to that Node object (name and UID; it
// must exist): the API server then reports the Node in the request's user
// extra authentication.kubernetes.io/node-name, as it does for the token a
// kubelet projects into a Pod on that Node, and the token stops working
// when the Node is deleted (KEP-4193; GA in Kubernetes 1.33).
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name, node, path string) error {
	cs, _, err := cp.clientset()
	if err != nil {
		return err
	}
	var bound *authenticationv1.BoundObjectReference
	if node != "" {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("token bound to node %s: %w", node, err)
		}
		bound = &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
	}
	if err := ensureNamespace(ctx, cs, namespace); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	exp := int64(serviceAccountTokenSeconds)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp, BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("request token for service account %s/%s: %w", namespace, name, err)
	}
	return cp.writeKubeconfig(path, cp.Server(), &clientcmdapi.AuthInfo{Token: tr.Status.Token})
}
