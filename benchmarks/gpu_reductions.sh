# The GPU run behind benchmarks/results/NVIDIA_H200/reductions/: on the GPU machine,
#   bash benchmarks/gpu_reductions.sh        (results under $OUT)
# The bench rows of the reduction workloads (norms, softmax, cross-entropy, split and outer sums) and the
# decoder block, at every size of their sweep.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python -m minicomp bench --out /tmp/res --skip-compile-time --workloads rms_norm add_rms_norm \
  layer_norm softmax cross_entropy cross_entropy_128k column_sum head_sum mse_loss llama_block 2>&1 \
  | grep "^|" | grep -v eager
cp /tmp/res/*/results.json /tmp/res/*/results.csv /tmp/res/*/table.md /tmp/res/*/softmax_bfloat16.png \
  /tmp/res/*/cross_entropy_bfloat16.png $OUT/
