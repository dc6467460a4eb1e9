package traceflow

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/tests/apienv"
)

// A real API server with deploy/crds refuses the Traceflows the daemon
// refuses (specCases), naming the field, and stores the valid one.
func TestCRDRefusesOutOfBoundsSpec(t *testing.T) {
	ops := opsclient.NewForConfigOrDie(apienv.Start(t, "../../deploy/crds"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, tc := range specCases() {
		tf := &opsv1alpha1.Traceflow{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tf-%d", i)}, Spec: validSpec()}
		tc.change(&tf.Spec)
		_, err := ops.OpsV1alpha1().Traceflows().Create(ctx, tf, metav1.CreateOptions{})
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field == "":
		case !apierrors.IsInvalid(err):
			t.Errorf("%s: created (%v), want Invalid", tc.name, err)
		case !strings.Contains(err.Error(), "spec."+tc.field):
			t.Errorf("%s: error %q does not name spec.%s", tc.name, err, tc.field)
		}
	}
}
