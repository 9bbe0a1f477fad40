#!/usr/bin/env bash
# The fuzzer's long run, sharded over the GPU machine's cores: SHARDS processes of CASES/SHARDS
# cases each, seeds FIRST.. in one run, each shard's JSON line and log under $OUT, the sum printed.
# Usage (repository root):  OUT=... CASES=20000 SHARDS=14 DEVICE=cpu bash benchmarks/scripts/gpu_fuzz.sh
#   DEVICE=cpu   inputs on the CPU (Triton's interpreter, as CI);  DEVICE=cuda  inputs on the GPU
set -uo pipefail
OUT=${OUT:-/tmp/minicomp-gpu}; CASES=${CASES:-20000}; SHARDS=${SHARDS:-14}; DEVICE=${DEVICE:-cpu}; FIRST=${FIRST:-0}
mkdir -p "$OUT"
export PYTHONPATH=${TREE:-.}:. MINICOMP_CACHE_DIR=$(mktemp -d)
per=$(( (CASES + SHARDS - 1) / SHARDS ))
for ((i = 0; i < SHARDS; i++)); do
    seed=$(( FIRST + i * per ))
    python -P tests/fuzz/fuzzer.py --isolate --json --device "$DEVICE" --cases "$per" --seed "$seed" \
        > "$OUT/fuzz_${DEVICE}_$i.json" 2> "$OUT/fuzz_${DEVICE}_$i.log" &
done
wait
python - "$OUT" "$DEVICE" <<'PY'
import glob, json, sys
out, device = sys.argv[1:]
cases = refused = 0
findings = []
for path in sorted(glob.glob(f"{out}/fuzz_{device}_*.json")):
    lines = [l for l in open(path) if l.startswith("{")]
    if not lines:
        print(f"{path}: no result (killed?)"); continue
    r = json.loads(lines[-1])
    cases, refused, findings = cases + r["cases"], refused + r["refused"], findings + r["findings"]
print(f"fuzz {device}: {cases} cases, {len(findings)} findings, {refused} refused")
for family, seed, kind, _ in findings:
    print(f"  {family}:{seed}  {kind}")
PY
