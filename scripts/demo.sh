#!/usr/bin/env bash
# make demo: the seed's node, simulated. Until the runtime shim lands this lists the two GPUs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
export MOCK_NVML_CONFIG=$here/tools/mock-nvml/examples/two-rtx3080.json
export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
"$build/bin/gpufence" list
