export PYTHONPATH=$PWD
timeout 120 python .probe/s33/llama_order.py > $OUT/llama_order_new.txt 2>&1
timeout 200 python benchmarks/scripts/memory_ab.py llama inductor minicomp > $OUT/llama_ab_new.txt 2>&1
