package ovsctl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/datapath/ovstest"
)

func TestRunAndPurge(t *testing.T) {
	o := ovstest.Start(t)
	c := New(o.RunDir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.Run(ctx, "version")
	if err != nil || !strings.Contains(out, "ovs-vswitchd") {
		t.Fatalf("version: %q, %v", out, err)
	}
	if err := c.PurgeDatapathFlows(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, "no/such-command"); err == nil {
		t.Fatal("unknown command accepted")
	}
	if _, err := New(t.TempDir()).Run(ctx, "version"); err == nil {
		t.Fatal("missing daemon not reported")
	}
}
