#!/usr/bin/env bash
# GPU call (2026-12-06d; issue 19): the issue's table first, with the package (staged tiles by one bulk
# copy on mbarriers, branch i19-tma), the layout build without bulk copies (.gpu/var/layout: main's
# kernel with the keys in core matrices, branch i19-layout) and main's extend.cu (.gpu/var/main) timed
# in the same run; then the faster of the first two (certificate on, summed over the shapes) becomes
# the package for the checks: the bitwise A/B against main, the extend's GPU tests (EXT_TESTS, 12
# shards) and its adversarial sweep, side by side. About 360 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 150 python3 bench_extend.py --shapes 0,1,2 \
  --cuda-prev ../.gpu/var/main/extend.cu ../.gpu/var/layout/extend.cu) > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | tail -22
WIN=$(python3 - "$OUT/bench_extend.log" <<'PY'
import ast, sys
rows = [ast.literal_eval(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = {}
for r in rows:
    if r["variant"].endswith("cert on") and isinstance(r["us"], float):
        key = "tma" if r["variant"].startswith("witcert b") and " default " in r["variant"] else \
              ("layout" if "cuda layout" in r["variant"] else None)
        if key:
            t.setdefault(key, []).append(r["us"])
ok = len(t.get("tma", [])) == len(t.get("layout", [])) == 3
print("tma" if ok and sum(t["tma"]) < sum(t["layout"]) else "layout", file=sys.stdout)
print(f"cert-on sums: {({k: round(sum(v), 1) for k, v in t.items()})}", file=sys.stderr)
PY
)
[ "$WIN" = layout ] && cp .gpu/var/layout/extend.cu witcert/kernels/cuda/extend.cu
echo "the package for the checks: $WIN (at $(( $(date +%s) - T0 )) s)"
timeout 270 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu > "$OUT/ab_main.log" 2>&1 &
ext_checks 12 270 367
echo "A/B main: $(tail -1 "$OUT/ab_main.log")  [$(grep -c 'same bits' "$OUT/ab_main.log") same, $(grep -c DIFFERENT "$OUT/ab_main.log") different]"
echo "done at $(( $(date +%s) - T0 )) s"
