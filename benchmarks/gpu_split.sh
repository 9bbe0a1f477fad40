# The GPU runs behind benchmarks/results/NVIDIA_H200/split/: on the GPU machine,
#   bash benchmarks/gpu_split.sh configs     the reduction tunables and launch configs swept (experiment)
#   bash benchmarks/gpu_split.sh ab          the configs, and the cross-entropy cases again with the package in _old
#   bash benchmarks/gpu_split.sh bench       bench rows of the split and outer workloads, and the CUDA tests
# results under $OUT.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = configs ] || [ "$1" = ab ]; then
  timeout 560 python -m benchmarks.experiments.reduction_configs $OUT/reduction_configs.json 2>&1 | grep -v "^{" | tail -5
else
  python -m pytest -q -x tests/test_split_reductions.py tests/test_reductions.py -k cuda 2>&1 | tail -3
  timeout 400 python -m minicomp bench --out /tmp/res --skip-compile-time --workloads column_sum head_sum mse_loss \
    rms_norm cross_entropy cross_entropy_128k 2>&1 | grep "^|" | grep -v eager
  cp /tmp/res/*/results.json /tmp/res/*/results.csv /tmp/res/*/table.md $OUT/
fi
if [ "$1" = ab ]; then  # the same cases before a change (a copy of the package in _old) and after it
  REDUCTION_CASES="cross_entropy cross_entropy_128k" PYTHONPATH=_old:. timeout 200 \
    python -m benchmarks.experiments.reduction_configs $OUT/before.json 2>&1 | grep -v "^{" | tail -3
fi
