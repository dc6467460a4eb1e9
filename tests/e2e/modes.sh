#!/usr/bin/env bash
# Runs the end-to-end suite once per traffic mode (`make test` calls it).
#
# Every mode gets its own shared sandbox (SEINE_E2E_MODE; two transport
# subnets except for encap). The "tables" — every Pod pair, the 48
# NetworkPolicy scenarios by Pod IP and through ClusterIPs, the Service
# tests — run in full in the modes listed in SEINE_E2E_MODES, and as a smoke
# subset in the others:
#
#   SEINE_E2E_MODES=all               every mode in full (about 30 minutes)
#   SEINE_E2E_MODES="hybrid noEncap"  those in full, the others smoke
#   unset                             one mode in full, picked by the commit
#                                     (so successive commits rotate through
#                                     the modes), the others smoke
#
# The encap run always runs every other test of the suite too (restarts,
# failover, tunnels, CNI); the other modes run their own tests, the Pod
# connectivity tests and the tables. A smoke run of a mode other than encap
# takes about two minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."

GO=${GO:-go}
TIMEOUT=${TEST_TIMEOUT:-25m}
MODES=(encap noEncap hybrid networkPolicyOnly)

# Tables beyond the smoke subset (skipped in a smoke run).
EXTRA_TABLES='^(TestNetpolConformanceViaClusterIP|TestServiceNoEndpointsRejects|TestServiceFollowsEndpoints|TestServiceSessionAffinity|TestServiceInternalTrafficPolicyLocal|TestServiceThousandEndpoints|TestServiceKeepsEstablishedConnections|TestServiceProxyDisabled|TestServiceExternalTrafficPolicyLocal)$'
# What a mode other than encap runs.
MODE_TESTS='^(TestMode.*|TestAllPodPairs|TestPodToPod|TestPodAndNodeTraffic|TestPodToExternalIsMasqueraded|TestPodDeletionReleasesEverything|TestMTU|TestNodeDeletionRemovesPeerState|TestRestartKeepsTraffic|TestNetpolConformance.*|TestService.*)$'

full="${SEINE_E2E_MODES:-}"
if [ -z "$full" ]; then
	rev=$(git rev-parse HEAD 2>/dev/null || echo 0)
	full=${MODES[$(( 16#${rev:0:1} % ${#MODES[@]} ))]}
	echo "e2e: full tables in $full this commit (SEINE_E2E_MODES=all for every mode)"
elif [ "$full" = all ]; then
	full="${MODES[*]}"
fi

failed=()
for m in "${MODES[@]}"; do
	args=(-count=1 -p 1 -timeout "$TIMEOUT" -v)
	tables=smoke
	case " ${full//,/ } " in *" $m "*) tables=full ;; esac
	[ "$m" != encap ] && args+=(-run "$MODE_TESTS")
	[ "$tables" = smoke ] && args+=(-skip "$EXTRA_TABLES")
	echo "=== e2e mode $m, tables $tables"
	start=$(date +%s)
	if ! SEINE_E2E_MODE=$m SEINE_E2E_TABLES=$tables "$GO" test "${args[@]}" ./tests/e2e; then
		failed+=("$m")
	fi
	echo "=== e2e mode $m, tables $tables: $(( $(date +%s) - start )) s"
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "e2e failed in mode(s): ${failed[*]}"
	exit 1
fi
