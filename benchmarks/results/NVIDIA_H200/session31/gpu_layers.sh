#!/bin/bash
# First training step of Llama d2048 at 2 and 32 layers: this tree (new) and pause_gc off (nogc), peak RSS.
ROOT=$PWD
ARGS="--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 4 --batch 4 --lengths 500 --layers 2,32 --modes train --backends minicomp"
for tree in new nogc; do
  dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/$tree)
  (cd $dir && PYTHONPATH=$dir timeout 280 python $ROOT/.probe/rss_run.py benchmarks.experiments.compile_cost $OUT/layers_${tree}.json $ARGS > $OUT/layers_${tree}.log 2>&1; echo "$tree rc=$?")
  grep PEAK_RSS $OUT/layers_${tree}.log
done
python - <<'PY'
import json, os
for name in ("new", "nogc"):
    path = f"{os.environ['OUT']}/layers_{name}.json"
    if not os.path.exists(path):
        print(name, "missing"); continue
    for r in json.load(open(path))["rows"]:
        print(name, r.get("backend"), r.get("layers"), r.get("length"), "first_s", r.get("first_s"), "compile_cpu_s", r.get("compile_cpu_s"), "pipeline_cpu", r.get("pipeline_cpu"), "retrace_cpu", r.get("retrace_cpu"))
PY
