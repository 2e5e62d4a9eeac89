#!/usr/bin/env bash
# One device call: JIT all programs, GPU + CPU tests, compute-sanitizer, tile sweep, benchmark.
# Usage on the GPU machine, from the repository root (wheels of fla-core carried in .whl/;
# TUNE_SET picks the --tune set, default small):
#   bash tests/causal_conv1d/h200_run.sh [tests|sanitize|tune|bench ...]   (default: all)
set -o pipefail
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=/tmp/cake-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${*:-tests sanitize tune bench}
stamp() { echo "[$(date -u +%T)] $*"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 tools/bench/causal_conv1d.py --precompile 2>&1 | tail -1 || exit 1
for step in $steps; do
  stamp "$step"
  case $step in
    tests) python3 -m pytest -q -m "not nvcc" --maxfail=20 tests/causal_conv1d -p no:cacheprovider \
             2>&1 | tee "$OUT/pytest.log" | grep -v DEBUG | tail -25 ;;
    quicktests) python3 -m pytest -q -m "not nvcc" -k "not torch_compile" --maxfail=20 \
             tests/causal_conv1d -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | grep -v DEBUG | tail -25 ;;
    memcheck) compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/causal_conv1d/sanitize.py \
          > "$OUT/sanitize_memcheck.log" 2>&1; echo "sanitizer memcheck: rc=$?"; tail -3 "$OUT/sanitize_memcheck.log" ;;
    profile) python3 tools/bench/causal_conv1d.py --profile-host 2>&1 | tee "$OUT/profile.log" | head -40 ;;
    benchours) python3 tools/bench/causal_conv1d.py --no-peer --iters 30 --json "$OUT/bench.json" \
             2>&1 | tee "$OUT/bench.log" | tail -12 ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/causal_conv1d/sanitize.py \
          > "$OUT/sanitize_$tool.log" 2>&1; echo "sanitizer $tool: rc=$?"; tail -3 "$OUT/sanitize_$tool.log"
      done ;;
    tune) python3 tools/bench/causal_conv1d.py --tune ${TUNE_SET:-small} --iters 20 --json "$OUT/tune.json" \
            2>&1 | tee "$OUT/tune.log" | tail -60 ;;
    bench) python3 tools/bench/causal_conv1d.py --iters 30 --json "$OUT/bench.json" \
             2>&1 | tee "$OUT/bench.log" | tail -20 ;;
  esac
done
