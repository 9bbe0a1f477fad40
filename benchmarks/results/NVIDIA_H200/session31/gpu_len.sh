#!/bin/bash
# New lengths: inference (new_lengths.py) of gpt2 and llama, and an 8-layer Llama training step at
# lengths 500-505 (compile_cost.py), in the trees old (HEAD), new (working tree), nogc (pause_gc off).
ROOT=$PWD
START=$(date +%s)
ARGS="--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 4 --batch 4 --lengths 500-505 --layers 8 --modes train"
for m in gpt2 llama; do
  for tree in old new nogc; do
    [ $(( $(date +%s) - START )) -gt 330 ] && break 2
    dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/$tree)
    (cd $dir && PYTHONPATH=$dir timeout 100 python benchmarks/scripts/new_lengths.py $m minicomp > $OUT/len_${m}_${tree}.txt 2>&1)
  done
done
for tree in old new; do
  [ $(( $(date +%s) - START )) -gt 470 ] && break
  dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/$tree)
  (cd $dir && PYTHONPATH=$dir timeout 110 python -m benchmarks.experiments.compile_cost $OUT/train8_${tree}.json $ARGS --backends minicomp > $OUT/train8_${tree}.log 2>&1)
done
cd $ROOT && for f in $OUT/len_*.txt; do echo "== $f"; grep -v Warning $f | grep -v warn | tail -8 | cut -c1-220; done
python - <<'PY'
import json, os, glob
for path in sorted(glob.glob(os.environ["OUT"] + "/train8_*.json")):
    d = json.load(open(path))
    for k, v in d.get("summary", {}).items():
        if isinstance(v, dict) and "new length" in k:
            print(path.split("/")[-1], k, {x: v.get(x) for x in ("compile_s", "compile_cpu_s", "retrace_cpu", "pipeline_cpu", "codegen", "other")})
PY
