export PYTHONPATH=$PWD
for m in resnet50 llama; do
  for b in inductor minicomp inductor minicomp; do
    timeout 200 python benchmarks/scripts/gpu_split.py $m infer $b >> $OUT/split_$m.txt 2>&1
  done
  timeout 200 python benchmarks/scripts/host_profile.py $m infer minicomp 300 > $OUT/prof_$m.txt 2>&1
done
