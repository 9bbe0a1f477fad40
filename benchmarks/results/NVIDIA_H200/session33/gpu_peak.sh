export PYTHONPATH=$PWD
export TOP=24
for v in inductor minicomp minicomp:chunk_budget_bytes=268435456 minicomp:chunk_budget_bytes=134217728; do
  timeout 150 python benchmarks/scripts/peak_snapshot.py bert $v >> $OUT/peak_bert.txt 2>&1
done
for v in inductor minicomp minicomp:chunk_budget_bytes=268435456; do
  timeout 150 python benchmarks/scripts/peak_snapshot.py llama $v >> $OUT/peak_llama.txt 2>&1
done
