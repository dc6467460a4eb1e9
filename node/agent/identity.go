package agent

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// nodeNameExtra is the user extra in which the API server names the Node a
// ServiceAccount token is bound to: the Node of the Pod it was projected
// into, or the Node object it was requested for (KEP-4193). The manifest's
// admission policy seine-node-identity reads it.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// checkIdentity asks the API server who the daemon is (a
// SelfSubjectReview, which every authenticated user may make) and logs an
// error when the manifest's admission policy would refuse the daemon's
// writes: a ServiceAccount token bound to no Node, or to another Node. It
// never fails the start-up: a cluster without the policy (custom RBAC, an
// admin kubeconfig) runs as before, and a review the API server does not
// answer is only logged.
func checkIdentity(ctx context.Context, kube kubernetes.Interface, node string, log *zap.Logger) {
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		log.Debug("self subject review failed; not checking the credentials' Node", zap.Error(err))
		return
	}
	u := r.Status.UserInfo
	extra := map[string][]string{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	if problem := identityProblem(u.Username, extra, node); problem != "" {
		log.Error("these credentials cannot write as this Node", zap.String("user", u.Username), zap.String("problem", problem))
		return
	}
	log.Info("credentials checked", zap.String("user", u.Username), zap.Strings("bound_node", extra[nodeNameExtra]))
}

// identityProblem says why the credentials of user (with its extra) would
// be refused the writes of Node node by seine-node-identity, or "" when
// they would not (or when user is not a ServiceAccount: the policy
// matches only seine's).
func identityProblem(user string, extra map[string][]string, node string) string {
	if !strings.HasPrefix(user, "system:serviceaccount:") {
		return ""
	}
	bound := extra[nodeNameExtra]
	switch {
	case len(bound) == 0:
		return "the ServiceAccount token is bound to no Node: use a seine Pod's own token, or on bare metal a token " +
			"bound to this Node (kubectl create token --bound-object-kind Node, docs/install-bare-metal.md)"
	case bound[0] != node:
		return fmt.Sprintf("the ServiceAccount token is bound to Node %s, not to this Node %s", bound[0], node)
	}
	return ""
}
