#!/usr/bin/env bash
# Session 14's GPU runs for issue #16 (the block's training step: host time against GPU time; the
# norm backward's pipelined row groups) and a valid A/B of session 13's RoPE changes.
# prev_tree/: `git archive <before> minicomp | tar -x -C prev_tree` (here: bc2c130).
# Usage (device machine, repository root): bash benchmarks/gpu_block_host.sh PART...
#   host   step_host_time on llama_block_fwbw (bf16, S = 2048): minicomp.jit, minicomp-aot,
#          minicomp's Dynamo backend, Inductor, eager
#   gaps   block_profile of the training step (GPU idle between kernels, where)
#   bench  the bench's block rows, twice
#   normsab the bench's norm, column-sum and block training rows, this tree and prev_tree/
#   tests  CUDA tests of the reductions
#   profileab  block_profile of the training step, this tree and prev_tree/
#   pairsab    GPT-J / GQA RoPE rows, this tree and prev2_tree/ (git archive 8164eff minicomp)
#   variants   norm_backward_variants.py, this tree and prev_tree/
#   norms  block_profile of RMSNorm and LayerNorm forward + backward (bf16, [32768, 4096]), logs
# `python -P`: the working directory is not put first on sys.path, so PYTHONPATH=prev_tree:. runs the
# tree before (plain `python -m` from the repository root imports ./minicomp whatever PYTHONPATH says).
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-block}
mkdir -p "$OUT"
for part in "$@"; do
    case $part in
    host) STEP_WORKLOADS=llama_block_fwbw STEP_DTYPES=bfloat16 \
        STEP_IMPLS="eager minicomp minicomp-aot minicomp-dynamo inductor" \
        python -m benchmarks.experiments.step_host_time "$OUT/block_host_time.json" | cut -c1-220 ;;
    gaps) BLOCK_STEP=train python -m benchmarks.experiments.block_profile "$OUT/block_training_profile.json" \
        | head -40 ;;
    bench) for i in 1 2; do
        python -m minicomp bench --out /tmp/bb$i --skip-compile-time --workloads llama_block_fwbw \
            --dtypes bfloat16 --sizes 2048 > "$OUT/bench$i.log" 2>&1
        cp /tmp/bb$i/*/table.md "$OUT/block_run${i}_table.md"; grep -E "minicomp|inductor" "$OUT/block_run${i}_table.md"
        done ;;
    norms) for w in rms_norm_fwbw layer_norm_fwbw; do
        MINICOMP_CACHE_DIR=$(mktemp -d) MINICOMP_LOGS=fusion,cache,output_code PROFILE_WORKLOAD=$w PROFILE_SIZE=32768 \
            python -m benchmarks.experiments.block_profile "$OUT/${w}_profile.json" > "$OUT/${w}_profile.log" 2>&1
        grep -A12 "us per call" "$OUT/${w}_profile.log" | cut -c1-160
        done ;;
    normsab)  # the norms' training rows and the block's, this tree and prev_tree/ (before), side by side
        W="rms_norm_fwbw layer_norm_fwbw column_sum"
        for tree in new prev; do
            PP=.; [ $tree = prev ] && PP=prev_tree:.
            # shellcheck disable=SC2086
            PYTHONPATH=$PP MINICOMP_CACHE_DIR=$(mktemp -d) python -P -m minicomp bench --out /tmp/n-$tree \
                --skip-compile-time --workloads $W --sizes 8192 32768 > "$OUT/norms_$tree.log" 2>&1
            cp /tmp/n-$tree/*/table.md "$OUT/norms_${tree}_table.md"
            PYTHONPATH=$PP MINICOMP_CACHE_DIR=$(mktemp -d) python -P -m minicomp bench --out /tmp/b-$tree \
                --skip-compile-time --workloads head_sum bias_gelu_fwbw llama_block_fwbw --dtypes bfloat16 \
                > "$OUT/block_$tree.log" 2>&1
            cp /tmp/b-$tree/*/table.md "$OUT/block_${tree}_table.md"
        done
        grep -hE "minicomp|inductor" "$OUT"/norms_*_table.md "$OUT"/block_*_table.md | grep -v command ;;
    profileab)  # CUDA time per kernel of the block's training step, this tree and prev_tree/
        for t in new prev; do PP=.; [ $t = prev ] && PP=prev_tree:.
            PYTHONPATH=$PP BLOCK_STEP=train python -P -m benchmarks.experiments.block_profile \
                "$OUT/block_profile_$t.json" > "$OUT/block_profile_$t.log" 2>&1
            echo "== $t"; grep -E "us per call|mc_fused_view_add_mul|mc_fused_sum_to_copy" "$OUT/block_profile_$t.log"
        done ;;
    pairsab)  # session 13's GPT-J pairs and tangent layouts, HEAD against prev2_tree/ (8164eff, before them)
        for t in new prev2; do PP=.; [ $t = prev2 ] && PP=prev2_tree:.
            PYTHONPATH=$PP python -P -m minicomp bench --out /tmp/r-$t --skip-compile-time \
                --workloads rope_gptj rope_gptj_fwbw rope_gqa_fwbw --sizes 2048 > "$OUT/rope_$t.log" 2>&1
            cp /tmp/r-$t/*/table.md "$OUT/rope_${t}_table.md"; echo "== $t"; grep -E "\| (minicomp|inductor) " "$OUT/rope_${t}_table.md"
        done ;;
    variants)  # norm_backward_variants.py, this tree and prev_tree/
        python -P -m benchmarks.experiments.norm_backward_variants "$OUT/norm_backward_variants.json"
        PYTHONPATH=prev_tree:. python -P -m benchmarks.experiments.norm_backward_variants \
            "$OUT/norm_backward_variants_before.json" ;;
    tests) python -m pytest -q -p no:cacheprovider -k cuda tests/test_training_reductions.py \
        tests/test_split_reductions.py tests/test_reductions.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.txt" ;;
    esac
done
