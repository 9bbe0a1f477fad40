#!/usr/bin/env bash
# This session's trust changes on the GPU: the CUDA tests, and what a cache hit costs now against
# prev_tree/ (`git archive <before> minicomp | tar -x -C prev_tree`): the key now reads the values a
# function reads (reads.py) and checks each tensor for a subclass or a negated / conjugated view.
# Usage (device machine, repository root): OUT=... bash benchmarks/gpu_trust.sh PART...
#   tests  CUDA tests of trust, guards, Dynamo, training, fast calls
#   hitab  `minicomp bench`'s per-call rows (64 x 64 bias + ReLU), the two trees in turn, 3 rounds
# `python -P`: PYTHONPATH decides which tree runs (see gpu_block_host.sh).
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-trust}
mkdir -p "$OUT"
for part in "$@"; do
    case $part in
    tests) python -P -m pytest -q -p no:cacheprovider -k cuda tests/test_trust.py tests/test_inside.py \
            tests/test_autograd.py tests/test_training_call.py tests/test_fast_calls.py tests/test_reductions.py \
            tests/test_compile_ahead.py tests/test_views.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.txt" ;;
    hitab) for round in 1 2 3; do
            for tree in new prev; do
                PP=.; [ $tree = prev ] && PP=prev_tree:.
                PYTHONPATH=$PP python -P -c "import json, minicomp; from minicomp.bench.run import overhead
print(json.dumps(dict(tree='$tree', round=$round, where=minicomp.__file__, **overhead())))" | tee -a "$OUT/hit_cost.jsonl"
            done
        done ;;
    esac
done
