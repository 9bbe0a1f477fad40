#!/usr/bin/env bash
# Session 15's GPU runs for issue #18: planes walked side by side for a large broadcast input
# (codegen/plane_order.py). prev_tree/: `git archive 955da11 minicomp | tar -x -C prev_tree`.
# Usage (device machine, repository root): bash benchmarks/gpu_broadcast.sh PART...
#   tests    CUDA tests of the plane order, views, pairs, kernel families, goldens
#   groups   broadcast_order.py: the plain order against 2-all planes side by side, and a copy
#   mask     the bench's mask_add rows (scores [4, 16, S, S] + a mask [S, S]) against Inductor
#   ropeab   the bench's rope_fw / rope_fwbw rows at S = 2048 and 8192, this tree and prev_tree/
# `python -P`: the working directory is not put first on sys.path, so PYTHONPATH=prev_tree runs the
# tree before (plain `python -m` from the repository root imports ./minicomp whatever PYTHONPATH says).
OUT=${OUT:-/tmp/minicomp-broadcast}
mkdir -p "$OUT"
for part in "$@"; do
    case $part in
    tests) PYTHONPATH=. python -P -m pytest -q -p no:cacheprovider tests/test_plane_order.py tests/test_views.py \
        tests/test_interleaved_pairs.py tests/test_kernel_families.py tests/test_golden.py -k "cuda or golden" \
        > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt" ;;
    groups) PYTHONPATH=. python -P -m benchmarks.experiments.broadcast_order "$OUT/broadcast_groups.json" \
        | grep -v Warning | cut -c1-200 ;;
    mask) PYTHONPATH=. python -P -m minicomp bench --out /tmp/bm --skip-compile-time --workloads mask_add \
        > "$OUT/mask_bench.log" 2>&1
        cp /tmp/bm/*/table.md "$OUT/mask_table.md"; grep -E "minicomp|inductor" "$OUT/mask_table.md" ;;
    ropeab) for tree in prev new; do
        root=$([ $tree = prev ] && echo prev_tree || echo .)
        PYTHONPATH=$root python -P -m minicomp bench --out /tmp/br_$tree --skip-compile-time \
            --workloads rope_fw rope_fwbw --sizes 2048 8192 > "$OUT/rope_${tree}.log" 2>&1
        cp /tmp/br_$tree/*/table.md "$OUT/rope_${tree}_table.md"
        grep -E "minicomp|inductor" "$OUT/rope_${tree}_table.md"
        done ;;
    esac
done
