package ctl

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsfake "github.com/seine-net/seine/node/client/clientset/versioned/fake"
)

// testApp is seinectl with the given cluster clients and its output in out
// and errOut.
func testApp(cl *clients) (app *cli.App, out, errOut *bytes.Buffer) {
	app = NewApp()
	out, errOut = &bytes.Buffer{}, &bytes.Buffer{}
	app.Writer, app.ErrWriter = out, errOut
	app.Metadata = map[string]any{clientsKey: cl}
	return app, out, errOut
}

// tracingNodes is a fake ops clientset whose Traceflows are created with
// the status status (a Node that already ran them).
func tracingNodes(status opsv1alpha1.TraceflowStatus) *opsfake.Clientset {
	ops := opsfake.NewSimpleClientset()
	ops.PrependReactor("create", "traceflows", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tf := a.(k8stesting.CreateAction).GetObject().(*opsv1alpha1.Traceflow)
		tf.Name = tf.GenerateName + "x1"
		tf.Status = status
		return false, nil, nil // the tracker stores it
	})
	return ops
}

func deleted(ops *opsfake.Clientset) bool {
	for _, a := range ops.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "traceflows" {
			return true
		}
	}
	return false
}

// The trace is printed in every output format; only a Succeeded one exits
// 0, and the Traceflow is deleted either way.
func TestTraceflowExitsNonZeroUnlessSucceeded(t *testing.T) {
	start := metav1.Now()
	for _, phase := range []string{opsv1alpha1.TraceflowSucceeded, opsv1alpha1.TraceflowFailed} {
		for _, o := range []string{"", "json", "yaml"} {
			ops := tracingNodes(opsv1alpha1.TraceflowStatus{Phase: phase, SourceNode: "n1", StartTime: &start,
				Reason: "no Node reported the packet in time", Result: opsv1alpha1.TraceDelivered})
			app, out, _ := testApp(&clients{ops: ops})
			err := app.Run([]string{"seinectl", "traceflow", "-S", "default/a", "-D", "default/b", "-o", o})
			if !strings.Contains(out.String(), "tf-a-x1") {
				t.Errorf("%s -o %q: the trace was not printed: %q", phase, o, out.String())
			}
			if phase == opsv1alpha1.TraceflowSucceeded && err != nil {
				t.Errorf("%s -o %q: %v", phase, o, err)
			}
			if phase == opsv1alpha1.TraceflowFailed && (err == nil || !strings.Contains(err.Error(), "no Node reported the packet in time")) {
				t.Errorf("%s -o %q: error %v, want the Node's reason", phase, o, err)
			}
			if !deleted(ops) {
				t.Errorf("%s -o %q: the Traceflow was not deleted", phase, o)
			}
		}
	}
}

// A trace still Running when seinectl stops waiting is an error naming the
// phase.
func TestTraceflowStillRunningIsAnError(t *testing.T) {
	ops := tracingNodes(opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowRunning, SourceNode: "n1"})
	tfs := ops.OpsV1alpha1().Traceflows()
	tf, err := tfs.Create(context.Background(), &opsv1alpha1.Traceflow{ObjectMeta: metav1.ObjectMeta{GenerateName: "tf-a-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := waitTraceflow(context.Background(), tfs, tf, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	err = traceflowOutcome(got, 15*time.Second)
	if err == nil || !strings.Contains(err.Error(), "still Running") || !strings.Contains(err.Error(), "n1") {
		t.Fatalf("outcome of a Running trace: %v", err)
	}
}

// An interrupt (the context cancelled while waiting) ends the command with
// its cause, and the Traceflow is still deleted.
func TestTraceflowInterruptedStillDeletes(t *testing.T) {
	ops := tracingNodes(opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowRunning, SourceNode: "n1"})
	ctx, cancel := context.WithCancelCause(context.Background())
	interrupt := errors.New("interrupt signal received")
	ops.PrependReactor("get", "traceflows", func(k8stesting.Action) (bool, runtime.Object, error) {
		cancel(interrupt) // Ctrl-C while waiting
		return false, nil, nil
	})
	app, _, _ := testApp(&clients{ops: ops})
	err := app.RunContext(ctx, []string{"seinectl", "traceflow", "-S", "default/a", "-D", "10.0.0.1"})
	if !errors.Is(err, interrupt) {
		t.Errorf("error %v, want the interrupt", err)
	}
	if !deleted(ops) {
		t.Error("the Traceflow was not deleted")
	}
}

// The API counts whole seconds: --timeout rounds a fraction up and refuses
// less than a second (0 would be the Node's default of 10s).
func TestTraceflowTimeout(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int32
		ok   bool
	}{{500 * time.Millisecond, 0, false}, {0, 0, false}, {-time.Second, 0, false},
		{time.Second, 1, true}, {1500 * time.Millisecond, 2, true}, {10 * time.Second, 10, true}} {
		got, err := timeoutSeconds(tc.d)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("timeoutSeconds(%s) = %d, %v; want %d (ok %v)", tc.d, got, err, tc.want, tc.ok)
		}
	}
	ops := tracingNodes(opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowSucceeded})
	app, _, _ := testApp(&clients{ops: ops})
	err := app.Run([]string{"seinectl", "traceflow", "-S", "default/a", "-D", "10.0.0.1", "--timeout", "500ms"})
	if err == nil || !strings.Contains(err.Error(), "500ms") {
		t.Errorf("--timeout 500ms: %v", err)
	}
	if len(ops.Actions()) != 0 {
		t.Errorf("--timeout 500ms created a Traceflow: %v", ops.Actions())
	}
}
