#!/usr/bin/env bash
# Issue #17 on the GPU: the first call of a fresh process once capture runs on meta stand-ins
# (minicomp/meta_trace.py) instead of make_fx, against prev_tree/ (the tree before it:
# `git archive b387f7a minicomp | tar -x -C prev_tree`), Inductor beside each in the same run.
# Usage (device machine, repository root): OUT=... bash benchmarks/gpu_fast_start.sh PART...
#   tests    CUDA tests of the tracer, trust, fast calls, views, reductions, compile-ahead
#   compile  `minicomp bench`'s compile rows (cold / warm / new sizes / block), this tree
#   prev     the same rows from prev_tree
#   profile  minicomp's cold bias + ReLU probe under cProfile (one untimed run fills the bytecode cache)
# `python -P`: PYTHONPATH decides which tree runs (see gpu_block_host.sh).
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-fast-start}
mkdir -p "$OUT"
bench() {  # $1: tree name, $2: PYTHONPATH
    PYTHONPATH=$2 python -P -m minicomp bench --out "$OUT/bench_$1" --workloads bias_relu --dtypes float32 \
        --sizes 8192 > "$OUT/bench_$1.log" 2>&1
    tail -25 "$OUT/bench_$1.log"
    cp "$OUT"/bench_$1/*/results.json "$OUT/results_$1.json"
    cp "$OUT"/bench_$1/*/table.md "$OUT/table_$1.md"
    rm -rf "$OUT/bench_$1"
}
for part in "$@"; do
    case $part in
    tests) python -P -m pytest -q -p no:cacheprovider -k cuda tests/test_meta_trace.py tests/test_trust.py \
            tests/test_fast_calls.py tests/test_views.py tests/test_reductions.py tests/test_compile_ahead.py \
            2>&1 | tail -3 | tee "$OUT/gpu_tests.txt" ;;
    compile) bench new . ;;
    prev) bench prev prev_tree:. ;;
    profile) PYC=$(mktemp -d)
        for i in 0 1 2; do
            C=$(mktemp -d)
            [ $i -gt 0 ] && export MINICOMP_PROBE_PROFILE=$OUT/cold_$i.prof
            env -u PYTHONDONTWRITEBYTECODE MINICOMP_CACHE_DIR=$C/mc TRITON_CACHE_DIR=$C/triton PYTHONPYCACHEPREFIX=$PYC \
                python minicomp/bench/compile_probe.py minicomp cuda | tail -1
        done
        unset MINICOMP_PROBE_PROFILE
        python -c "import pstats; pstats.Stats('$OUT/cold_2.prof').sort_stats('cumulative').print_stats(60)" \
            | cut -c1-160 | tee "$OUT/cold_profile.txt" | head -90 ;;
    esac
done
