#!/usr/bin/env bash
# Session 12's GPU runs for issue #15 (reduction forms, eviction hints, the online sum's exp2).
# Usage (device machine, repository root): bash benchmarks/gpu_forms.sh PART...
#   tests     CUDA tests of reductions, forms, training reductions, goldens
#   bench     bash benchmarks/gpu_reductions.sh (the forward bench rows)
#   small     reduction_forms at 2048 rows of 4096
#   training  rms_norm/layer_norm/softmax fw+bw and cross-entropy fw+bw in this tree and in
#             prev_tree/ (`git archive <before> minicomp | tar -x -C prev_tree`), side by side
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-forms}
mkdir -p "$OUT"
for part in "$@"; do
    case $part in
    tests) python -m pytest -q -p no:cacheprovider -k "cuda or golden" tests/test_reduction_forms.py \
        tests/test_reductions.py tests/test_training_reductions.py tests/test_split_reductions.py \
        tests/test_golden.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt" ;;
    bench) bash benchmarks/gpu_reductions.sh > "$OUT/bench.txt" 2>&1; tail -3 "$OUT/bench.txt" ;;
    small) REDUCTION_SIZES=2048 python -m benchmarks.experiments.reduction_forms "$OUT/forms_2048.json" \
        | python -c "import sys, ast; [print(r['workload'], r['dtype'], r['impl'], round(r['x_floor'], 3))
          for r in map(ast.literal_eval, (l for l in sys.stdin if l.startswith('{')))]" ;;
    training)
        for tree in new prev; do
            path=.; [ $tree = prev ] && path=prev_tree:.
            for args in "rms_norm_fwbw layer_norm_fwbw softmax_fwbw --sizes 32768" "cross_entropy_fwbw --sizes 8192"; do
                # shellcheck disable=SC2086
                PYTHONPATH=$path python -P -m minicomp bench --out /tmp/train-$tree --skip-compile-time --workloads $args \
                    2>&1 | grep "^|" | grep -v eager >> "$OUT/training_$tree.md"
            done
        done
        grep minicomp "$OUT/training_new.md" | cut -d'|' -f2-4,7,9,10 > /tmp/n.txt
        grep minicomp "$OUT/training_prev.md" | cut -d'|' -f7,9,10 > /tmp/p.txt
        echo "workload | dtype | size | new ms | new x floor | new x Inductor | prev ms | prev x floor | prev x Inductor"
        paste -d'|' /tmp/n.txt /tmp/p.txt ;;
    esac
done
