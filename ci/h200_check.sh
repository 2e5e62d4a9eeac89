#!/usr/bin/env bash
# One call on the GPU machine that checks what only a GPU can, from the repository root:
#   bash ci/h200_check.sh WHEEL          (OUT: where logs go; .whl/ wheels of peers optional)
# 1. the wheel built on the development machine installs here (no deps, no build), and
#    `python -m cake selftest` of the installed package passes with CAKE_JIT=0 (prebuilt only);
# 2. in parallel: the vendored build/bitwise check (ci/gpu_vendored_check.py) and the GPU
#    tests of every test folder that has them, from this checkout (JIT path: `python -m cake
#    precompile` compiles every program for the GPU first, into a fresh cache);
# 3. alone at the end: the host-overhead benchmark (tools/bench/host_overhead.py).
# TESTS_TIMEOUT (default 300 s) bounds each family's tests: RMSNorm's alone took 152-205 s on
# 2026-12-04, and here they share the GPU with the other steps.
set -uo pipefail
wheel=$1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=${CAKE_CACHE_DIR:-$(mktemp -d /tmp/cake-jit.XXXXXX)}
stamp() { echo "[$(date -u +%T)] $*"; }
status=0

stamp "install $(basename "$wheel")"
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wheel-site "$wheel" || exit 1
(cd /tmp && CAKE_JIT=0 PYTHONPATH=/tmp/wheel-site python3 -m cake info && \
 CAKE_JIT=0 PYTHONPATH=/tmp/wheel-site python3 -m cake selftest) 2>&1 | tee "$OUT/wheel_selftest.log" \
  | grep -v "^  cake_" || status=1

stamp "vendored check and family GPU tests (parallel)"
timeout 240 python3 ci/gpu_vendored_check.py --out "$OUT" > "$OUT/vendored_check.log" 2>&1 &
jobs_running=$!
export PYTHONPATH=$PWD
python3 -m cake precompile > "$OUT/precompile.log" 2>&1 || status=1
# Every test folder with GPU tests (test_*gpu*.py), each in parallel.
for dir in tests/*/; do
  compgen -G "${dir}test_*gpu*.py" > /dev/null || continue
  name=$(basename "$dir")
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m "not nvcc" -p no:cacheprovider "$dir" \
    > "$OUT/pytest_$name.log" 2>&1 &
  jobs_running="$jobs_running $!"
done
for job in $jobs_running; do wait $job || status=1; done
tail -n 3 "$OUT"/vendored_check.log "$OUT"/pytest_*.log

stamp "host overhead (alone)"
timeout 90 python3 tools/bench/host_overhead.py --json "$OUT/host_overhead.json" 2>&1 | tail -12
stamp "done, status $status"
exit $status
