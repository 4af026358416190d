#!/usr/bin/env bash
# The seed scenario must fail when gpufence-runtime is replaced by plain runc: cri_seed.sh LINE
# with the gpufence handler's BinaryName set to runc (GF_CRI_HANDLER_BINARY), which has to exit 1
# with the isolation checks among its failures (the privileged pods reach the other GPU, the
# listing shows both GPUs). A skip of cri_seed.sh (exit 77) is passed on.
# Usage: cri_seed_runc.sh LINE
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
line=${1:?usage: cri_seed_runc.sh 1.6|1.7|2}
runc_bin=$(command -v runc) || { echo "SKIP: runc is not installed"; exit 77; }
out=$(GF_CRI_HANDLER_BINARY=$runc_bin GF_CRI_QUIET=1 bash "$here/cri_seed.sh" "$line" 2>&1)
rc=$?
[ "$rc" = 77 ] && { echo "$out" | grep '^SKIP'; exit 77; }
echo "$out" | grep -E '^(FAIL|ok  )' | grep -c '^ok' | sed 's/^/checks passed with runc as the handler: /'
echo "$out" | grep '^FAIL' | sed 's/^/  /'
fail=0
expect() { grep -qE -- "$1" <<<"$out" || { echo "FAIL: expected a failing check /$1/"; fail=1; }; }
[ "$rc" = 1 ] || { echo "FAIL: cri_seed.sh $line passed (exit $rc) with plain runc as the gpufence handler"; fail=1; }
expect '^FAIL - priv: pod [01] cannot open GPU [01] even after mknod'
# containerd lists its /dev for a privileged container (WithHostDevices), which holds both GPUs'
# nodes (cri_node.sh's private /dev): through plain runc the other GPU's node is there.
expect '^FAIL - priv: pod [01] has no node for GPU [01]'
expect '^FAIL - apps-priv: pod [01].s nvidia-smi -L lists one GPU'
expect '^FAIL - envall: pod [01] \(gpufence\) cannot open GPU [01] even after mknod'
[ "$fail" = 0 ] && echo "ok - containerd $line: the scenario fails with runc in place of gpufence-runtime"
exit $fail
