#!/bin/bash
# Session 32: split reductions' K a power of two (this tree, "new") against HEAD ("old"):
# an 8-layer Llama training step at lengths 500-505 (compile_cost.py), then the steady state of
# the suite's training steps (llama, gpt2, resnet50: minicomp), a process per row, trees alternating.
ROOT=$PWD
START=$(date +%s)
ARGS="--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 4 --batch 4 --lengths 500-505 --layers 8 --modes train"
for tree in new old; do
  dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/old)
  (cd $dir && PYTHONPATH=$dir timeout 120 python -m benchmarks.experiments.compile_cost $OUT/train8_${tree}.json $ARGS --backends minicomp > /dev/null 2>&1)
done
for m in llama resnet50 gpt2; do
  for tree in new old; do
    [ $(( $(date +%s) - START )) -gt 520 ] && break 2
    dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/old)
    (cd $dir && PYTHONPATH=$dir timeout 75 python -m benchmarks.experiments.model_suite $OUT/suite_${m}_${tree}.json --models $m --steps train --variants minicomp > /dev/null 2>&1)
  done
done
cd $OUT && for f in suite_*.jsonl; do cat $f >> suite.jsonl; done; rm -f suite_*
python - <<'PY' | tee summary.txt
import json, glob
for path in sorted(glob.glob("train8_*.json")):
    d = json.load(open(path))
    print(path, [(r.get("length"), r.get("compile_s"), r.get("triton compiles")) for r in d["rows"]])
    for k, v in d.get("summary", {}).items():
        if isinstance(v, dict) and "new length" in k:
            print("  ", k, {x: v.get(x) for x in ("compile_s", "compile_cpu_s", "pipeline_cpu")})
for line in open("suite.jsonl"):
    r = json.loads(line)
    print({k: r.get(k) for k in ("model", "step", "variant", "ms", "gpu_ms", "busy_ms", "kernels", "peak_mib", "first_s", "error")})
PY
ls
