#!/usr/bin/env bash
# Session 13's GPU runs for issue #18 (GPT-J's pairs walked interleaved; the backward's tangents
# laid out like the outputs).
# Usage (device machine, repository root): bash benchmarks/gpu_pairs.sh PART...
#   tests   CUDA tests of views, pairs, goldens; torch's own tangent-layout default
#   forms   the RoPE forms, forward and forward + backward, this tree
#   host    benchmarks/experiments/step_host_time.py: host vs GPU time of the RoPE training steps
#   hostab  step_host_time in this tree and in prev_tree/ (before the lean training call)
#   tests2  CUDA tests of the training calls and autograd
#   prev    GPT-J and GQA forward + backward in prev_tree/ (`git archive <before> minicomp |
#           tar -x -C prev_tree`), the same command
export PYTHONPATH=.
OUT=${OUT:-/tmp/minicomp-pairs}
mkdir -p "$OUT"
FORMS="rope_gqa rope_neox_partial rope_gptj rope_gqa_fwbw rope_neox_partial_fwbw rope_gptj_fwbw"
for part in "$@"; do
    case $part in
    tests)
        python -c "import torch._functorch.config as c; print('torch', __import__('torch').__version__,
            'guess_tangent_strides_as_outputs =', getattr(c, 'guess_tangent_strides_as_outputs', 'absent'))" \
            | tee "$OUT/gpu_tests.txt"
        python -m pytest -q -p no:cacheprovider -k "cuda or golden" tests/test_interleaved_pairs.py \
            tests/test_views.py tests/test_golden.py tests/test_seed_workloads.py 2>&1 | tail -3 | tee -a "$OUT/gpu_tests.txt" ;;
    forms)
        # shellcheck disable=SC2086
        python -m minicomp bench --out /tmp/forms-new --skip-compile-time --workloads $FORMS --sizes 512 2048 \
            > "$OUT/forms.log" 2>&1
        cp /tmp/forms-new/*/table.md "$OUT/forms_table.md"; cp /tmp/forms-new/*/results.json "$OUT/forms_results.json"
        grep -E "minicomp|inductor" "$OUT/forms_table.md" | grep " 2048 " ;;
    host) python -m benchmarks.experiments.step_host_time "$OUT/step_host_time.json" ;;
    hostab)
        python -m benchmarks.experiments.step_host_time "$OUT/step_host_time_lean.json" | cut -c1-200
        PYTHONPATH=prev_tree:. python -P -m benchmarks.experiments.step_host_time "$OUT/step_host_time_before.json" \
            | cut -c1-200 ;;
    tests2) python -m pytest -q -p no:cacheprovider -k cuda tests/test_training_call.py tests/test_autograd.py \
        tests/test_training_reductions.py tests/test_trust.py 2>&1 | tail -3 | tee "$OUT/gpu_tests_lean.txt" ;;
    prev)
        PYTHONPATH=prev_tree:. python -P -m minicomp bench --out /tmp/forms-prev --skip-compile-time \
            --workloads rope_gptj rope_gptj_fwbw rope_gqa_fwbw --sizes 2048 > "$OUT/prev.log" 2>&1
        cp /tmp/forms-prev/*/table.md "$OUT/prev_table.md"
        grep -E "minicomp|inductor" "$OUT/prev_table.md" ;;
    esac
done
