export PYTHONPATH=$PWD
for m in bert gpt2 llama; do
timeout 130 python benchmarks/scripts/memory_ab.py $m inductor minicomp 2>&1 | grep -v "Warn\|warn" > $OUT/ab_$m.txt
done
