# issue #42's first training step at 2, 8, 32 layers: the old tree (minicomp) and this one (all)
set -u
ARGS="--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 4 --batch 4 --lengths 500 --layers 2,8,32 --modes train"
(cd .probe/old && PYTHONPATH=$PWD timeout 250 python -m benchmarks.experiments.compile_cost $OUT/layers_old.json $ARGS --backends minicomp > $OUT/layers_old.log 2>&1; echo "old rc=$?")
PYTHONPATH=$PWD timeout 330 python -m benchmarks.experiments.compile_cost $OUT/layers_new.json $ARGS --backends minicomp,inductor,aot_eager > $OUT/layers_new.log 2>&1; echo "new rc=$?"
python - <<'PY'
import json, os
for name in ("old", "new"):
    path = f"{os.environ['OUT']}/layers_{name}.json"
    if not os.path.exists(path):
        print(name, "missing"); continue
    for r in json.load(open(path))["rows"]:
        if r.get("call", 1) == 1:
            print(name, r.get("backend"), r.get("layers"), "first_s", r.get("first_s"), "codegen", r.get("codegen"), "pipeline_cpu", r.get("pipeline_cpu"))
PY
