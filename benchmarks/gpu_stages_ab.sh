#!/usr/bin/env bash
# The row-group loop of grouped reduction kernels at 3 pipeline stages instead of the tree's 2, A/B in one
# lease (floor_reference/COMMAND.md, "3 stages"). Run from the repository root: OUT=$OUT bash benchmarks/gpu_stages_ab.sh
set -u
export PYTHONPATH=.
variant=$(mktemp -d)
cp -r minicomp "$variant/minicomp"
sed -i 's/XBLOCK, num_stages=2):/XBLOCK, num_stages=3):/' "$variant/minicomp/codegen/reduction.py"
grep -q "num_stages=3" "$variant/minicomp/codegen/reduction.py" || { echo "the edit found no loop"; exit 1; }
for t in . "$variant"; do
  n=$( [ "$t" = "." ] && echo old || echo new )
  export MINICOMP_CACHE_DIR=$(mktemp -d)
  PYTHONPATH=$t:. python -P -m minicomp bench --skip-compile-time --out /tmp/$n --workloads rms_norm_fwbw \
      layer_norm_fwbw softmax_fwbw column_sum --sizes 32768 > "$OUT/${n}_a.log" 2>&1
  PYTHONPATH=$t:. python -P -m minicomp bench --skip-compile-time --out /tmp/$n --workloads bias_gelu_fwbw \
      --sizes 8192 > "$OUT/${n}_b.log" 2>&1
done
for f in "$OUT"/*.log; do echo "== $f"; grep "| minicomp\|Traceback\|Error" "$f"; done
