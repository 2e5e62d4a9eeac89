#!/usr/bin/env bash
# One device call for the RMSNorm families: JIT all programs, GPU tests, compute-sanitizer,
# benchmark. On the GPU machine, from the repository root (peer wheels in .whl/: tools/bench/rmsnorm.py):
#   bash tests/rmsnorm/h200_run.sh [tests|quick|sanitize|host|bench|small|tune ...]   (default: tests sanitize bench)
# quick: the tests without the two slow ones (processes, torch.compile). tune: the knob sweep
# (tools/bench/rmsnorm.py --tune; no peers needed). ncu: instructions, issue-slot use, warps and
# DRAM throughput of the first launch of each forward and backward kernel of the tune's table
# programs at NCU_SHAPES (ncu --clock-control none). baseline: the tune's table and the ncu step
# again in another checkout (BASELINE, e.g. `git archive <rev> | tar -x -C .baseline`), for an
# A/B of the kernel code itself in one call. digest: SHA-256 of every output over a grid of cases
# (tests/rmsnorm/output_digest.py; DIGEST_FIRST: from that case on), diffed against BASELINE's
# when set. peers-ncu: ncu sections of
# every kernel of cake's and NCU_PEERS' (default quack) RMSNorm forward and backward at
# NCU_SHAPES (tools/bench/rmsnorm.py --once). Step time limits come from TESTS_TIMEOUT,
# SANITIZE_TIMEOUT, BENCH_TIMEOUT, TUNE_TIMEOUT, NCU_TIMEOUT; BENCH_ITERS and TUNE_ITERS set the
# samples per figure, TUNE_VARIANTS a comma-separated subset of the sweep; BENCH_PROFILE=1 adds
# the bench's --profile (each call's device time and the idle time before it, from a trace),
# TUNE_PROFILE=1 the tune's (each call's kernels and the gaps between them).
set -o pipefail
export PYTHONUNBUFFERED=1 CAKE_CACHE_DIR=/tmp/cake-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${*:-tests sanitize bench}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site
# What nvidia-cutlass-dsl's .pth adds (pip --target skips .pth files); quack imports cutlass from it.
[[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]] && PYTHONPATH+=:/tmp/site/nvidia_cutlass_dsl/dsl_packages
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# (PRECOMPILE=0: the steps compile what they use; the baseline step's ncu needs no family program.)
if [[ ${PRECOMPILE:-1} == 1 ]]; then python3 tools/bench/rmsnorm.py --precompile 2>&1 | tail -3 || exit 1; fi
for step in $steps; do
  case $step in
    tests|quick)
      select=(); [[ $step == quick ]] && select=(-k "not processes and not torch_compile")
      timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m "not nvcc" --maxfail=30 --durations=8 tests/rmsnorm -p no:cacheprovider "${select[@]}" \
             2>&1 | tee "$OUT/pytest.log" | grep -v "^tests/.* PASSED" | tail -45 ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout ${SANITIZE_TIMEOUT:-75} compute-sanitizer --tool $tool --error-exitcode 1 python3 tests/rmsnorm/sanitize.py \
          > "$OUT/sanitize_$tool.log" 2>&1; echo "sanitizer $tool: rc=$?"; tail -3 "$OUT/sanitize_$tool.log"
      done ;;
    bench) timeout ${BENCH_TIMEOUT:-240} python3 tools/bench/rmsnorm.py --iters ${BENCH_ITERS:-20} ${BENCH_PROFILE:+--profile} --json "$OUT/bench.json" \
             2>&1 | tee "$OUT/bench.log" | tail -50 ;;
    host) timeout 60 python3 tools/bench/rmsnorm.py --host 2>&1 | tee "$OUT/host.log" | tail -12 ;;
    small) timeout ${BENCH_TIMEOUT:-100} python3 tools/bench/rmsnorm.py --iters 20 --shapes small \
             2>&1 | tee "$OUT/bench_small.log" | tail -30 ;;
    tune) timeout ${TUNE_TIMEOUT:-280} python3 tools/bench/rmsnorm.py --tune --iters ${TUNE_ITERS:-15} \
            ${TUNE_VARIANTS:+--variants "$TUNE_VARIANTS"} ${TUNE_PROFILE:+--profile} --json "$OUT/tune.json" \
            2>&1 | tee "$OUT/tune.log" | tail -150 ;;
    baseline) [[ -d ${BASELINE:-} ]] || { echo "baseline: set BASELINE to a checkout"; exit 1; }
      (cd "$BASELINE" && PYTHONPATH=$PWD timeout ${TUNE_TIMEOUT:-280} python3 tools/bench/rmsnorm.py --tune \
         --iters ${TUNE_ITERS:-15} --variants table --json "$OUT/tune_baseline.json" > "$OUT/tune_baseline.log" 2>&1)
      echo "baseline tune: rc=$?"; tail -60 "$OUT/tune_baseline.log"
      (cd "$BASELINE" && OUT=$OUT/baseline PRECOMPILE=0 bash "$OLDPWD/tests/rmsnorm/h200_run.sh" ncu) ;;
    digest) timeout ${DIGEST_TIMEOUT:-120} python3 tests/rmsnorm/output_digest.py --first ${DIGEST_FIRST:-0} > "$OUT/digest.txt"; echo "digest: rc=$? $(wc -l < "$OUT/digest.txt") cases"
      if [[ -d ${BASELINE:-} ]]; then
        cp tests/rmsnorm/output_digest.py "$BASELINE/tests/rmsnorm/"
        (cd "$BASELINE" && export PYTHONPATH=$PWD && python3 tools/bench/rmsnorm.py --precompile | tail -1 &&
         timeout ${DIGEST_TIMEOUT:-120} python3 tests/rmsnorm/output_digest.py --first ${DIGEST_FIRST:-0} > "$OUT/digest_baseline.txt")
        echo "digest baseline: rc=$?"; diff "$OUT/digest_baseline.txt" "$OUT/digest.txt" && echo "digest: identical to the baseline"
      fi ;;
    ncu) timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --kernel-name-base demangled --kernel-id "::regex:_(forward|backward)<:1" \
            --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            python3 tools/bench/rmsnorm.py --tune --variants table --iters 1 --shapes ${NCU_SHAPES:-65536:2048,65536:8192} \
            > "$OUT/ncu.txt" 2>&1; echo "ncu: rc=$?"; grep -E "^  [a-z_]+ kernel_|duration|inst_executed|issue_active|warps_active|dram__" "$OUT/ncu.txt" | head -80 ;;
    peers-ncu) timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --kernel-name-base demangled \
            --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
            python3 tools/bench/rmsnorm.py --once ${NCU_PEERS:-quack} --shapes ${NCU_SHAPES:-65536:8192,262144:2048} \
            > "$OUT/peers_ncu.txt" 2>&1; echo "peers-ncu: rc=$?"
          grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Warp Cycles Per Issued" "$OUT/peers_ncu.txt" | grep -v -E "distribution|elementwise_kernel|fill|randn" | head -150 ;;
  esac
done
