#!/bin/bash
# Issue #16 on a GPU: the training tests on CUDA, then the training bench rows (time and peak memory)
# beside eager and Inductor. Writes tests.txt and <part>_table.md / <part>_results.json under $OUT.
#   bash benchmarks/gpu_training.sh [tests] [norms] [ce] [bias] [block]    (default: all five)
OUT=${OUT:-/tmp/minicomp-training}
mkdir -p "$OUT"
parts=${*:-tests norms ce bias block}
bench() {  # bench <part> <minicomp bench arguments...>
    local part=$1; shift
    PYTHONPATH=. python -m minicomp bench --out "/tmp/bench-$part" --skip-compile-time "$@" | tail -30
    cp /tmp/bench-"$part"/*/table.md "$OUT/${part}_table.md"
    cp /tmp/bench-"$part"/*/results.json "$OUT/${part}_results.json"
}
for part in $parts; do
    case $part in
    tests) python -m pytest -q -p no:cacheprovider -k cuda tests/test_training_reductions.py tests/test_autograd.py \
        tests/test_reductions.py tests/test_split_reductions.py 2>&1 | tail -15 | tee "$OUT/tests.txt" ;;
    norms) bench norms --workloads rms_norm_fwbw layer_norm_fwbw softmax_fwbw --sizes 32768 ;;
    ce) bench ce --workloads cross_entropy_fwbw --sizes 8192 ;;
    bias) bench bias --workloads bias_gelu_fwbw --sizes 8192 ;;
    block) bench block --workloads llama_block_fwbw --dtypes bfloat16 --sizes 2048 ;;
    esac
done
