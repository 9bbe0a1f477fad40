export PYTHONPATH=$PWD
for m in llama bert gpt2 dlrm resnet50; do
timeout 150 python benchmarks/scripts/memory_ab.py $m inductor minicomp 2>&1 | grep -v "Warn\|warn" > $OUT/ab_$m.txt
done
