#!/usr/bin/env bash
# Builds the programs of a vendored tree in place (docs/vendoring.md): every package folder under
# DIR that holds a build.json (written by tools/vendor.py) gets <package>/lib/<library>_<arch>.so,
# the folder its own loader looks in first, exactly as an installed cake-train package does.
#
#   ci/build_vendored.sh DIR [ARCHES [TARGET ...]]
#
#   DIR      the vendored root, e.g. <flashinfer checkout>/flashinfer/experimental/cake (or one
#            vendored package folder)
#   ARCHES   auto (default: $CAKE_CUDA_ARCHS, else every arch nvcc supports among sm_90a,
#            sm_100a, sm_103a), or a list such as "sm_90a" or "sm_90a;sm_100a"
#   TARGET   only these libraries, as CMake targets <library>_<arch> (default: all); each
#            package's build record (lib/libraries.json) then lists the libraries its lib/ holds
#
# Environment: PYTHON (default python3, 3.10 or newer; runs the gate and the build plan),
# CAKE_BUILD_DIR (default build/vendored/<hash of DIR> in this checkout; keep it to rebuild
# nothing next time), CUDA_HOME or PATH for nvcc.
#
# It is this checkout's CMakeLists.txt with CAKE_PACKAGE_ROOT set to the vendored package
# folders (see its header), after `check_manifests --vendored-gate` passes on each of them.
# Nothing here imports the host library; the vendored packages' Python code is not run.
set -euo pipefail
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "$1" && pwd)
archs=${2:-${CAKE_CUDA_ARCHS:-auto}}
targets=("${@:3}")
python=${PYTHON:-python3}
say() { printf 'build_vendored: %s\n' "$*"; }

# --------------------------------------------------------------------------- packages + gate
# One line per vendored package: "<folder>\t<host root>\t<dotted package>".
packages=$("$python" - "$repo" "$dir" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from cake.core import manifest as mf

root = Path(sys.argv[2])
folders = [root] if (root / mf.MANIFEST_NAME).is_file() else sorted(
    p.parent for p in root.glob(f"*/{mf.MANIFEST_NAME}"))
if not folders:
    sys.exit(f"build_vendored: error: no {root}/<package>/{mf.MANIFEST_NAME}: "
             "vendor the families first (tools/vendor.py --into DIR ...)")
for folder in folders:
    dotted = mf.dotted_package_name(folder)
    print(f"{folder}\t{folder.parents[dotted.count('.')]}\t{dotted}")
EOF
)
package_root=()
while IFS=$'\t' read -r folder host package; do
  say "gate: $package ($folder)"
  "$python" "$repo/tools/check_manifests.py" --vendored-gate --root "$host" --package "$package"
  package_root+=("$folder")
done <<<"$packages"

# --------------------------------------------------------------------------- build
build=${CAKE_BUILD_DIR:-$repo/build/vendored/$(printf '%s' "$dir" | sha256sum | cut -c1-16)}
say "configuring $build for CAKE_CUDA_ARCHS=$archs"
# CMake's list separator: one -D value naming every package folder.
cmake -S "$repo" -B "$build" -G Ninja -DPython_EXECUTABLE="$(command -v "$python")" \
  -DCAKE_CUDA_ARCHS="$archs" -DCAKE_PACKAGE_ROOT="$(IFS=';'; echo "${package_root[*]}")"
if [[ ${#targets[@]} -gt 0 ]]; then
  cmake --build "$build" --target "${targets[@]}"
  # A package's record target (<package>_record) depends on every library of the package, so a
  # build of some targets writes no build record, and the loader refuses libraries that no
  # record lists: record the libraries each package's lib/ holds now (what this build dir made).
  for folder in "${package_root[@]}"; do
    shopt -s nullglob
    built=("$folder"/lib/*.so)
    shopt -u nullglob
    if [[ ${#built[@]} -gt 0 ]]; then
      "$python" "$repo/cake/core/trust.py" record "$folder/lib" "${built[@]}"
    fi
  done
else
  cmake --build "$build"
fi
for folder in "${package_root[@]}"; do
  count=$(find "$folder/lib" -maxdepth 1 -name '*.so' 2>/dev/null | wc -l)
  say "$folder/lib: $count librar$([[ $count == 1 ]] && echo y || echo ies)"
done
