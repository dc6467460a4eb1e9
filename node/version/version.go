// Package version reports the build's version, set at link time by the
// Makefile (-X github.com/seine-net/seine/node/version.version=...).
package version

import (
	"fmt"
	"runtime"
)

// version is written by the linker; it is never changed at run time.
var version = "v0.0.0-dev"

// Version returns the version string, e.g. "v0.1.0" or "v0.0.0-dev".
func Version() string { return version }

// String returns the version with the Go toolchain and platform.
func String() string {
	return fmt.Sprintf("%s (%s, %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
