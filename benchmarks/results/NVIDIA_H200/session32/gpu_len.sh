#!/bin/bash
# Session 32: the probe size (config "probe_sizes") on and off, in one tree: inference new lengths
# (new_lengths.py, with the steady state) of gpt2 and llama, then an 8-layer Llama training step at
# lengths 500-505 (compile_cost.py).
START=$(date +%s)
ARGS="--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 4 --batch 4 --lengths 500-505 --layers 8 --modes train"
for m in gpt2 llama; do
  for p in on off; do
    [ $(( $(date +%s) - START )) -gt 300 ] && break 2
    flag=$([ $p = off ] && echo --no-probe)
    MINICOMP_LOGS=cache,recompiles timeout 100 python benchmarks/scripts/new_lengths.py $m minicomp $flag > $OUT/len_${m}_${p}.log 2>&1
    grep "^$m " $OUT/len_${m}_${p}.log > $OUT/len_${m}_${p}.txt
  done
done
for p in on off; do
  [ $(( $(date +%s) - START )) -gt 460 ] && break
  flag=$([ $p = off ] && echo --no-probe)
  timeout 115 python -m benchmarks.experiments.compile_cost $OUT/train8_${p}.json $ARGS --backends minicomp $flag > $OUT/train8_${p}.log 2>&1
done
for f in $OUT/len_*.txt; do echo "== $f"; cut -c1-140 $f; done
python - <<'PY'
import json, os, glob
for path in sorted(glob.glob(os.environ["OUT"] + "/train8_*.json")):
    d = json.load(open(path))
    for k, v in d.get("summary", {}).items():
        if isinstance(v, dict) and "new length" in k:
            print(path.split("/")[-1], k, {x: v.get(x) for x in ("compile_s", "compile_cpu_s", "retrace_cpu", "pipeline_cpu", "codegen", "other")})
PY
# few files back: the lines in one file, the logs' compile lines in another
cd $OUT && cat len_*.txt > lens.txt && rm len_*.txt
for f in *.log; do echo "== $f"; grep -E "Triton compiles|runtime arguments|probe|Error|error|S=" $f | cut -c1-200; done > logs.txt; rm -f *.log; ls
