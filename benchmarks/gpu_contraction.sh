#!/usr/bin/env bash
# Reduction kernels compiled without FP contraction (launch.py `options`): the GPU runs.
# prev_tree/: `git archive <before> minicomp | tar -x -C prev_tree` (the tree with contraction).
# nofma_tree/: this tree with pointwise kernels uncontracted too (made here), to price that option.
# Usage (device machine, repository root): OUT=... bash benchmarks/gpu_contraction.sh PART...
#   tests   CUDA tests of reductions, compile-ahead, trust; the new regression test on prev_tree/
#   probe   experiments/fp_contraction.py: eager, minicomp, Inductor on cancelling cases
#   redab   the bench's norm, softmax and cross-entropy rows (forward; forward + backward), both trees
#   pwab    bf16 GELU and bias + ReLU rows, this tree against nofma_tree/
# `python -P`: PYTHONPATH decides which tree runs (see gpu_block_host.sh).
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-contraction}
mkdir -p "$OUT"
bench() {  # bench TREE NAME ARGS...: one bench run on TREE (new: this one), its table kept as NAME
    local tree=$1 name=$2; shift 2
    local pp=.; [ "$tree" != new ] && pp=${tree}_tree:.
    PYTHONPATH=$pp MINICOMP_CACHE_DIR=$(mktemp -d) python -P -m minicomp bench --out "/tmp/$name-$tree" \
        --skip-compile-time "$@" > "$OUT/${name}_$tree.log" 2>&1
    cp /tmp/"$name-$tree"/*/table.md "$OUT/${name}_${tree}_table.md"
    echo "== $name $tree"; grep -E "\| (minicomp|inductor) " "$OUT/${name}_${tree}_table.md" | cut -d'|' -f2-4,6,9-10
}
for part in "$@"; do
    case $part in
    tests) python -P -m pytest -q -p no:cacheprovider -k cuda tests/test_reductions.py tests/test_compile_ahead.py \
            tests/test_trust.py tests/test_training_reductions.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.txt"
        rm -rf prev_tests && mkdir prev_tests && cp tests/conftest.py tests/test_reductions.py prev_tests/
        PYTHONPATH=prev_tree:prev_tests python -P -m pytest -q -p no:cacheprovider -k "cuda and recomputed_product" \
            prev_tests/test_reductions.py 2>&1 | tail -3 | tee "$OUT/gpu_tests_prev.txt" ;;
    probe) python -P -m benchmarks.experiments.fp_contraction "$OUT/fp_contraction.json" ;;
    redab) for tree in new prev; do
            bench $tree norms --workloads rms_norm layer_norm softmax rms_norm_fwbw layer_norm_fwbw softmax_fwbw \
                --sizes 32768
            bench $tree ce --workloads cross_entropy cross_entropy_fwbw --sizes 8192
        done ;;
    pwab) rm -rf nofma_tree && cp -r minicomp nofma_tree_pkg && mkdir nofma_tree && mv nofma_tree_pkg nofma_tree/minicomp
        sed -i 's/{"enable_fp_fusion": False} if row else {}/{"enable_fp_fusion": False}/' nofma_tree/minicomp/launch.py
        grep -c '"enable_fp_fusion": False}$' nofma_tree/minicomp/launch.py
        for tree in new nofma; do
            bench $tree pw --workloads gelu_tanh gelu_erf bias_relu swiglu --dtypes bfloat16 --sizes 8192
        done ;;
    esac
done
