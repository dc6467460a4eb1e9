package proxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSyncHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newSyncHealth(time.Minute)
	h.now = func() time.Time { return now }
	get := func(path string) (int, proxyHealthBody) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var b proxyHealthBody
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatalf("%s: %v: %q", path, err, rec.Body.String())
		}
		return rec.Code, b
	}
	expect := func(what string, healthz, livez int) {
		t.Helper()
		if c, _ := get("/healthz"); c != healthz {
			t.Errorf("%s: /healthz %d, want %d", what, c, healthz)
		}
		if c, _ := get("/livez"); c != livez {
			t.Errorf("%s: /livez %d, want %d", what, c, livez)
		}
	}
	expect("starting, nothing queued", 200, 200)
	h.queued()
	now = now.Add(59 * time.Second)
	expect("a change waiting 59 s", 200, 200)
	h.queued() // does not restart the clock
	now = now.Add(2 * time.Second)
	expect("a change waiting 61 s", 503, 503)
	start := now
	now = now.Add(time.Second)
	h.programmed(start, true) // more came in during the batch
	expect("programmed, with changes from during the batch", 200, 200)
	now = now.Add(time.Minute)
	expect("those changes now a minute old", 503, 503)
	h.programmed(now, false)
	expect("all programmed", 200, 200)
	if c, b := get("/healthz"); c != 200 || b.NodeEligible == nil || !*b.NodeEligible || b.LastUpdated != now.String() {
		t.Errorf("/healthz body %+v", b)
	}
	if _, b := get("/livez"); b.NodeEligible != nil {
		t.Errorf("/livez names the Node's eligibility: %+v", b)
	}

	// A change that came in while a batch was programmed still waits,
	// though the queue looked empty.
	start = now
	now = now.Add(time.Second)
	h.queued()
	h.programmed(start, false)
	now = now.Add(time.Minute)
	expect("a change from during the batch, a minute on", 503, 503)
	h.programmed(now, false)

	node := &corev1.Node{}
	node.Spec.Taints = []corev1.Taint{{Key: TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}
	h.setNode(node)
	expect("the Node tainted for removal", 503, 200)
	if _, b := get("/healthz"); b.NodeEligible == nil || *b.NodeEligible {
		t.Errorf("tainted Node: /healthz body %+v", b)
	}
	h.setNode(&corev1.Node{})
	expect("the taint gone", 200, 200)
	h.setNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: now}}})
	expect("the Node being deleted", 503, 200)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("/metrics: %d, want 404", rec.Code)
	}
}

func TestOnlyHealthCheck(t *testing.T) {
	hc := healthCheckError{errors.New("port taken")}
	other := errors.New("bundle refused")
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{hc, true},
		{errors.Join(nil, hc), true},
		{errors.Join(other, hc), false},
		{other, false},
	} {
		if got := onlyHealthCheck(tc.err); got != tc.want {
			t.Errorf("onlyHealthCheck(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
