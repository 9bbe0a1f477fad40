#!/usr/bin/env bash
# The GPU runs behind benchmarks/results/<GPU>/: `minicomp bench` rows by group, and the experiments.
# Usage (repository root, GPU machine):  OUT=... bash benchmarks/scripts/gpu_bench.sh PART...
#   all          the whole bench (every workload, every size, compile times): results/<GPU>/ itself
#   reductions   norms, softmax, cross-entropy, split and outer sums, the decoder block (results/<GPU>/reductions/)
#   split        the split and outer sums with the rows they are compared to
#   norms ce bias block   training rows, forward + backward with peak memory (results/<GPU>/training/)
#   training     norms ce bias block
#   block2       the block's training step (bf16), twice: the spread between runs
#   pointwise    bf16 GELU, bias + ReLU and SwiGLU at 8192
#   rope         rope_fw / rope_fwbw at S = 2048 and 8192
#   forms        the RoPE forms (GQA, NeoX partial, GPT-J pairs), forward and forward + backward
#   mask         scores [4, 16, S, S] + a mask [S, S] (planes side by side)
#   compile      the first call of a fresh process (cold, warm, new sizes, the block), bias + ReLU rows
#   hit          what a cache hit costs: per-call rows of a 64 x 64 bias + ReLU
#   profile      a cold first call of minicomp under cProfile (one untimed run fills the bytecode cache)
#   NAME         an experiment, benchmarks/experiments/NAME.py, its JSON to $OUT/NAME.json; its settings
#                by environment, as its docstring says, e.g.
#                STEP_WORKLOADS=llama_block_fwbw STEP_DTYPES=bfloat16 ... gpu_bench.sh step_host_time
#                BLOCK_STEP=train gpu_bench.sh block_profile;  REDUCTION_SIZES=2048 gpu_bench.sh reduction_forms
# Each bench part leaves <part>.log, <part>_table.md and <part>_results.json under $OUT.
# TREE=DIR runs the package in DIR instead of this one (`python -P`: PYTHONPATH decides; see gpu_ab.sh).
set -uo pipefail
OUT=${OUT:-/tmp/minicomp-gpu}
mkdir -p "$OUT"
export PYTHONPATH=${TREE:-.}:.
HERE=$(cd "$(dirname "$0")" && pwd)
bench() {  # bench PART ARGS...: one `minicomp bench` run, its table and results kept as PART_*
    local part=$1; shift
    local dir; dir=$(mktemp -d)
    MINICOMP_CACHE_DIR=$(mktemp -d) python -P -m minicomp bench --out "$dir" "$@" > "$OUT/$part.log" 2>&1
    cp "$dir"/*/table.md "$OUT/${part}_table.md"; cp "$dir"/*/results.json "$OUT/${part}_results.json"
    cp "$dir"/*/*.png "$OUT/" 2>/dev/null
    echo "== $part"; grep -E "^\| [a-z_0-9]+ \| [a-z0-9]+ \| [0-9]+ \| (minicomp|inductor) " "$OUT/${part}_table.md" \
        | cut -d'|' -f2-5,7,9-11
}
for part in "$@"; do
    case $part in
    all) bench all ;;
    reductions) bench reductions --skip-compile-time --workloads rms_norm add_rms_norm layer_norm softmax \
        cross_entropy cross_entropy_128k column_sum head_sum mse_loss llama_block ;;
    split) bench split --skip-compile-time --workloads column_sum head_sum mse_loss rms_norm cross_entropy \
        cross_entropy_128k ;;
    norms) bench norms --skip-compile-time --workloads rms_norm_fwbw layer_norm_fwbw softmax_fwbw --sizes 32768 ;;
    ce) bench ce --skip-compile-time --workloads cross_entropy_fwbw --sizes 8192 ;;
    bias) bench bias --skip-compile-time --workloads bias_gelu_fwbw --sizes 8192 ;;
    block) bench block --skip-compile-time --workloads llama_block_fwbw --dtypes bfloat16 --sizes 2048 ;;
    training) bash "$HERE/gpu_bench.sh" norms ce bias block ;;
    block2) for i in 1 2; do
            bench "block_run$i" --skip-compile-time --workloads llama_block_fwbw --dtypes bfloat16 --sizes 2048
        done ;;
    pointwise) bench pointwise --skip-compile-time --workloads gelu_tanh gelu_erf bias_relu swiglu \
        --dtypes bfloat16 --sizes 8192 ;;
    rope) bench rope --skip-compile-time --workloads rope_fw rope_fwbw --sizes 2048 8192 ;;
    forms) bench forms --skip-compile-time --workloads rope_gqa rope_neox_partial rope_gptj rope_gqa_fwbw \
        rope_neox_partial_fwbw rope_gptj_fwbw --sizes 512 2048 ;;
    mask) bench mask --skip-compile-time --workloads mask_add ;;
    compile) bench compile --workloads bias_relu --dtypes float32 --sizes 8192; tail -25 "$OUT/compile.log" ;;
    hit) python -P -c "import json, minicomp; from minicomp.bench.run import overhead
print(json.dumps(dict(tree='${TREE:-.}', where=minicomp.__file__, **overhead())))" | tee -a "$OUT/hit_cost.jsonl" ;;
    profile) PYC=$(mktemp -d)
        for i in 0 1 2; do
            C=$(mktemp -d)
            [ "$i" -gt 0 ] && export MINICOMP_PROBE_PROFILE=$OUT/cold_$i.prof
            env -u PYTHONDONTWRITEBYTECODE MINICOMP_CACHE_DIR="$C/mc" TRITON_CACHE_DIR="$C/triton" \
                PYTHONPYCACHEPREFIX="$PYC" python -P "${TREE:-.}/minicomp/bench/compile_probe.py" minicomp cuda | tail -1
        done
        unset MINICOMP_PROBE_PROFILE
        python -c "import pstats; pstats.Stats('$OUT/cold_2.prof').sort_stats('cumulative').print_stats(60)" \
            | cut -c1-160 > "$OUT/cold_profile.txt"; head -90 "$OUT/cold_profile.txt" ;;
    *) if [ -f "benchmarks/experiments/$part.py" ]; then
            python -P -m "benchmarks.experiments.$part" "$OUT/$part.json" 2>&1 | grep -v Warning | cut -c1-220
        else
            echo "gpu_bench.sh: unknown part '$part' (see the usage at the top of $0)" >&2; exit 2
        fi ;;
    esac
done
