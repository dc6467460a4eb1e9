#!/bin/bash
# Builds Antrea's NetworkPolicy controller test binary (the package that
# holds TestInitXLargeScale*), so that policy/compute's BenchmarkSideBySide
# can run Antrea's controller next to Seine's on the same machine.
#
# Antrea's code is never copied into this repository: it is built in a
# scratch directory and only the test binary is kept, in
# ~/.cache/seine/antrea-$ANTREA_VERSION/networkpolicy.test.
#
# Sources, in order:
#   ANTREA_SRC          a directory holding Antrea's source at ANTREA_VERSION
#                       (a checkout or an extracted release tarball);
#   otherwise           the Go module proxy (antrea.io/antrea@ANTREA_VERSION).
# Antrea's go.mod pins antrea.io/ofnet and antrea.io/libOpenflow; when the
# proxy does not serve them, point ANTREA_OFNET_SRC and
# ANTREA_LIBOPENFLOW_SRC at checkouts of the versions its go.mod names.
#
# Exit status 2 means Antrea's source could not be obtained (the benchmark
# then reports Seine alone, next to Antrea's published figures).
set -euo pipefail

ANTREA_VERSION=${ANTREA_VERSION:-v2.4.0}
out=${ANTREA_CACHE:-$HOME/.cache/seine/antrea-$ANTREA_VERSION}
bin=$out/networkpolicy.test
if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi
scratch=$(mktemp -d /tmp/seine-antrea-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

if [[ -n ${ANTREA_SRC:-} ]]; then
	cp -r "$ANTREA_SRC" "$scratch/src"
else
	mod=antrea.io/antrea
	[[ $ANTREA_VERSION == v2.[5-9]* || $ANTREA_VERSION == v[3-9]* ]] && mod=antrea.io/antrea/v2
	if ! dir=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$mod@$ANTREA_VERSION" 2>/dev/null |
		sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') || [[ -z $dir ]]; then
		echo "antrea: $mod@$ANTREA_VERSION is not available from the module proxy; set ANTREA_SRC" >&2
		exit 2
	fi
	cp -r "$dir" "$scratch/src"
fi
chmod -R u+w "$scratch/src"
cd "$scratch/src"
for m in ofnet libOpenflow; do
	var=ANTREA_$(echo "$m" | tr '[:lower:]' '[:upper:]')_SRC
	src=${!var:-}
	if [[ -n $src ]]; then
		cp -r "$src" "$scratch/$m"
		chmod -R u+w "$scratch/$m"
		go mod edit -replace "antrea.io/$m=$scratch/$m"
	fi
done
if [[ -d $scratch/ofnet && -d $scratch/libOpenflow ]]; then
	(cd "$scratch/ofnet" && go mod edit -replace "antrea.io/libOpenflow=$scratch/libOpenflow")
fi
mkdir -p "$out"
GOFLAGS=-mod=mod go test -c -o "$bin.tmp" ./pkg/controller/networkpolicy/
mv "$bin.tmp" "$bin"
echo "$bin"
