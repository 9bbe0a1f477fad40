export PYTHONPATH=$PWD
B=134217728
for m in bert gpt2 llama; do
  for v in minicomp minicomp:chunk_budget_bytes=$B; do
    echo "=== $m $v" >> $OUT/prof_$m.txt
    timeout 150 python benchmarks/scripts/host_profile.py $m train $v 200 >> $OUT/prof_$m.txt 2>&1
  done
  timeout 120 python benchmarks/scripts/chunked_host.py $m minicomp:chunk_budget_bytes=$B >> $OUT/host_regions.txt 2>&1
done
nvidia-smi --query-gpu=name --format=csv >> $OUT/host_regions.txt
