# Sourced by the scripts/gpu_call*.sh scripts (from the repository root): the environment and
# its log in $OUT, and pytest sharded over the GPU machine's cores (WITCERT_SHARD=i/n,
# tests/conftest.py; the exact-TV checks run on the CPU, the kernels share the GPU).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.log"

run_shards() {  # name, shards, timeout (s), pytest args...: starts the shards in the background
  local name=$1 n=$2 t=$3; shift 3
  for i in $(seq 0 $((n - 1))); do
    OMP_NUM_THREADS=1 WITCERT_SHARD=$i/$n timeout "$t" python3 -m pytest -v -rfE -p no:cacheprovider "$@" \
      > "/tmp/shard_${name}_$i.log" 2>&1 &
  done
}
report_shards() {  # name...: after `wait`, one log per name in $OUT, a summary line, the failures
  local name f
  for name in "$@"; do
    for f in /tmp/shard_${name}_*.log; do echo "### $f"; cat "$f"; done > "$OUT/tests_$name.log"
    echo "== $name: $(grep -hE ' in [0-9.]+s' /tmp/shard_${name}_*.log | tr '\n' ';')"
    grep -h "^FAILED\|^ERROR" /tmp/shard_${name}_*.log | head -10
    # one log per shard, one pytest session in each: calls 89 and 92 (2026-12-05h) found three logs
    # missing and three holding two sessions, so count PASSED node ids, not the summary lines
    for f in /tmp/shard_${name}_*.log; do
      [ "$(grep -c 'test session starts' "$f")" = 1 ] || echo "!! $f holds $(grep -c 'test session starts' "$f") pytest sessions"
    done
    echo "$(ls /tmp/shard_${name}_*.log | wc -l) shard logs"
  done
}

tally_shards() {  # name: after report_shards, the outcomes counted, the PASSED node ids in
  # $OUT/passed.txt, the first skips
  local name=$1
  echo "$name: $(grep -h "PASSED\|FAILED\|ERROR\|SKIPPED" /tmp/shard_${name}_*.log | grep -o " PASSED\| FAILED\| ERROR\| SKIPPED" | sort | uniq -c | tr '\n' ' ')"
  grep -hE "::.* PASSED" /tmp/shard_${name}_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"
  grep -h "SKIPPED" /tmp/shard_${name}_*.log | head -5
}

not_passed() {  # pytest args...: after tally_shards, the ids those args collect that no shard PASSED, in
  # $OUT/not_passed.txt, and their count: a shard killed at its timeout ends mid-test without a newline
  # (the report's next header joins that line) and its remaining tests are here (2026-12-07d: 16 shards
  # of every GPU test file need about 380 s; at 300 s four were killed)
  python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "::" | sort -u > "$OUT/all_ids.txt"
  comm -23 "$OUT/all_ids.txt" "$OUT/passed.txt" > "$OUT/not_passed.txt"
  echo "collected $(wc -l < "$OUT/all_ids.txt"), passed $(wc -l < "$OUT/passed.txt"), not passed $(wc -l < "$OUT/not_passed.txt")"
}

decode_table() {  # timeout (s), lines: the decode's issue table on this card (bench_decode.py --quick,
  # SDPA fp16 in the same run) in $OUT/bench_decode.log, its last lines printed
  (cd benchmarks && timeout "$1" python3 bench_decode.py --quick) > "$OUT/bench_decode.log" 2>&1
  grep -vE "^\{|building" "$OUT/bench_decode.log" | tail -"$2"
}

ext_table() {  # timeout (s), shapes, lines, more bench_extend.py args (paths from benchmarks/, e.g.
  # --cuda-prev ../.gpu/var/main/extend.cu): the extend's table in $OUT/bench_extend.log, its last lines
  (cd benchmarks && timeout "$1" python3 bench_extend.py --shapes "$2" "${@:4}") > "$OUT/bench_extend.log" 2>&1
  grep -vE "^\{|building" "$OUT/bench_extend.log" | grep -v triton | tail -"$3"
}

issue_tables() {  # issues 14 and 19's tables on this card: the decode's (decode_table), the extend's
  # (bench_extend.py, its three shapes) and the writer's (bench_write.py), each against its baseline
  # in the same run, logs in $OUT, their last lines printed
  decode_table 200 40
  ext_table 150 0,1,2 16
  (cd benchmarks && timeout 80 python3 bench_write.py) > "$OUT/bench_write.log" 2>&1
  grep -vE "^\{|building" "$OUT/bench_write.log" | tail -8
}

ext_sweep_bg() {  # timeout (s), seed: the extend's adversarial sweep in the background (40 s of the
  # timeout left for its report), its log in $OUT/sweep_extend.log; the caller waits
  timeout "$1" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed "$2" --max-seconds $(($1 - 40)) \
    > "$OUT/sweep_extend.log" 2>&1 &
}

ext_bench_smi() {  # run, timeout (s), shapes, --cuda-prev files (paths from benchmarks/): one run of
  # bench_extend.py (b 8, no Triton-only cells) in $OUT/bench_run$run.log with nvidia-smi sampled
  # every 200 ms beside it in $OUT/smi_run$run.csv (timestamp, SM and memory clocks, power,
  # temperature, throttle reasons, memory used), then a line on the samples
  local run=$1 t=$2 shapes=$3; shift 3
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active,memory.used \
    --format=csv -lms 200 > "$OUT/smi_run$run.csv" 2>&1 &
  local smi=$!
  (cd benchmarks && timeout "$t" python3 bench_extend.py --bits 8 --shapes "$shapes" --no-triton --cuda-prev "$@") \
    > "$OUT/bench_run$run.log" 2>&1
  kill $smi
  python3 - "$OUT/smi_run$run.csv" <<'PY'
import sys, csv
rows = [r for r in csv.reader(open(sys.argv[1])) if r and r[0][:1].isdigit()]
if rows:
    sm = [float(r[1].split()[0]) for r in rows]; pw = [float(r[3].split()[0]) for r in rows if "N/A" not in r[3]]
    print(f"smi: {len(rows)} samples, SM clock min {min(sm):.0f} median {sorted(sm)[len(sm)//2]:.0f} max {max(sm):.0f} MHz, "
          f"power max {max(pw) if pw else 0:.0f} W, temp max {max(float(r[4]) for r in rows):.0f} C")
PY
}

all_tests_and_sweep() {  # timeout (s), sweep seed: every GPU test file in 16 shards and the extend's
  # adversarial sweep beside them, then the shards' reports, the ids no shard passed, the sweep's line
  local t=$1 seed=$2
  run_shards all 16 "$t" "${ALL_GPU_TESTS[@]}"
  ext_sweep_bg "$t" "$seed"
  wait; report_shards all; tally_shards all; not_passed "${ALL_GPU_TESTS[@]}"
  grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -3
}

# Every test file that runs on the GPU (21 files; tests/test_gpu_test_list.py checks that every test
# file asking for a GPU is here: test_expm1_bound.py was missing until 2026-12-06g).
ALL_GPU_TESTS=(tests/test_attention_dtypes.py tests/test_backend_extend.py tests/test_cuda_auto.py
  tests/test_cuda_build.py tests/test_cuda_graph.py tests/test_fp_soundness.py tests/test_hf_graph_gpu.py
  tests/test_kernels_decode.py tests/test_kernels_extend.py tests/test_kernels_write.py tests/test_position_dither.py
  tests/test_repair.py tests/test_report_quick.py tests/test_report_runtime.py tests/test_telemetry.py
  tests/test_backend_native.py tests/test_cuda_write.py tests/test_tc_signed_dot.py tests/test_expm1_bound.py
  tests/test_triton_compiles_for_sm90.py tests/test_host_helpers.py)

# The extend's GPU test selection (its test files and the extend families of the fp soundness file).
EXT_TESTS=(tests/test_kernels_extend.py tests/test_backend_extend.py tests/test_fp_soundness.py -k "extend or Extend")
ext_checks() {  # shards, timeout (s), sweep seed: EXT_TESTS sharded and the extend's adversarial sweep
  # beside them; the passed node ids in $OUT/passed.txt (a later call can run the rest)
  local n=$1 t=$2 seed=$3
  run_shards ext "$n" "$t" "${EXT_TESTS[@]}"
  ext_sweep_bg "$t" "$seed"
  wait; report_shards ext
  grep -hE "::.* PASSED" /tmp/shard_ext_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"
  echo "passed $(wc -l < "$OUT/passed.txt")"
  grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
}

ext_ab() {  # old extend.cu, timeout (s), [sweep seed | -], more A/B args (e.g. --warps 8): the bitwise A/B
  # against the old source, one pass and the prefix in chunks (beside ext_checks, 12 shards, unless the
  # seed is -); then each A/B's last line and its counts of equal and different cases
  local old=$1 t=$2 seed=$3 f; shift 3
  timeout "$t" python3 scripts/gpu_extend_ab.py "$old" "$@" > "$OUT/ab_main.log" 2>&1 &
  timeout "$t" python3 scripts/gpu_extend_ab.py "$old" "$@" --chunked > "$OUT/ab_chunked.log" 2>&1 &
  [ "$seed" = - ] || ext_checks 12 "$t" "$seed"
  wait
  ab_summary ab_main ab_chunked
}

ab_summary() {  # names of A/B logs in $OUT (without .log): each one's last line and its counts of
  # equal and different cases
  local f
  for f in "$@"; do
    echo "A/B $f: $(tail -1 "$OUT/$f.log")  [$(grep -c 'same bits' "$OUT/$f.log") same, $(grep -c DIFFERENT "$OUT/$f.log") different]"
  done
}

# The decode's GPU test selection (every test file that decodes on the GPU).
DEC_TESTS=(tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_backend_extend.py tests/test_cuda_build.py
  tests/test_position_dither.py tests/test_hf_graph_gpu.py tests/test_fp_soundness.py tests/test_cuda_auto.py
  tests/test_kernels_write.py tests/test_repair.py tests/test_telemetry.py)
dec_checks() {  # shards, timeout (s), sweep seed, [an earlier decode.cu, [fields, [test files...]]]:
  # DEC_TESTS (and the test files given) sharded, their passed node ids in $OUT/passed.txt, the CUDA
  # decode's adversarial sweep beside them and, given an earlier source, the bitwise A/B against it
  # (in the fields given, e.g. lse,cert,radius,logits: gpu_decode_ab.py --only; default all)
  local n=$1 t=$2 seed=$3 prev=${4:-} only=${5:-}
  shift $(( $# < 5 ? $# : 5 ))
  [ -n "$prev" ] && { timeout "$t" python3 scripts/gpu_decode_ab.py "$prev" ${only:+--only "$only"} > "$OUT/ab.log" 2>&1 & }
  run_shards dec "$n" "$t" "${DEC_TESTS[@]}" "$@"
  timeout "$t" python3 benchmarks/soundness_sweep.py --paths cuda --seed "$seed" --max-seconds $((t - 40)) \
    > "$OUT/sweep_cuda.log" 2>&1 &
  wait; report_shards dec; tally_shards dec
  [ -n "$prev" ] && { grep -c "same bits" "$OUT/ab.log"; grep -E "DIFFERENT|bitwise|Error|error" "$OUT/ab.log" | head -8; }
  grep -E "VIOLATION|certs|^ *cuda" "$OUT/sweep_cuda.log" | tail -4
}

# Nsight Compute's scheduler and warp-state view of one launch (clocks unlocked), key lines printed
NCU_SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
NCU_KEYS="Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Issued Warp|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Executed Instructions  |Compute \(SM\) Throughput|Memory Throughput"
prof() {  # name, kernel regex, script (in benchmarks/), args...: $OUT/ncu_<name>.txt
  local name=$1 kern=$2; shift 2
  (cd benchmarks && timeout 150 ncu --clock-control none --kernel-name "$kern" --launch-skip 1 --launch-count 1 $NCU_SECS \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 "$@") > "$OUT/ncu_$name.txt" 2>&1
  echo "## $name"; grep -E "$NCU_KEYS" "$OUT/ncu_$name.txt" | head -14
  grep -E "stalled" "$OUT/ncu_$name.txt" | sort -k3 -g -r | head -8
}

ncu_prefix() {  # name, profile_extend.py args: Nsight Compute on one prefix launch (the second), its
  # stall samples by SASS line (ncu_stalls.py) and the sections' figures; $OUT/<name>_sass.csv.gz,
  # $OUT/ncu_details_<name>.txt, $OUT/stalls_<name>.txt
  local name=$1; shift
  (cd benchmarks && timeout 150 ncu --clock-control none --kernel-name regex:wc_extend_prefix --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy --section SchedulerStats \
    -f -o "$OUT/$name" python3 profile_extend.py "$@") > "/tmp/ncu_collect_$name.log" 2>&1
  tail -2 "/tmp/ncu_collect_$name.log"
  timeout 60 ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2> /dev/null
  timeout 60 ncu -i "$OUT/$name.ncu-rep" > "$OUT/ncu_details_$name.txt" 2>&1
  grep -iE "Duration|Issue Slots|Issued Ipc|Eligible|No Eligible|Occupancy|Registers|Throughput" "$OUT/ncu_details_$name.txt" | head -24
  (cd benchmarks && python3 ncu_stalls.py "$OUT/${name}_sass.csv" --top 12) 2>&1 | tee "$OUT/stalls_$name.txt" | head -24
  gzip -f "$OUT/${name}_sass.csv"; rm -f "$OUT/$name.ncu-rep"
}

ext_kernels() {  # timeout per run (s), [more profile_extend.py args, e.g. --bits 8 (its default is 16)]:
  # the extend's kernels one by one at 4096 + 2048 (Llama shape), certificate on and off:
  # $OUT/kernels_4096_2048_<on|off>.txt and their summary lines
  for c in on off; do
    (cd benchmarks && timeout "$1" python3 profile_extend.py --shape 4096,2048,32,8 --cert $c --reps 3 --kernels "${@:2}") > "$OUT/kernels_4096_2048_$c.txt" 2>&1
    echo "## kernels 4096+2048 cert $c"; grep -E "wc_extend_prefix|_extend_kernel" "$OUT/kernels_4096_2048_$c.txt" | cut -c1-60,100-170
  done
}
